"""Issue 25, item 7: messages name what differs, with both values, and the remedy."""

from __future__ import annotations

import pytest

import privguard
from privguard import BudgetExhausted, Ledger, LedgerStateError
from privguard import mechanisms as M


def test_reopening_with_another_target_names_only_the_difference_and_the_remedy(tmp_path):
    path = str(tmp_path / "l.db")
    Ledger(3.0, 1e-5, path=path).close()
    with pytest.raises(LedgerStateError) as info:
        Ledger(4.0, 1e-5, path=path)
    text = str(info.value)
    assert len(text) < 400, text
    assert "epsilon: stored 3, requested 4" in text and "delta" not in text.split("(")[1]
    assert "Ledger.open(path)" in text and "retarget=" in text
    with pytest.raises(LedgerStateError) as info:
        Ledger(3.0, 1e-5, path=path, orders=[2.0, 4.0, 8.0, 16.0, 32.0])
    text = str(info.value)
    assert len(text) < 400 and "orders: stored 157 values 1.1…1024, requested 5 values 2…32" \
        in text and "can never change" in text


def test_a_state_of_another_configuration_shows_both_values_and_the_remedy():
    state = Ledger(3.0, 1e-5).state_dict()
    with pytest.raises(LedgerStateError) as info:
        Ledger(2.0, 1e-5).load_state_dict(state)
    text = str(info.value)
    assert "epsilon: state 3, this ledger 2" in text and "Ledger.load_state_dict(state)" in text
    assert len(text) < 400


def test_an_in_memory_checkpoint_into_a_file_ledger_says_what_to_do(tmp_path):
    mem = Ledger(3.0, 1e-5)
    mem.charge(M.Gaussian(5.0))
    with pytest.raises(LedgerStateError, match="without path=") as info:
        Ledger(3.0, 1e-5, path=str(tmp_path / "f.db")).load_state_dict(mem.state_dict())
    assert "not a prefix" in str(info.value)


def test_remaining_repr_is_short_and_a_label_less_refusal_reads_naturally():
    ledger = Ledger(1.0, 1e-5)
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge(M.Gaussian(0.1))
    text = str(info.value)
    assert text.startswith("charge of Gaussian(") and "None" not in text.split("refused")[0]
    assert "budget 0 of ε = 1 spent" in text
    assert len(repr(info.value.remaining)) < 250 and "157 orders" in repr(info.value.remaining)
    with pytest.raises(BudgetExhausted, match=r"^charge 'big' of"):
        ledger.charge(M.Gaussian(0.1), label="big")


def test_integration_errors_and_warnings_are_exported_from_privguard():
    from privguard.integrations._sampling import NonPoissonSamplingError

    assert privguard.NonPoissonSamplingError is NonPoissonSamplingError
    assert "NonPoissonSamplingError" in privguard.__all__
    pytest.importorskip("opacus")
    from privguard.integrations.opacus import AccountantWarning

    assert privguard.AccountantWarning is AccountantWarning and "AccountantWarning" in dir(privguard)


def test_leaving_the_plan_warns_once_with_what_it_cost_and_tells_listeners():
    import warnings

    from privguard import Plan, PlanDeviationWarning

    plan_step = M.SubsampledGaussian(2.0, 0.4)  # T_A = 8 at (3, 0.99e-5): cheap to certify
    events = []
    ledger = Ledger(3.0, 1e-5, plan=Plan(plan_step, steps=8), filter="hybrid",
                    listeners=[events.append])
    ledger.charge(plan_step, times=2)  # inside: no warning
    before = ledger.remaining(plan_step).repeats
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ledger.charge(M.SubsampledGaussian(4.0, 0.5), label="bigger batch")  # q > 0.4: outside
        ledger.charge(M.SubsampledGaussian(4.0, 0.5))  # A already closed: no second warning
    after = ledger.remaining(plan_step).repeats
    warned = [w for w in caught if w.category is PlanDeviationWarning]
    assert len(warned) == 1
    text = str(warned[0].message)
    assert "'bigger batch'" in text and "outside the plan's envelope" in text
    assert f"{before:g} before this charge" in text and after < before
    assert [e.kind for e in events] == ["charge", "charge", "deviation", "charge"]
    assert events[2].label == "bigger batch"
