"""Review radv2 of task adv2: the Optuna trial's checks of suggest_* refused what Optuna (and
main) took with the same meaning."""

from __future__ import annotations

import numpy as np
import pytest


def _trial():
    pytest.importorskip("optuna")
    from privguard.integrations._optuna_trial import SEED_KEY, PrivateTrial

    return PrivateTrial({SEED_KEY: 7}, fixed=False, pruner=None)


def test_trial_takes_numpy_flags_arrays_and_zero_d_bounds():
    # adv2's checks refused each of these, which Optuna (and main) took as meant
    t = _trial()
    assert 1e-3 <= t.suggest_float("lr", 1e-3, 1.0, log=np.bool_(True)) <= 1.0
    assert 1 <= t.suggest_int("n", 1, 8, log=np.bool_(False)) <= 8
    assert t.suggest_categorical("c", np.array([1, 2, 3])) in (1, 2, 3)
    assert 0.0 <= t.suggest_float("x", np.array(0.0), np.array(1.0)) <= 1.0
    assert 0 <= t.suggest_int("k", np.array(0), np.array(4)) <= 4
    # the same parameter suggested again with the same distribution: the same value
    assert t.suggest_float("lr", 1e-3, 1.0, log=True) == t.params["lr"]


@pytest.mark.parametrize("call", [
    lambda t: t.suggest_float("x", 1e-3, 1.0, log=np.bool_),  # the type, not a flag
    lambda t: t.suggest_categorical("c", np.ones((2, 2))),
    lambda t: t.suggest_float("x", np.array([0.0]), 1.0),
    lambda t: t.suggest_int("k", np.array(0.5), 4),
], ids=["log-type", "choices-2d", "low-1d", "int-low-0d-float"])
def test_trial_still_refuses_what_is_not_meant(call):
    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        call(_trial())


@pytest.mark.parametrize("low,high,step", [(-1e308, 1e308, None), (-1e308, 1e308, 1e300),
                                           (0.0, 1e308, 1e-308)],
                         ids=["range", "range-step", "step-count"])
def test_trial_refuses_a_float_range_whose_draw_overflows(low, high, step):
    # finite bounds whose width is not: numpy's OverflowError ("Range exceeds valid
    # bounds") escaped suggest_float at the draw, on main and on adv2
    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="suggest_float"):
        _trial().suggest_float("x", low, high, step=step)
