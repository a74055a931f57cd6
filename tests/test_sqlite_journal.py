"""The SQLite store's journal mode (issue 26 item 3) and its failed opens (item 2 bug)."""

from __future__ import annotations

import gc
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._stores import _journalmode
from privguard._stores._journalmode import JOURNAL_ENV, filesystem_type

STEP = M.SubsampledGaussian(1.0, 0.01)


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("case", ["not a ledger", "edited", "another config", "read-only empty"])
def test_a_failed_open_leaks_no_file_descriptor(tmp_path, case):
    # Before: the sqlite3 connection and the flock fd stayed open when open() raised.
    path = str(tmp_path / "b.db")
    if case == "not a ledger":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE t (x)")
        conn.close()
    else:
        with Ledger(3.0, 1e-5, path=path) as ledger:
            ledger.charge(STEP)
        if case == "edited":
            conn = sqlite3.connect(path)
            conn.execute("UPDATE meta SET value = 'x' WHERE key = 'genesis'")
            conn.commit()
            conn.close()
    if case == "read-only empty":
        open(path + "2", "wb").close()
    before = _fds()
    for _ in range(3):
        with pytest.raises(LedgerStateError):
            if case == "another config":
                Ledger(2.0, 1e-5, path=path)
            elif case == "read-only empty":
                Ledger.open(path + "2", read_only=True)
            else:
                Ledger.open(path)
    assert _fds() == before


def _mode(path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


def test_a_local_file_uses_wal_and_the_environment_can_keep_rollback(tmp_path, monkeypatch):
    with Ledger(3.0, 1e-5, path=tmp_path / "a.db") as ledger:
        ledger.charge(STEP)
    assert _mode(tmp_path / "a.db") == "wal"
    monkeypatch.setenv(JOURNAL_ENV, "rollback")
    with Ledger(3.0, 1e-5, path=tmp_path / "b.db") as ledger:
        ledger.charge(STEP)
    assert _mode(tmp_path / "b.db") != "wal"  # rollback (TRUNCATE is per connection)
    with Ledger.open(tmp_path / "a.db") as ledger:  # an existing WAL file is switched back
        ledger.charge(STEP)
        assert len(ledger.history) == 2
    assert _mode(tmp_path / "a.db") != "wal"


def test_a_bad_journal_setting_is_refused_before_any_io(tmp_path, monkeypatch):
    monkeypatch.setenv(JOURNAL_ENV, "memory")
    before = _fds()
    with pytest.raises(InvalidArgumentError, match=JOURNAL_ENV):
        Ledger(3.0, 1e-5, path=tmp_path / "a.db")
    assert _fds() == before
    assert not os.path.exists(tmp_path / "a.db")


def test_a_network_filesystem_keeps_the_rollback_journal(tmp_path, monkeypatch):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /mnt/shared\\040dir rw shared:9 - nfs4 srv:/export rw\n"
        "41 40 0:51 / /mnt/shared\\040dir/local rw shared:10 - tmpfs tmpfs rw\n")
    assert filesystem_type("/mnt/shared dir/budget.db", str(mountinfo)) == "nfs4"
    assert filesystem_type("/mnt/shared dir/x/budget.db", str(mountinfo)) == "nfs4"
    assert filesystem_type("/mnt/shared dir/local/budget.db", str(mountinfo)) == "tmpfs"
    assert filesystem_type("/mnt/shared dirx/budget.db", str(mountinfo)) == "ext4"
    monkeypatch.setattr(_journalmode, "filesystem_type", lambda path: "nfs4")
    with Ledger(3.0, 1e-5, path=tmp_path / "a.db") as ledger:
        ledger.charge(STEP)
    assert _mode(tmp_path / "a.db") != "wal"
    monkeypatch.setenv(JOURNAL_ENV, "wal")  # the explicit setting wins over the detection
    assert _journalmode.journal_mode(str(tmp_path / "a.db")) == "WAL"


