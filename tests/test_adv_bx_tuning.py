"""Review bx: a search space the tuner cannot draw from is refused before the charge.

Before the fix, ``UniformFloat(-1e308, 1e308)`` (numpy: OverflowError, range exceeds
bounds) and ``IntUniform`` bounds beyond int64 (numpy: ValueError) were accepted; a
tuner charged its whole bound, and the first draw aborted the run (TuningAborted, the
bound spent, no candidate run). ``IntUniform(np.int64(1), 5)`` was refused.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M
from privguard.tuning import IntUniform, LogUniform, Poisson, RandomSearch, UniformFloat


@pytest.mark.parametrize("make", [
    lambda: UniformFloat(-1e308, 1e308),
    lambda: UniformFloat(-np.finfo(float).max, 0.0 + np.finfo(float).max),
    lambda: IntUniform(0, 2**64),
    lambda: IntUniform(-2**70, 0),
    lambda: IntUniform(0, 2**63),
])
def test_a_dimension_numpy_cannot_draw_is_refused(make):
    with pytest.raises(InvalidArgumentError) as info:
        make()
    assert info.value.argument == "low, high"


@pytest.mark.parametrize("dim,kind", [
    (lambda: UniformFloat(-1e307, 1e307), float),
    (lambda: UniformFloat(np.array(0.0), Fraction(1, 2)), float),
    (lambda: LogUniform(np.float32(1e-3), Fraction(1, 2)), float),
    (lambda: IntUniform(-2**63, 2**63 - 1), int),
    (lambda: IntUniform(np.int64(1), np.int32(5)), int),
])
def test_the_widest_accepted_dimensions_run_and_numpy_bounds_are_accepted(dim, kind):
    dim = dim()
    assert type(dim.low) is kind and type(dim.high) is kind
    ledger = Ledger(100.0, 1e-5)
    tuner = RandomSearch({"x": dim}, Poisson(3.0), cost=M.Gaussian(10.0), progress=False, seed=1)
    result = tuner.run(lambda params, child: 1.0, ledger)
    assert result.selected and dim.low <= result.params["x"] <= dim.high
    assert type(result.params["x"]) is kind


def test_propose_test_refuses_more_partitions_than_examples_before_anything_runs():
    # partitions=10**9 over 100 examples built 10**9 index arrays and called the objective
    # on each empty one, for hours or until MemoryError; here 10**4 partitions (it ran)
    from privguard.tuning import ProposeTest

    calls = []
    tuner = ProposeTest([{"a": 1}, {"a": 2}], epsilon0=0.5, partitions=10**4, progress=False)
    ledger = Ledger(10.0, 1e-5)

    def objective(params, indices):
        calls.append(1)
        return 0.5

    for call in (lambda: tuner.run(objective, ledger, 100),
                 lambda: tuner.rehearse(objective, 100),
                 lambda: tuner.utilities(objective, 100)):
        with pytest.raises(InvalidArgumentError) as info:
            call()
        assert info.value.argument == "n_examples" and "10000" in str(info.value)
    assert calls == [] and ledger.history == ()
    result = ProposeTest([{"a": 1}], epsilon0=0.5, partitions=4, progress=False,
                         seed=0).run(objective, ledger, 4)
    assert result.rounds >= 1 and len(calls) == 4


def test_candidates_warnings_do_not_leave_a_run_and_filters_are_restored():
    # Each candidate's warning reached the caller: with an "always" filter, one per
    # candidate, naming its hyperparameters; their number is K (the Optuna path dropped them)
    import threading
    import warnings

    from privguard.tuning import DPHyPOSearch, TruncatedNegativeBinomial

    def objective(params, child):
        warnings.warn(f"candidate lr={params['lr']}", UserWarning, stacklevel=1)
        return params["lr"]

    space = {"lr": [0.1, 0.2, 0.3]}
    for tuner in (RandomSearch(space, Poisson(6.0), cost=M.Gaussian(10.0), progress=False,
                               seed=2),
                  DPHyPOSearch(space, TruncatedNegativeBinomial(1.0, mean=6.0),
                               cost=M.Gaussian(10.0), progress=False, seed=2)):
        before = list(warnings.filters)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = tuner.run(objective, Ledger(100.0, 1e-5))
            warnings.warn("the caller's own warning", UserWarning, stacklevel=1)
        assert [str(w.message) for w in caught] == ["the caller's own warning"]
        assert result.selected and list(warnings.filters) == before

    # two threads' runs overlapping leave the process's filters as they were
    before = list(warnings.filters)
    runs = [threading.Thread(target=lambda: RandomSearch(
        space, Poisson(20.0), cost=M.Gaussian(10.0), progress=False).run(
            objective, Ledger(100.0, 1e-5))) for _ in range(4)]
    for t in runs:
        t.start()
    for t in runs:
        t.join(60)
    assert list(warnings.filters) == before


def test_propose_test_partitions_warnings_do_not_leave_a_run():
    import warnings

    from privguard.tuning import ProposeTest

    def objective(params, indices):
        warnings.warn(f"partition accuracy for a={params['a']}", UserWarning, stacklevel=1)
        return 0.5 * params["a"]

    tuner = ProposeTest([{"a": 1}, {"a": 2}], epsilon0=1.0, partitions=4, progress=False, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuner.run(objective, Ledger(100.0, 1e-5), 40)
    assert caught == []
