"""Issue 25, item 6: tuner.rehearse runs one candidate end to end and charges nothing."""

from __future__ import annotations

import numpy as np
import pytest

from privguard import BudgetExhausted, InvalidArgumentError, Ledger
from privguard import mechanisms as M
from privguard.tuning import (
    DPHyPOSearch,
    Poisson,
    ProposeTest,
    RandomSearch,
    Rehearsal,
    SubsetSearch,
    TruncatedNegativeBinomial,
)

STEP = M.SubsampledGaussian(1.0, 0.05)


def _train(params, child, steps=20):
    for _ in range(steps):
        child.charge(STEP)
    return -abs(params["lr"] - 0.1)


def _tuners(cost):
    return [RandomSearch({"lr": [0.05, 0.1, 0.5]}, Poisson(3.0), cost=cost, progress=False),
            DPHyPOSearch({"lr": [0.05, 0.1, 0.5]}, TruncatedNegativeBinomial(1.0, 0.2),
                         cost=cost, update=lambda h, c: np.ones(len(c)), progress=False)]


@pytest.mark.parametrize("which", [0, 1])
def test_rehearsal_runs_one_candidate_and_charges_no_ledger(which):
    ledger = Ledger(3.0, 1e-5)
    tuner = _tuners(M.SubsampledGaussian(1.0, 0.05, steps=20))[which]
    out = tuner.rehearse(_train)
    assert isinstance(out, Rehearsal) and out.params["lr"] in (0.05, 0.1, 0.5)
    assert out.score == -abs(out.params["lr"] - 0.1)
    assert len(ledger.history) == 0  # a real ledger is never involved


@pytest.mark.parametrize("which", [0, 1])
def test_a_typo_in_the_objective_is_shown_not_hidden(which):
    def typo(params, child):
        return params["learning_rate"]

    with pytest.raises(KeyError, match="learning_rate"):
        _tuners(STEP)[which].rehearse(typo)


@pytest.mark.parametrize("which", [0, 1])
def test_a_step_less_cost_shows_up_as_the_childs_refusal_with_the_remedy(which):
    tuner = _tuners(M.SubsampledGaussian(1.0, 0.05))[which]  # one step declared, 20 trained
    with pytest.raises(BudgetExhausted) as info:
        tuner.rehearse(_train)
    text = str(info.value)
    assert "per-candidate cost SubsampledGaussian(noise_multiplier=1.0, sample_rate=0.05, " \
           "steps=1)" in text and "steps=epochs * steps_per_epoch" in text
    assert "after 1 admitted charge" in text and isinstance(info.value.__cause__, BudgetExhausted)


def test_a_non_score_and_another_ledgers_refusal_are_the_objectives_own_errors():
    tuner = _tuners(STEP)[0]
    with pytest.raises(InvalidArgumentError, match="not a finite score"):
        tuner.rehearse(lambda p, c: float("nan"))
    other = Ledger(0.01, 1e-5)

    def spends_elsewhere(params, child):
        other.charge(M.Gaussian(0.1))

    with pytest.raises(BudgetExhausted) as info:
        tuner.rehearse(spends_elsewhere)
    assert "rehearsal" not in str(info.value)


def test_subset_search_rehearses_tuning_and_final_training():
    cost = M.SubsampledGaussian(1.0, 0.05, steps=20)
    search = SubsetSearch(_tuners(cost)[0], q=0.2, final_cost=cost, variant=1, seed=0)
    seen = {}

    def tune(params, child, idx):
        seen["subset"] = len(idx)
        return _train(params, child)

    def final(params, child, idx, artifact):
        seen["final"] = len(idx)
        _train(params, child)
        return "model"

    out = search.rehearse(tune, final, 100)
    assert out.artifact == "model" and seen["subset"] + seen["final"] == 100
    with pytest.raises(BudgetExhausted, match="per-candidate cost"):
        search.rehearse(tune, lambda p, c, i, a: _train(p, c, steps=40), 100)


def test_propose_test_rehearsal_shows_out_of_range_utilities():
    pt = ProposeTest([{"lr": 0.1}, {"lr": 0.5}], epsilon0=0.5, partitions=4, granularity=0.05,
                     progress=False)
    assert pt.rehearse(lambda p, part: 0.5, 100).score == 0.5
    with pytest.raises(InvalidArgumentError, match=r"returned 87\.5"):
        pt.rehearse(lambda p, part: 87.5, 100)  # a percentage, not an accuracy
    with pytest.raises(ZeroDivisionError):
        pt.rehearse(lambda p, part: 1 / 0, 100)
