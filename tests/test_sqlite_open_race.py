"""Review rq: the file SQLite opens is the one the per-step check watches.

The store's lock descriptor (``_lock_fd``, which the per-step check fstat's) is opened
after ``sqlite3.connect``; a path replaced around the connect made the check watch
another file than the one SQLite writes. Each test replaces the file at the path
inside ``sqlite3.connect`` (before or after SQLite opens it): the open is refused.
"""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M

STEP = M.Gaussian(5.0)


def _ledger_file(path):
    ledger = Ledger(3.0, 1e-5, path=path)
    ledger.charge(STEP)
    ledger.close()
    return path


@pytest.mark.parametrize("when", ["after-sqlite-opens", "before-sqlite-opens"])
def test_a_file_replaced_while_the_store_connects_is_refused(tmp_path, monkeypatch, when):
    path = str(_ledger_file(tmp_path / "budget.db"))
    other = str(tmp_path / "other.db")
    shutil.copyfile(path, other)  # the same charges, another file
    real = sqlite3.connect
    swapped = []

    def connect(*args, **kwargs):
        if not swapped:
            swapped.append(True)
            if when == "after-sqlite-opens":
                conn = real(*args, **kwargs)
                os.replace(other, path)
                return conn
            os.replace(other, path)
        return real(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    with pytest.raises(LedgerStateError, match="replaced by another file while it was being "
                                               "opened"):
        Ledger(3.0, 1e-5, path=path)
    assert swapped


def test_an_unchanged_or_new_file_opens(tmp_path):
    path = tmp_path / "new.db"
    assert not path.exists()
    _ledger_file(path)  # created by SQLite
    ledger = Ledger(3.0, 1e-5, path=path)
    assert len(ledger.runs) == 1
    ledger.close()
    reader = Ledger.open(path, read_only=True)
    assert len(reader.runs) == 1
    reader.close()


@pytest.mark.parametrize("read_only", [True, False])
def test_opening_a_missing_file_creates_none(tmp_path, read_only):
    path = tmp_path / "missing.db"
    with pytest.raises(LedgerStateError):
        Ledger.open(path, read_only=read_only)
    assert not path.exists()
