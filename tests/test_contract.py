"""One behaviour suite shared by every filter and odometer configuration.

Every ledger configuration must: check and charge by the same rule, record
nothing on refusal, never let a refused charge change any reported number,
keep its running ε non-decreasing, and round-trip through its state.
"""

from __future__ import annotations

import numpy as np
import pytest

from privguard import BudgetExhausted, Concentrated, Ledger, Uniform, single_order
from privguard import mechanisms as M

CONFIGS = {
    "filter-default": lambda: Ledger(2.0, 1e-5),
    "filter-uniform": lambda: Ledger(2.0, 1e-5, shares=Uniform()),
    "filter-single-order": lambda: Ledger(2.0, 1e-5, shares=single_order(12.0)),
    "filter-paper-odometer": lambda: Ledger(2.0, 1e-5, odometer="paper",
                                            shares=Concentrated(0.5)),
    "strict": lambda: Ledger(rdp_budget=M.SubsampledGaussian(1.0, 0.02, steps=300), delta=1e-5),
    "odometer-tight": lambda: Ledger(delta=1e-5),
    "odometer-paper": lambda: Ledger(delta=1e-5, odometer="paper"),
}

SEQUENCE = ([M.SubsampledGaussian(1.0, 0.02)] * 200 + [M.Gaussian(8.0), M.Laplace(20.0)]
            + [M.SubsampledGaussian(0.8, 0.02)] * 400 + [M.PureDP(0.5)] * 3)


@pytest.fixture(params=list(CONFIGS), ids=list(CONFIGS))
def ledger(request):
    return CONFIGS[request.param]()


def test_can_afford_and_charge_agree_and_refusals_change_nothing(ledger):
    last = 0.0
    for mech in SEQUENCE:
        before_spent, before_eps, before_n = ledger.spent, ledger.epsilon(), len(ledger.history)
        predicted = ledger.can_afford(mech)
        if predicted:
            ledger.charge(mech)
        else:
            with pytest.raises(BudgetExhausted):
                ledger.charge(mech)
            np.testing.assert_array_equal(ledger.spent, before_spent)
            assert ledger.epsilon() == before_eps and len(ledger.history) == before_n
        eps = ledger.epsilon()
        assert eps >= last
        last = eps


def test_remaining_repeats_matches_charging(ledger):
    step = M.SubsampledGaussian(1.0, 0.02)
    for _ in range(10):
        if ledger.can_afford(step):
            ledger.charge(step)
    k = ledger.remaining(step).repeats
    if np.isinf(k):
        return  # no filter: nothing is ever refused
    for _ in range(int(k)):
        ledger.charge(step)
    assert not ledger.can_afford(step)


def test_state_round_trip(ledger):
    for mech in SEQUENCE[:50]:
        if ledger.can_afford(mech):
            ledger.charge(mech)
    again = Ledger.load_state_dict(ledger.state_dict())
    np.testing.assert_array_equal(again.spent, ledger.spent)
    assert again.epsilon() == ledger.epsilon()
    mech = M.SubsampledGaussian(0.7, 0.05)
    assert again.can_afford(mech) == ledger.can_afford(mech)
