"""Review rlo5 of branch lo5: each test fails on lo5's head (d720485)."""

from __future__ import annotations

import copy
import warnings

import pytest
from test_adv_fs_forged_state import _engine_attached

from privguard import BudgetExhausted, LedgerStateError


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
