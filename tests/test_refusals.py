"""Issue 24 (items 5 and 6): paths that are not ledger files, and messages that say what is wrong.

* ``privguard report|verify|plot|upgrade`` on a FIFO, a directory or a device
  refuses at once (a FIFO used to block forever), exit status 2;
* ``Ledger(path=...)`` names the missing or read-only directory, and refuses
  a literal ``~``;
* ``upgrade`` says a current file is current, and a read-only one read-only;
* the tuners and the hybrid filter name what the user passed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._cli._cli import main
from privguard._stores import _paths
from privguard.tuning import Poisson, RandomSearch, SubsetSearch


@pytest.fixture()
def ledger_file(tmp_path):
    path = tmp_path / "r.db"
    ledger = Ledger(4.0, 1e-5, path=path)
    ledger.charge(M.SubsampledGaussian(1.1, 0.01))
    ledger.close()
    return path


def _cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "privguard", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("command", [["report"], ["verify"], ["plot", "-o", "x.png"],
                                     ["upgrade", "--epsilon", "3", "--delta", "1e-5"]])
def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path, command):
    """Issue 24 item 5: `privguard report FIFO` blocked forever in open()."""
    fifo = tmp_path / "budget.db"
    os.mkfifo(fifo)
    args = [command[0], str(fifo), *command[1:]]
    proc = _cli(*args, timeout=60)  # the old code never returned (TimeoutExpired here)
    assert proc.returncode == 2, proc.stderr
    assert "is a FIFO, not a ledger file" in proc.stderr and str(fifo) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_refusal_itself_does_not_open_the_fifo(tmp_path):
    fifo = tmp_path / "budget.db"
    os.mkfifo(fifo)
    # in-process, so a blocking open() would hang the test: guard it with an alarm
    import signal

    def hung(*_):
        raise AssertionError("opening the FIFO blocked")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        with pytest.raises(LedgerStateError, match="is a FIFO"):
            Ledger.open(fifo, read_only=True)
        with pytest.raises(LedgerStateError, match="is a FIFO"):
            Ledger(3.0, 1e-5, path=fifo)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind", ["directory", "device"])
def test_a_directory_or_a_device_is_refused_by_name(tmp_path, kind, capsys):
    path = str(tmp_path) if kind == "directory" else os.devnull
    for command in (["report", path], ["verify", path]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"{path}: is a {kind}, not a ledger file" in err


# --- Ledger(path=...) ---------------------------------------------------------------------
def test_a_missing_directory_is_named(tmp_path):
    path = tmp_path / "no" / "such" / "x.db"
    with pytest.raises(LedgerStateError, match=r"directory .*no/such does not exist"):
        Ledger(3.0, 1e-5, path=path)
    assert not (tmp_path / "no").exists()


def test_a_literal_tilde_is_refused_with_a_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"not expanded.*expanduser") as info:
        Ledger(3.0, 1e-5, path="~/budget.db")
    assert info.value.argument == "path"
    os.mkdir(tmp_path / "~")  # a directory really named '~' is a path like any other
    Ledger(3.0, 1e-5, path="~/budget.db").close()
    assert (tmp_path / "~" / "budget.db").exists()


def _read_only(monkeypatch, target: str):
    """What a read-only directory or file looks like to a non-root user (tests run as root,
    who may write anywhere): os.access says no, and SQLite cannot open the file."""
    real = os.access
    monkeypatch.setattr(_paths.os, "access", lambda p, mode: (
        False if os.path.abspath(p) == target and mode & os.W_OK else real(p, mode)))


def test_a_read_only_directory_is_named(tmp_path, monkeypatch):
    directory = tmp_path / "ro"
    directory.mkdir()
    os.chmod(directory, 0o555)
    try:
        _read_only(monkeypatch, str(directory))
        if os.geteuid() == 0:  # root creates the file anyway: make SQLite fail as it would
            import sqlite3

            def refuse(*a, **k):
                raise sqlite3.OperationalError("unable to open database file")

            monkeypatch.setattr("privguard._stores._sqlite.sqlite3.connect", refuse)
        with pytest.raises(LedgerStateError, match=re.escape(
                f"directory {directory} is not writable, so the ledger file cannot be created")):
            Ledger(3.0, 1e-5, path=directory / "x.db")
    finally:
        os.chmod(directory, 0o755)


# --- upgrade -------------------------------------------------------------------------------
def test_upgrade_says_a_current_file_is_already_current(ledger_file, capsys):
    before = ledger_file.read_bytes()
    assert main(["upgrade", str(ledger_file), "--epsilon", "4", "--delta", "1e-5"]) == 2
    err = capsys.readouterr().err
    assert "already a current privguard ledger" in err and "no such table" not in err
    assert ledger_file.read_bytes() == before and not os.path.exists(f"{ledger_file}.v1")


def test_upgrade_says_a_read_only_file_is_read_only(ledger_file, monkeypatch, capsys):
    _read_only(monkeypatch, str(ledger_file))
    assert main(["upgrade", str(ledger_file), "--epsilon", "4", "--delta", "1e-5"]) == 2
    assert "cannot upgrade: the file is read-only; nothing was changed" in capsys.readouterr().err


def test_upgrade_says_the_file_system_is_read_only(ledger_file, monkeypatch, capsys):
    real = os.statvfs

    class ReadOnly:
        def __init__(self, st):
            self.f_flag = st.f_flag | os.ST_RDONLY

    monkeypatch.setattr(_paths.os, "statvfs", lambda p: ReadOnly(real(p)))
    assert main(["upgrade", str(ledger_file), "--epsilon", "4", "--delta", "1e-5"]) == 2
    assert f"directory {ledger_file.parent} is on a read-only file system" in \
        capsys.readouterr().err


# --- plot and demo -------------------------------------------------------------------------
def test_plot_to_a_missing_directory_names_the_path_and_warns_nothing(ledger_file, capsys):
    out = "/no/such/dir/x.png"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["plot", str(ledger_file), "-o", out]) == 2
    err = capsys.readouterr().err
    assert out in err and "directory /no/such/dir does not exist" in err
    assert "FileNotFoundError" not in err
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_plot_into_a_directory_is_refused(ledger_file, tmp_path, capsys):
    assert main(["plot", str(ledger_file), "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("extra,reason", [([], None), (["--quick"], "--quick")])
def test_demo_validates_its_arguments_before_printing(tmp_path, monkeypatch, capsys, extra,
                                                      reason):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--epsilon", "nan", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "epsilon=nan is invalid" in captured.err
    assert not (tmp_path / "privguard-demo").exists()  # nothing created either


def test_demo_names_why_it_runs_reduced(tmp_path, monkeypatch):
    """The reduced-size reason printed is the one that applies (it said CI=true for --quick
    with CI unset)."""
    import privguard._cli._demo as demo

    printed = []

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(demo, "_require_extras", lambda: None)
    monkeypatch.setattr(demo, "_data", lambda: (list(range(100)), None, None))
    monkeypatch.setattr(demo, "Ledger", stop)  # right after the banner
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    db = str(tmp_path / "d.db")
    for env, quick, banner in ((None, True, "(reduced size: --quick)"),
                               ("true", None, "(reduced size: CI=true)"),
                               (None, None, "privguard demo: digits")):
        if env is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", env)
        printed.clear()
        with pytest.raises(Stop):
            demo.run(db=db, quick=quick)
        assert len(printed) == 1 and banner in printed[0]


# --- tuners and the hybrid filter ----------------------------------------------------------
@pytest.mark.parametrize("q", [float("nan"), 1.0, 0.0, 1.5])
def test_subset_search_q_message_matches_what_is_accepted(q):
    tuner = RandomSearch({"lr": [0.1]}, Poisson(2.0), cost=M.Gaussian(10.0), progress=False)
    with pytest.raises(InvalidArgumentError, match=r"must lie in \(0, 1\) ") as info:
        SubsetSearch(tuner, q=q, final_cost=M.Gaussian(10.0))
    assert info.value.argument == "q"


def test_random_search_names_an_empty_hyperparameter():
    with pytest.raises(InvalidArgumentError, match="'lr' needs at least one value") as info:
        RandomSearch({"lr": [], "clip": [1.0]}, Poisson(2.0), cost=M.Gaussian(10.0))
    assert "lr" in info.value.argument


def test_a_hybrid_step_that_cannot_be_planned_names_what_the_user_passed():
    ledger = Ledger(3.0, 1e-5, filter="hybrid")
    with pytest.raises(InvalidArgumentError) as info:
        ledger.charge(M.SubsampledGaussian(1e300, 0.01))
    assert info.value.argument == "noise_multiplier" and "envelope" not in str(info.value)
    assert "filter='hybrid'" in str(info.value) and "filter='rdp'" in str(info.value)
    assert len(ledger.history) == 0
