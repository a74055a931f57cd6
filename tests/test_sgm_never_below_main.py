"""Task sgr: no subsampled-Gaussian value goes below the one privguard computed before task sg.

A ledger file written before task sg replays with today's curves; a value that fell would
make it replay to a spend below its checkpoint's (the ledger would go backwards). Task sg's
rounding margin weighted by the terms' shares lowered values at σ ≥ 100 by up to 2.51e-11
(review rsg); task sgr restored the largest-term margin, and step 3b's chord/Taylor cap is
never applied below the value of before task sg (``_sgm.curve`` takes the larger).

The reference for "before task sg" is (1) the rule of step 2b with its older tolerance
(1e-9) and the bound with the largest-term margin r̄ = 32u·max_j M_j + 4(α+1)u, written
out here from the bound's pieces, and (2) ``_legacy.pre_sg()``, which computes the curve of
before task sg (checked equal to main's e0b2a80, bit for bit, on the grid below).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from opacus.accountants.analysis.rdp import compute_rdp
from scipy.special import logsumexp

from privguard import DEFAULT_ORDERS
from privguard._curves import _legacy, _sgm, _sgm_upper

ORDERS = np.array(DEFAULT_ORDERS, dtype=np.float64)
INTEGER = ORDERS == np.round(ORDERS)
QS = [1e-4, 1e-3, 0.004, 0.01, 0.1]  # review rsg's grid (scripts/sgm_opacus_agreement.py)
_U = 2.0**-53


def _largest_term_upper(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """The integer-order bound of before task sg: the rounding margin of the largest term."""
    n = orders[:, None]
    j = np.arange(int(orders.max()) + 1, dtype=np.float64)[None, :]
    log_t, mag = _sgm_upper._log_terms(q, 2.0 * sigma * sigma, n, j)
    r_bar = 32 * _U * mag.max(axis=1) + 4 * (orders + 1.0) * _U
    log_a = _sgm_upper._log1p_upper(logsumexp(log_t, axis=1), r_bar)
    return np.maximum(log_a / (orders - 1.0) * (1.0 + 2 * _U), math.ulp(0.0))


@pytest.mark.parametrize("sigma", [100.0, 1e3, 1e4])
@pytest.mark.parametrize("q", QS)
def test_integer_values_not_below_the_rule_of_before_task_sg(q, sigma):
    """Before task sg an integer value was Opacus' within 1e-9 of the largest-term bound, else
    that bound; task sg's weighted margin put 394 of these values below it (σ = 1e3,
    q = 1e-3, α = 1024 by 2.51e-11, review rsg)."""
    ints = ORDERS[INTEGER]
    opacus = np.array(compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=ints.tolist()))
    bound = _largest_term_upper(q, sigma, ints)
    older = np.where(opacus >= (1.0 - _legacy.LEGACY_KEEP_RTOL) * bound, opacus, bound)
    ours = _sgm.curve(q, sigma, ORDERS)[INTEGER]
    assert (ours >= older).all(), ints[ours < older]


def _older_curve(q: float, sigma: float) -> np.ndarray:
    with _legacy.pre_sg():
        return _sgm.curve(q, sigma, ORDERS)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 10.0, 100.0, 1e3, 1e4])
@pytest.mark.parametrize("q", QS)
def test_curve_not_below_the_curve_of_before_task_sg(q, sigma):
    ours = _sgm.curve(q, sigma, ORDERS)
    older = _older_curve(q, sigma)
    assert (ours >= older).all(), ORDERS[ours < older]


@pytest.mark.parametrize(("q", "sigma"), [(1e-3, 1.0), (0.01, 1.0), (0.004, 2.0), (0.1, 2.0)])
def test_a_cap_below_the_older_value_does_not_lower_it(monkeypatch, q, sigma):
    """Step 3b replaces a fractional value today's tolerances doubt by
    min(cap, max(v, estimate·(1 + 1e-9))), the cap a rigorous bound (the chord, and the Taylor
    bound below order 2). A cap below a value the older rule kept (Opacus' value high by
    round-off) would lower it: with the Taylor bound made tiny, no value may still fall
    below the older curve (computed under the same tiny cap: only the values both rules
    replace take it)."""
    monkeypatch.setattr(_sgm_upper, "below_two",
                        lambda q, sigma, orders: np.full(len(orders), math.ulp(0.0)))
    ours = _sgm.curve(q, sigma, ORDERS)
    older = _older_curve(q, sigma)
    assert (ours >= older).all(), ORDERS[ours < older]
