"""Adversarial pass fs: ProposeTest with more examples than its partitions can be drawn for.

Each test failed before: ``rehearse`` and ``utilities`` raised the built-in
``ValueError``/``MemoryError`` of numpy's draw, and ``run`` raised ``TuningAborted``,
whose message says the bound was charged, although nothing was.
"""

from __future__ import annotations

import numpy as np
import pytest

from privguard import InvalidArgumentError, Ledger
from privguard.tuning import ProposeTest

#: beyond what one process can draw a partition label for: numpy refuses the array
#: ("array is too big", "Maximum allowed dimension exceeded") without allocating
HUGE = [2**62, 2**63]


def _tuner() -> ProposeTest:
    return ProposeTest([{"x": 1}, {"x": 2}], epsilon0=1.0, partitions=4, seed=0,
                       progress=False)


def _never(params, indices):
    raise AssertionError("the objective ran")


@pytest.mark.parametrize("n", HUGE)
def test_run_refuses_an_undrawable_n_examples_before_anything_runs(n):
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    with pytest.raises(InvalidArgumentError, match="n_examples"):
        _tuner().run(_never, ledger, n)
    assert len(ledger.runs) == 0 and ledger.epsilon() == 0.0


@pytest.mark.parametrize("n", HUGE)
def test_rehearse_and_utilities_refuse_an_undrawable_n_examples(n):
    with pytest.raises(InvalidArgumentError, match="n_examples"):
        _tuner().rehearse(_never, n)
    with pytest.raises(InvalidArgumentError, match="n_examples"):
        _tuner().utilities(_never, n)


def test_a_seeded_run_draws_the_partitions_then_the_noise_from_one_stream():
    # run() now draws the partitions before its sealed part: the same stream, in the same
    # order, as utilities() and then select() on one generator
    def objective(params, indices):
        return min(1.0, params["x"] * len(indices) / 400)

    ran = _tuner().run(objective, Ledger(epsilon=50.0, delta=1e-5), 400)
    rng = np.random.default_rng(0)
    tuner = _tuner()
    parts = tuner.utilities(objective, 400, rng=rng)
    by_parts = tuner.select(parts, Ledger(epsilon=50.0, delta=1e-5), rng=rng)
    assert ran == by_parts
