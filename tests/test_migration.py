"""Files and states written by privguard 0.1 open, never silently.

tests/data/ledger-0.1.db and state-0.1.json were written by privguard 0.1.0
(commit 580131f): 71 charges in four runs, a retarget from ε = 3 to 4, and the
"tight" odometer, which reported ε = 3.224338293201262 for that file.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._cli import main

DATA = Path(__file__).parent / "data"
V01_EPSILON = 3.224338293201262


@pytest.fixture()
def old_file(tmp_path):
    path = tmp_path / "budget.db"
    shutil.copy(DATA / "ledger-0.1.db", path)
    return path


def test_opening_a_0_1_file_refuses_and_names_the_upgrade_command(old_file):
    for opener in (lambda: Ledger.open(old_file), lambda: Ledger(4.0, 1e-5, path=old_file)):
        with pytest.raises(LedgerStateError, match="privguard upgrade"):
            opener()
    assert main(["report", str(old_file)]) == 2
    assert not (old_file.parent / "budget.db.v1").exists()  # nothing changed


def test_upgrade_verifies_logs_and_keeps_the_original(old_file, capsys):
    before = old_file.read_bytes()
    assert main(["upgrade", str(old_file)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["charges"] == 71 and (old_file.parent / "budget.db.v1").read_bytes() == before
    ledger = Ledger.open(old_file)
    assert ledger.epsilon() == V01_EPSILON  # reports as before ("tight" files stay "tight")
    assert ledger._acc.config.odometer == "tight" and ledger.target == (4.0, 1e-5)
    migrate = ledger.events[0]
    assert migrate["event"] == "migrate" and migrate["rows"] == 71
    assert migrate["retargets"][0]["reason"] == "approved 4"
    assert [(r.label, r.count) for r in ledger.runs] == [("train", 40), ("eval", 1),
                                                         ("train", 30)]
    ledger.charge(M.SubsampledGaussian(0.9, 0.01), label="train")  # and it keeps working
    assert main(["verify", str(old_file)]) == 0
    assert old_file.stat().st_size < 0.2 * len(before)  # runs, not one curve per charge


def test_upgrade_refuses_an_edited_0_1_file_and_changes_nothing(old_file):
    conn = sqlite3.connect(old_file)
    conn.execute("UPDATE journal SET label = 'edited' WHERE idx = 5")
    conn.commit()
    conn.close()
    before = old_file.read_bytes()
    assert main(["upgrade", str(old_file)]) == 2
    assert old_file.read_bytes() == before
    assert not (old_file.parent / "budget.db.v1").exists()


def test_a_0_1_state_loads_with_a_logged_migration():
    state = json.loads((DATA / "state-0.1.json").read_text())
    ledger = Ledger.load_state_dict(state)
    assert len(ledger.history) == 10 and ledger.events[0]["event"] == "migrate"
    assert ledger._acc.config.odometer == "tight"
    state["records"].pop()
    with pytest.raises(LedgerStateError):
        Ledger.load_state_dict(state)


def test_new_ledgers_cannot_choose_the_retired_odometer():
    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="retired"):
        Ledger(delta=1e-5, odometer="tight")
    assert Ledger(delta=1e-5)._acc.config.odometer == "mixture"
