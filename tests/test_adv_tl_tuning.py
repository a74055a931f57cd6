"""Adversarial pass tl on the tuners' promise (the winner only, nothing else):
the DP-HyPO density stays in S_{C,c} for every rule's output, propose-test holds the
ledger while its partitions train, and every candidate gets its own copy of its
hyperparameters (an in-place edit reached later candidates and the released winner)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard.tuning import (
    DPHyPOSearch,
    Geometric,
    Poisson,
    ProposeTest,
    RandomSearch,
    SubsetSearch,
    project_bounded_simplex,
)

THIRDS = {"x": [0, 1, 2]}


def in_s(pi: np.ndarray, prior: np.ndarray, C: float, c: float) -> bool:
    """The density a DP-HyPO run samples from (pi normalised) lies in S_{C,c}(prior)."""
    q = pi / pi.sum()
    return (abs(float(pi.sum()) - 1.0) <= 1e-9 and bool(np.all(q >= c * prior * (1 - 1e-9)))
            and bool(np.all(q <= C * prior * (1 + 1e-9))))


def test_an_extreme_rule_output_never_yields_a_density_outside_the_bounds():
    # the weights sum to 1.000001 after cancellation; the projection of their ratio
    # lost p − ν to rounding and returned [1/4, 2/3, 1/4] (Σ = 7/6): the run normalised
    # it and drew the first and last candidates with 3/14 < c·π = 1/4 (Theorem 1 assumes
    # every density within [c, C] × the prior)
    rule = lambda history, coords: np.array([-5e299, 5e299, 1.000001])
    tuner = DPHyPOSearch(THIRDS, Geometric(mean=2.0), cost=M.Gaussian(5.0), C=2.0, c=0.75,
                         update=rule, progress=False)
    with pytest.raises(InvalidArgumentError, match="projected in floating point"):
        tuner.density([(0, 0.5)])
    # inside a run the rule's failure falls back to the prior, which lies in S
    assert in_s(tuner._density_or_prior([(0, 0.5)]), tuner.prior, 2.0, 0.75)


@pytest.mark.parametrize("bounds", [(2.0, 0.75), (1e6, 1e-300)])
def test_every_rule_output_is_a_point_of_s_or_refused(bounds):
    big, small = bounds
    rng = np.random.default_rng(7)
    scales = [0.0, 1.0, -1.0, 3.0, 1e16, -1e16, 1e300, -1e300, 1e308, -1e308, 5e-324]
    for n in (2, 3, 5):
        space = {"x": list(range(n))}
        for _ in range(200):
            raw = rng.choice(scales, size=n) * rng.choice([1.0, 0.5, 1.000001], size=n)
            tuner = DPHyPOSearch(space, Geometric(mean=2.0), cost=M.Gaussian(5.0), C=big,
                                 c=small, update=lambda h, x, raw=raw: raw, progress=False)
            try:
                pi = tuner.density([(0, 0.5)])
            except InvalidArgumentError:
                pi = tuner._density_or_prior([(0, 0.5)])  # what a run samples instead
            assert in_s(pi, tuner.prior, big, small), raw


def test_projection_refuses_rather_than_return_a_sum_other_than_one():
    lo, hi = np.full(3, 0.25), np.full(3, 2 / 3)
    with pytest.raises(InvalidArgumentError) as info:
        project_bounded_simplex(np.array([-5e299, 5e299, 1.0]) / 1.000001, lo, hi)
    assert info.value.argument == "p"
    f = project_bounded_simplex(np.array([0.9, 0.05, 0.05]), lo, hi)  # an ordinary one
    assert f.sum() == pytest.approx(1.0, abs=1e-12)


def test_propose_test_holds_the_ledger_while_the_partitions_train():
    # a partition's objective charging the ledger it captured wrote one journal entry per
    # (candidate, partition): their times are each candidate's training time, their number
    # the objective's to decide from its accuracy; no round paid for either
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    refused = []

    def objective(params, indices):
        try:
            ledger.charge(M.PureDP(0.01), label="inside a partition")
        except LedgerStateError:
            refused.append(True)
            raise
        return 0.9 if params["lr"] == 0.1 else 0.2

    tuner = ProposeTest([{"lr": 0.1}, {"lr": 0.2}], epsilon0=1.0, partitions=3, seed=1,
                        progress=False)
    result = tuner.run(objective, ledger, 30)
    assert [r.label for r in ledger.history] == ["propose-test round"] * result.rounds
    assert len(refused) == 2 * 3  # every call refused; each partition is ⊥ (0)
    ledger.charge(M.PureDP(0.01), label="after")  # the hold ends with the run


# ---------------------------------------------------- each candidate's own hyperparameters
LAYERS = {"hidden": [[64], [32, 32]]}


def grows(params, child):
    """An honest in-place edit of a list value (prepending an input layer, say)."""
    params["hidden"].append(8)
    return float(len(params["hidden"]))


def test_random_search_candidates_never_share_a_value_object():
    # the space's lists were handed to candidates as they are: every candidate that drew
    # [64] appended to the same list, and the released winner showed one 8 per such
    # candidate (how many of the K runs drew it); the next candidate trained on the edit
    tuner = RandomSearch(LAYERS, Poisson(12.0), cost=M.Gaussian(50.0), seed=1, progress=False)
    result = tuner.run(grows, Ledger(epsilon=80.0, delta=1e-5))
    assert result.selected
    assert result.params["hidden"] in ([64], [32, 32])  # the drawn value, not an edited one
    assert result.score == len(result.params["hidden"]) + 1  # the candidate's own edit only
    assert tuner.space.choices() == {"hidden": ([64], [32, 32])}


def test_dp_hypo_candidates_never_share_a_value_object():
    tuner = DPHyPOSearch(LAYERS, Geometric(mean=12.0), cost=M.Gaussian(50.0), seed=1,
                         update=lambda h, x: np.ones(2), progress=False)
    result = tuner.run(grows, Ledger(epsilon=80.0, delta=1e-5))
    assert result.selected and result.params["hidden"] in ([64], [32, 32])
    assert result.score == len(result.params["hidden"]) + 1
    assert tuner.candidates == [{"hidden": [64]}, {"hidden": [32, 32]}]


def test_subset_search_candidates_and_final_training_get_their_own_copy():
    tuner = RandomSearch(LAYERS, Poisson(12.0), cost=M.Gaussian(50.0), seed=1, progress=False)
    search = SubsetSearch(tuner, q=0.5, final_cost=M.Gaussian(50.0), seed=1,
                          extrapolate=lambda params, scale: params)

    def final(params, child, indices, artifact):
        params["hidden"].append(8)
        return params["hidden"]

    result = search.run(lambda p, c, i: grows(p, c), final, Ledger(epsilon=80.0, delta=1e-5), 20)
    assert result.selected and result.tuned_params["hidden"] in ([64], [32, 32])
    assert result.params == result.tuned_params  # the final training's edit stays its own
    assert tuner.space.choices() == {"hidden": ([64], [32, 32])}


def test_propose_test_partitions_never_share_a_value_object():
    # each partition's call edited the candidate's list for the next: partition j's accuracy
    # then depended on partitions < j (the sensitivity 1/k assumes it does not)
    seen = []

    def objective(params, indices):
        params["hidden"].append(8)
        seen.append(len(params["hidden"]))
        return 0.5

    tuner = ProposeTest([{"hidden": [64]}, {"hidden": [32, 32]}], epsilon0=1.0, partitions=3,
                        seed=1, progress=False)
    tuner.run(objective, Ledger(epsilon=50.0, delta=1e-5), 30)
    assert seen == [2, 2, 2, 3, 3, 3]
    assert tuner.candidates == [{"hidden": [64]}, {"hidden": [32, 32]}]


def test_a_value_that_cannot_be_copied_is_refused_before_the_charge():
    ledger = Ledger(epsilon=80.0, delta=1e-5)
    tuner = RandomSearch({"lock": [threading.Lock()]}, Poisson(3.0), cost=M.Gaussian(50.0),
                         progress=False)
    with pytest.raises(InvalidArgumentError) as info:
        tuner.run(lambda p, c: 1.0, ledger)
    assert info.value.argument == "space" and "deep-copied" in str(info.value)
    assert len(ledger.history) == 0
    with pytest.raises(InvalidArgumentError, match="candidates"):
        ProposeTest([{"lock": threading.Lock()}], epsilon0=1.0, partitions=2,
                    progress=False).run(lambda p, i: 0.5, ledger, 10)
    assert len(ledger.history) == 0


def test_a_rehearsal_leaves_the_space_as_declared():
    # the rehearsal handed the space's own list to the objective: its in-place edit stayed
    # in the space, and the real run then drew hyperparameters nobody declared
    tuner = RandomSearch(LAYERS, Poisson(3.0), cost=M.Gaussian(50.0), seed=1, progress=False)
    rehearsal = tuner.rehearse(grows)
    assert rehearsal.params["hidden"] in ([64], [32, 32])
    assert tuner.space.choices() == {"hidden": ([64], [32, 32])}


def test_tpe_rule_refuses_a_grid_it_cannot_index():
    pytest.importorskip("optuna")
    from privguard.integrations.optuna import TPERule

    for grid in ({"hidden": [[64], [32]]}, {"x": 3}, {}):
        with pytest.raises(InvalidArgumentError) as info:
            TPERule(grid)
        assert info.value.argument == "search_space"


def spoiler(spoiled):
    """An objective that records whether its indices came spoiled, then spoils them."""
    def tune(params, child, indices):
        spoiled.append(bool(indices.size) and bool((indices == -1).all()))
        indices[:] = -1
        return 1.0
    return tune


def test_every_subset_candidate_gets_its_own_indices():
    # the subset's index array was one object for every candidate: a candidate that sorted
    # or shuffled it in place (by its losses, say) changed what later candidates trained on
    spoiled: list = []
    tune = spoiler(spoiled)
    tuner = RandomSearch({"lr": [0.1, 0.2]}, Poisson(8.0), cost=M.Gaussian(50.0), seed=1,
                         progress=False)
    SubsetSearch(tuner, q=0.5, final_cost=M.Gaussian(50.0), seed=1).run(
        tune, lambda p, c, i, a: None, Ledger(epsilon=80.0, delta=1e-5), 40)
    assert len(spoiled) > 1 and not any(spoiled)


def test_every_propose_test_call_gets_its_own_indices():
    spoiled: list = []
    tune = spoiler(spoiled)
    ProposeTest([{"lr": 0.1}, {"lr": 0.2}], epsilon0=1.0, partitions=2, seed=1,
                progress=False).run(lambda p, i: tune(p, None, i) - 0.5,
                                    Ledger(epsilon=50.0, delta=1e-5), 40)
    assert len(spoiled) == 4 and not any(spoiled)
