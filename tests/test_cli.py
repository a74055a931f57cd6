"""The privguard command on a fixture ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from privguard import Ledger
from privguard import mechanisms as M
from privguard._cli._cli import main
from privguard._cli._report import trajectory


@pytest.fixture()
def fixture_ledger(tmp_path):
    path = tmp_path / "budget.db"
    ledger = Ledger(4.0, 1e-5, path=path, lease=1)  # exact counts (leases: test_leases.py)
    for _ in range(300):
        ledger.charge(M.SubsampledGaussian(1.1, 0.01), label="train")
    for _ in range(3):
        ledger.charge(M.Gaussian(20.0), label="noisy eval")
    for _ in range(200):
        ledger.charge(M.SubsampledGaussian(0.9, 0.01), label="train")
    ledger.close()
    return path


def test_report_text(fixture_ledger, capsys):
    assert main(["report", str(fixture_ledger)]) == 0
    out = capsys.readouterr().out
    assert "(ε = 4, δ = 1e-05) filter" in out
    assert "NOT a guarantee" in out
    assert "train" in out and "noisy eval" in out
    assert "503" in out  # charges


def test_report_json_matches_the_ledger(fixture_ledger, capsys):
    assert main(["report", str(fixture_ledger), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ledger = Ledger.open(fixture_ledger)
    assert data["charges"] == 503 and data["running_epsilon"] == ledger.epsilon()
    assert {g["label"]: g["charges"] for g in data["by_label"]} == {"train": 500, "noisy eval": 3}
    assert [t["charges"] for t in data["timeline"]] == [300, 3, 200]
    assert data["remaining_repeats_of_last_mechanism"] == ledger.remaining(
        M.SubsampledGaussian(0.9, 0.01)).repeats


def test_plot_writes_a_png(fixture_ledger, tmp_path, capsys):
    out = tmp_path / "eps.png"
    assert main(["plot", str(fixture_ledger), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tr = trajectory(Ledger.open(fixture_ledger))
    assert tr["charges"][-1] == 503
    assert all(r >= n for r, n in zip(tr["running_epsilon"], tr["naive_epsilon"]))


def test_errors_exit_non_zero(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing.db")]) == 2
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    assert main(["report", str(bad)]) == 2
    assert "privguard:" in capsys.readouterr().err


def test_console_script_is_installed(fixture_ledger):
    done = _privguard("report", str(fixture_ledger), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["charges"] == 503


def test_demo_runs_end_to_end(tmp_path, capsys):
    db = tmp_path / "demo.db"
    assert main(["demo", "--quick", "--db", str(db)]) == 0
    out, err = capsys.readouterr()
    # standard error is not a terminal here: one line per epoch, no "\r" frames (task rd)
    assert "\r" not in err and "final training: 1/6 epochs, budget " in err
    assert "reduced size" in out and "What to report" in out
    ledger = Ledger.open(db)
    labels = {r.label for r in ledger.history}
    assert {"random-K tuning", "final training", "early-stopping check"} <= labels
    assert ledger.history[0].label == "random-K tuning"  # charged before anything else
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    assert f"{ledger.epsilon():.3f}" in out


def test_report_compares_with_opacus_prv_on_request(fixture_ledger, capsys):
    from opacus.accountants import PRVAccountant

    assert main(["report", str(fixture_ledger), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["opacus_prv_epsilon_not_a_guarantee"] is None  # fast path: no torch
    assert main(["report", str(fixture_ledger), "--json", "--compare-prv"]) == 0
    data = json.loads(capsys.readouterr().out)
    prv = PRVAccountant()
    prv.history = [(1.1, 0.01, 300), (20.0, 1.0, 3), (0.9, 0.01, 200)]
    assert data["opacus_prv_epsilon_not_a_guarantee"] == pytest.approx(prv.get_epsilon(1e-5))
    # the three numbers side by side: PRV < RDP conversion < the valid running ε
    assert (data["opacus_prv_epsilon_not_a_guarantee"] < data["naive_epsilon_not_a_guarantee"]
            < data["running_epsilon"])
    assert main(["report", str(fixture_ledger), "--compare-prv"]) == 0
    assert "Opacus PRV" in capsys.readouterr().out


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    # `privguard report FILE | head`: the pipe closes; the CLI exits like any other CLI
    db = tmp_path / "l.db"
    ledger = Ledger(3.0, 1e-5, path=str(db), lease=1)
    for i in range(2000):  # a report longer than a pipe's buffer
        ledger.charge(M.SubsampledGaussian(1.0, 0.01), label=f"job {i}")
    ledger.close()
    proc = subprocess.Popen([sys.executable, "-m", "privguard", "report", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Error" not in err and "Traceback" not in err, err


def _privguard(*args, env=None):
    """The installed console script, as a user runs it."""
    exe = os.path.join(os.path.dirname(sys.executable), "privguard")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_verify_command_reports_its_speed_and_exits_non_zero_on_any_edit(fixture_ledger):
    import re
    import sqlite3

    done = _privguard("verify", str(fixture_ledger))
    assert done.returncode == 0, done.stderr
    # "…: OK — 4 journal rows (503 charges in 3 runs, …) replayed and verified in … (N rows/s)"
    m = re.search(r"OK — (\d+) journal rows \((\d+) charges in (\d+) runs.* \(([\d,]+) rows/s\)",
                  done.stdout)
    assert m is not None, done.stdout
    assert (int(m[2]), int(m[3])) == (503, 3) and int(m[4].replace(",", "")) > 0
    conn = sqlite3.connect(fixture_ledger)
    conn.execute("UPDATE entries SET count = count + 1 WHERE kind = 'run' AND count = 300")
    conn.commit()
    conn.close()
    done = _privguard("verify", str(fixture_ledger))
    assert done.returncode == 2 and done.stdout == ""
    assert "journal row 1 fails its digest chain" in done.stderr


def test_verify_command_needs_the_key_of_a_keyed_file(tmp_path):
    path = tmp_path / "keyed.db"
    env = {**os.environ, "PRIVGUARD_LEDGER_KEY": "s3cret"}
    env.pop("PRIVGUARD_LEDGER_KEY_FILE", None)
    subprocess.run([sys.executable, "-c", "import sys; from privguard import Ledger, "
                    "mechanisms as M; Ledger(1.0, 1e-5, path=sys.argv[1]).charge(M.Gaussian(9.0))",
                    str(path)], check=True, env=env, timeout=120)
    done = _privguard("verify", str(path), env=env)
    assert done.returncode == 0 and "; keyed" in done.stdout, done.stderr
    for wrong in ({"PRIVGUARD_LEDGER_KEY": "guess"}, {}):
        other = {k: v for k, v in env.items() if k != "PRIVGUARD_LEDGER_KEY"} | wrong
        done = _privguard("verify", str(path), env=other)
        assert done.returncode == 2 and "ledger key" in done.stderr, done.stderr


def test_version_is_the_installed_package_version():
    from importlib.metadata import version

    import privguard

    done = _privguard("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"privguard {privguard.__version__}" == \
        f"privguard {version('privguard')}"


def test_the_demo_shows_the_epoch_whose_noisy_count_is_refused(tmp_path, capsys, monkeypatch):
    # a newcomer's log ended at "final training: 7/40 epochs" above "stopped after 8 epochs:
    # the filter refused the next noisy validation count": epoch 8 trained, with no line
    from privguard._cli import _demo

    real, counts = _demo._noisy_count, []

    def noisy(model, val, ledger_like, rng, label):
        if label == "early-stopping check":
            counts.append(label)
            if len(counts) == 2:  # far beyond any budget: the filter refuses this count
                ledger_like.charge(M.Gaussian(1e-3), label=label)
        return real(model, val, ledger_like, rng, label)

    monkeypatch.setattr(_demo, "_noisy_count", noisy)
    assert main(["demo", "--quick", "--db", str(tmp_path / "d.db")]) == 0
    out, err = capsys.readouterr()
    assert "stopped after 2 epochs: the filter refused the next noisy validation count" in out
    assert "final training: 2/6 epochs" in err
