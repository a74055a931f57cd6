"""Adversarial pass fs: DP-HyPO's public density(history) and GPUpdate check the history.

Each test failed before: a malformed history raised the built-in of whatever line met it
first (TypeError, ValueError, IndexError, OverflowError; scikit-learn's ValueError on NaN),
and a negative index read a candidate from the end (-1: the last), silently.
"""

from __future__ import annotations

import numpy as np
import pytest

from privguard import InvalidArgumentError
from privguard import mechanisms as M
from privguard.tuning import DPHyPOSearch, Geometric, GPUpdate

pytest.importorskip("sklearn")

BAD_HISTORIES = [
    True, 5, "ab", [(0,)], [(0, 1.0, 2)], [(3, 1.0)], [(-1, 1.0)], [(1.5, 1.0)], [("a", 1.0)],
    [(True, 1.0)], [(10**30, 1.0)], [(0, float("nan"))], [(0, float("inf"))], [(0, "a")],
    [(0, 10**400)], np.array([[0, 1.0]]),
]


def _search() -> DPHyPOSearch:
    return DPHyPOSearch({"x": [1, 2, 3]}, Geometric(mean=2.0), cost=M.Gaussian(5.0), seed=0,
                        progress=False)


@pytest.mark.parametrize("history", BAD_HISTORIES, ids=repr)
def test_a_malformed_history_is_refused_by_density(history):
    with pytest.raises(InvalidArgumentError, match="history"):
        _search().density(history)


@pytest.mark.parametrize("history", BAD_HISTORIES, ids=repr)
def test_a_malformed_history_is_refused_by_the_gp_rule(history):
    with pytest.raises(InvalidArgumentError, match="history"):
        GPUpdate()(history, _search().coords)


def test_a_well_formed_history_still_moves_the_density_towards_the_best():
    search = _search()
    history = [(0, 1.0), [2, np.float64(-1.0)], (np.int64(1), 0)]
    density = search.density(history)
    assert density.shape == (3,) and abs(density.sum() - 1.0) < 1e-12
    assert density[0] == density.max() > density[2] == density.min()
    assert np.array_equal(search.density(tuple(history)), density)


def test_the_gp_rule_refuses_an_empty_history_and_bad_coordinates():
    # sklearn's ValueError (no samples), and a TypeError/IndexError for coords
    with pytest.raises(InvalidArgumentError, match="history"):
        GPUpdate()([], _search().coords)
    for coords in (None, [[0.0], [1.0]], np.zeros(3), np.zeros((0, 1))):
        with pytest.raises(InvalidArgumentError, match="coords"):
            GPUpdate()([(0, 1.0)], coords)


@pytest.mark.parametrize("history", [[(-1, 1.0)], [(3, 1.0)], [(0, float("nan"))], None],
                         ids=repr)
def test_optunas_tpe_rule_refuses_a_malformed_history(history):
    # -1 counted a TPE trial at the last candidate; 3 raised IndexError
    pytest.importorskip("optuna")
    from privguard.integrations.optuna import TPERule

    with pytest.raises(InvalidArgumentError, match="history"):
        TPERule({"x": [1, 2, 3]}, n_samples=4)(history, None)
