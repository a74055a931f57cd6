"""`privguard report`/`verify`/`plot` leave a WAL ledger's folder as they found it, and never
read a stale state (privguard/_stores/_snapshot.py).

A read-only SQLite connection to a closed WAL file created an empty ``-wal`` and a ``-shm``
beside it and could not remove them; the CLI now reads such a file as immutable under a
shared flock that keeps every writer out while it reads, and reads a file a writer has open
as before (its charges in the ``-wal`` included).
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._cli._cli import main
from privguard._stores._snapshot import snapshot

STEP = M.SubsampledGaussian(1.0, 0.01)


def _ledger(tmp_path, charges: int = 2) -> str:
    path = str(tmp_path / "budget.db")
    ledger = Ledger(3.0, 1e-5, path=path)
    for _ in range(charges):
        ledger.charge(STEP, label="step")
    ledger.close()
    return path


def _charges_reported(path: str) -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", path, "--json"]) == 0
    return sum(row["charges"] for row in json.loads(out.getvalue())["timeline"])


@pytest.mark.parametrize("command", [["report"], ["report", "--json"], ["verify"]])
def test_a_read_of_a_closed_wal_ledger_leaves_its_folder_as_it_found_it(tmp_path, command):
    path = _ledger(tmp_path)
    with open(path, "rb") as f:
        assert f.read(20)[18:20] == b"\x02\x02"  # a WAL-mode file
    before = sorted(os.listdir(tmp_path))
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([command[0], path, *command[1:]]) == 0
    assert sorted(os.listdir(tmp_path)) == before == ["budget.db"]


def test_a_ledger_a_writer_has_open_is_reported_with_the_charges_in_its_wal(tmp_path):
    path = _ledger(tmp_path)
    writer = Ledger.open(path)
    writer.charge(STEP, label="step")  # committed, possibly only in the -wal
    assert os.path.exists(path + "-wal")
    assert _charges_reported(path) == 3  # not the main file's 2: never a stale state
    writer.close()
    assert sorted(os.listdir(tmp_path)) == ["budget.db"]  # the writer's last close removed them
    assert _charges_reported(path) == 3


def test_a_ledger_read_inside_a_snapshot_refuses_to_read_once_it_ended(tmp_path):
    path = _ledger(tmp_path)
    with snapshot(path):
        reader = Ledger.open(path, read_only=True)
        assert len(reader.history) == 2
    writer = Ledger.open(path)
    writer.charge(STEP, label="step")
    writer.close()
    with pytest.raises(LedgerStateError, match="snapshot that has ended"):
        _ = reader.history  # immutable and the file changed: it would be stale
    reader.close()
    assert sorted(os.listdir(tmp_path)) == ["budget.db"]


def test_a_snapshot_of_what_is_not_a_ledger_file_is_left_to_the_opener(tmp_path):
    with snapshot(str(tmp_path / "missing.db")), snapshot(str(tmp_path)):
        pass
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["report", str(tmp_path / "missing.db")]) == 2
    assert os.listdir(tmp_path) == []
