"""Review rlo5 of branch lo5: each test fails on lo5's head (d720485)."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
from test_adv_fs_forged_state import _engine_attached

from privguard import BudgetExhausted, InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M


# -- EngineView.load_state_dict: all or nothing, whatever refuses the load -----------------
@pytest.mark.parametrize("case", ["steps beyond the budget", "record not extending the entry's"])
def test_a_refused_engine_load_leaves_opacus_record_and_later_checkpoints_as_they_were(case):
    """lo5 put Opacus' record back only when restore() refused. A load refused after it
    (the steps Opacus recorded do not fit the budget; Opacus' record does not extend the
    one saved with the ledger) left the record moved, and the next checkpoint saved it as
    the steps the ledger holds: a resume from it charged none of them (an under-count)."""
    engine, ledger = _engine_attached()
    state = copy.deepcopy(engine.accountant.state_dict())
    if case == "steps beyond the budget":  # a checkpoint without the ledger's entry
        state.pop("privguard")
        state["history"] = [(0.3, 1.0, 1000)]
        refusal: type[Exception] = BudgetExhausted
    else:  # the ledger's own entry, Opacus' record from another run
        state["history"] = [(0.7, 0.25, 2)]
        refusal = LedgerStateError
    record, charges = copy.deepcopy(engine.accountant.history), len(ledger.history)
    with pytest.raises(refusal):
        engine.accountant.load_state_dict(state)
    assert engine.accountant.history == record  # lo5: the checkpoint's record
    assert len(ledger.history) == charges
    later = engine.accountant.state_dict()["privguard"]
    assert [tuple(r) for r in later["accountant_history"]] == [tuple(r) for r in record]


def test_the_engine_loads_charging_warning_still_points_at_the_caller():
    """The load moved into a helper (one frame deeper): the warning that steps Opacus
    recorded are charged to a ledger that holds charges still names the line that called
    engine.load_checkpoint (before the fix's stacklevel change it named Opacus' file)."""
    import io

    import torch

    engine, _ = _engine_attached()
    state = copy.deepcopy(engine.accountant.state_dict())
    state.pop("privguard")
    state["history"] = [(1.0, 0.25, 6)]
    buffer = io.BytesIO()
    torch.save({"module_state_dict": {}, "privacy_accountant_state_dict": state}, buffer)
    buffer.seek(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.load_checkpoint(path=buffer, module=torch.nn.Module())
    ours = [w for w in caught if "Opacus' accountant recorded" in str(w.message)]
    assert ours and ours[0].filename == __file__, [(w.filename, str(w.message)) for w in caught]


# -- A path through a symlink and "..": every open reads the file the OS resolves ---------
def _symlink_then_up(tmp_path, monkeypatch):
    """cwd X holding s -> other/deep/d: the OS resolves s/../rel.db to other/deep/rel.db,
    a lexical normalisation (os.path.abspath) to X/rel.db. Both files are ledgers: 3 charges
    in the one the OS resolves, 1 in the other."""
    x, deep = tmp_path / "X", tmp_path / "other" / "deep" / "d"
    x.mkdir()
    deep.mkdir(parents=True)
    try:
        (x / "s").symlink_to(deep, target_is_directory=True)
    except (OSError, NotImplementedError):
        pytest.skip("no symbolic links here")
    monkeypatch.chdir(x)
    ledger = Ledger(epsilon=8.0, delta=1e-5, path="s/../rel.db")
    for _ in range(3):
        ledger.charge(M.Gaussian(5.0))
    other = Ledger(epsilon=8.0, delta=1e-5, path=x / "rel.db")
    other.charge(M.Gaussian(5.0))
    other.close()
    assert len(Ledger.open(tmp_path / "other" / "deep" / "rel.db", read_only=True).history) == 3
    return ledger


def test_a_read_only_open_through_a_symlink_and_dotdot_reads_the_file_the_os_resolves(
        tmp_path, monkeypatch):
    """lo5 made path= absolute without normalising (as the OS resolves it), but the
    read-only connection's URI still went through os.path.abspath, which drops "s/.."
    lexically: SQLite read X/rel.db (1 charge) while the identity checks watched the file
    the OS resolves (3): a report or verify of another ledger, silently."""
    _symlink_then_up(tmp_path, monkeypatch).close()
    reader = Ledger.open("s/../rel.db", read_only=True)
    assert len(reader.history) == 3  # 1 before: the other ledger's
    reader.close()


def test_a_ledger_pickled_through_a_symlink_and_dotdot_loads(tmp_path, monkeypatch):
    """The pickled reference went through os.path.abspath too: it named X/rel.db, whose
    file_id is not the pickled ledger's, and the pickle was refused."""
    ledger = _symlink_then_up(tmp_path, monkeypatch)
    blob = pickle.dumps(ledger)
    ledger.close()
    again = pickle.loads(blob)
    assert len(again.history) == 3
    again.close()


# -- History: a record holding an array is compared without its truth value --------------
@pytest.mark.parametrize("field", ["label", "time"])
def test_history_in_count_index_and_eq_with_a_record_holding_an_array(field):
    """lo5's in/count/index/== compared a ChargeRecord field by field through the
    dataclass' ==, so an array in one (a record built by hand) raised ValueError."""
    import dataclasses

    import numpy as np

    ledger = Ledger(epsilon=8.0, delta=1e-5)
    for _ in range(3):
        ledger.charge(M.Gaussian(3.0), label="a")
    history = ledger.history
    forged = dataclasses.replace(history[0], **{field: np.array([1.0, 2.0])})
    assert forged not in history and history.count(forged) == 0
    with pytest.raises(InvalidArgumentError, match="value="):
        history.index(forged)
    assert history != [forged] * 3 and history == list(history)
    assert history.index(history[2]) == 2 and history[1] in history  # the held ones still