def test_known_limit_a_copy_without_its_wal_drops_charges_while_open(tmp_path):
    # docs/reference.md "The ledger file" (README "On disk" summarises it): WAL's known limit, pinned so that the README stays true. A copy of
    # budget.db alone, taken while a ledger is open, is a self-consistent older ledger.
    path = tmp_path / "budget.db"
    with Ledger(3.0, 1e-5, path=path, lease=1) as ledger:
        ledger.charge(STEP)
        ledger.charge(STEP)
    ledger = Ledger.open(path, lease=1)  # a charge per commit: counts are exact
    for _ in range(3):
        ledger.charge(STEP)
    shutil.copy(path, tmp_path / "copy.db")
    with Ledger.open(tmp_path / "copy.db") as copy:
        assert len(copy.history) == 2  # the three charges in budget.db-wal are gone
        copy._store.verify()
    ledger.close()  # the checkpoint on close: now the main file alone holds every charge
    shutil.copy(path, tmp_path / "copy2.db")
    with Ledger.open(tmp_path / "copy2.db") as copy:
        assert len(copy.history) == 5


def _closed_wal_ledger(tmp_path):
    path = tmp_path / "d" / "budget.db"
    path.parent.mkdir()
    with Ledger(3.0, 1e-5, path=path) as ledger:
        ledger.charge(STEP)
        ledger.charge(STEP)
    assert not os.path.exists(str(path) + "-wal")  # the last close removed it
    return path


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only directory anyway")
def test_a_closed_wal_ledger_in_a_read_only_directory_stays_readable(tmp_path):
    path = _closed_wal_ledger(tmp_path)
    os.chmod(path.parent, 0o555)
    try:
        with Ledger.open(path, read_only=True) as reader:
            assert len(reader.history) == 2
    finally:
        os.chmod(path.parent, 0o755)


def test_a_read_only_open_falls_back_to_immutable_only_without_a_wal(tmp_path, monkeypatch):
    # The branch above, for root too: SQLite refuses a WAL file's reader that cannot
    # create the -shm index ("attempt to write a readonly database"); simulated here.
    import privguard._stores._sqlite as store

    path = _closed_wal_ledger(tmp_path)
    real = sqlite3.connect
    opened = []

    class Refusing:
        def __init__(self, conn):
            self.conn = conn

        def execute(self, *args):
            raise sqlite3.OperationalError("attempt to write a readonly database")

        def close(self):
            self.conn.close()

    def connect(target, *args, **kwargs):
        opened.append(str(target))
        conn = real(target, *args, **kwargs)
        return conn if "immutable=1" in str(target) else Refusing(conn)

    monkeypatch.setattr(store.sqlite3, "connect", connect)
    with Ledger.open(path, read_only=True) as reader:
        assert len(reader.history) == 2
    assert "immutable=1" in opened[-1]
    open(str(path) + "-wal", "wb").close()  # a writer may have charges there: no fallback
    before = _fds()
    with pytest.raises(LedgerStateError, match="readonly"):
        Ledger.open(path, read_only=True)
    assert _fds() == before


def test_closing_one_ledger_keeps_another_in_this_process_visible_to_others(tmp_path):
    # Closing the first ledger's flock fd dropped every POSIX lock of this process on the
    # file, SQLite's WAL shared lock of the second ledger's connection included; another
    # process closing the file then took itself for the last user and deleted the -wal,
    # and the second ledger's next charges went into an unlinked file no one else reads.
    path = str(tmp_path / "budget.db")
    a = Ledger(3.0, 1e-5, path=path, lease=1)  # a charge per commit: counts are exact
    a.charge(STEP)
    b = Ledger.open(path, lease=1)
    b.charge(STEP)
    a.close()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", f"from privguard import Ledger; "
                    f"Ledger.open({path!r}).close()"], check=True, env=env, timeout=120)
    b.charge(STEP)
    b.charge(STEP)
    seen = subprocess.run([sys.executable, "-c", f"from privguard import Ledger; "
                           f"print(len(Ledger.open({path!r}).history))"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert seen.stdout.strip() == "4", seen
    b.close()


def test_reopening_beside_an_open_ledger_holds_one_spare_descriptor(tmp_path):
    path = str(tmp_path / "budget.db")
    keep = Ledger(3.0, 1e-5, path=path)
    Ledger.open(path).close()
    # earlier tests' garbage (a ledger's connection awaiting collection) would otherwise be
    # collected inside the loop and its descriptors closed there: this test failed after
    # tests/test_readme.py and others in one process (on main ee12d07 too)
    gc.collect()
    before = _fds()
    for _ in range(5):
        with Ledger.open(path) as other:
            other.charge(STEP)
    assert _fds() == before
    keep.close()
    assert len(_fds()) < len(before)  # the spare went with the last store
