"""Adversarial pass tl on the tuners' promise (the winner only, nothing else):
the DP-HyPO density stays in S_{C,c} for every rule's output, and propose-test holds
the ledger while its partitions train."""

from __future__ import annotations

import numpy as np
import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard.tuning import DPHyPOSearch, Geometric, ProposeTest, project_bounded_simplex

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
    rule = lambda history, coords: np.array([-5e299, 5e299, 1.000001])  # noqa: E731
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
