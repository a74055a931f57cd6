"""Review rul: task ul's rounded-up conversions at adversarial points (orders at the grid's
ends and beyond, α − 1 and (α−1)/α rounding, δ down to the smallest subnormal, curve values
0, subnormal and near the largest float), against mpmath; and the DP-HyPO corollary with
C = c = 1."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

from privguard._curves import _conversion as conv

ALPHAS = [1.00001, 1.0000100000000001, 1 + 2**-40, 1 + 2**-52, 1.5, 2.0, 3.0, 31.5, 1024.0,
          99999.99, 1e6, 2.0**53 + 2, 1e100]
DELTAS = [5e-324, 1e-300, 1e-290, 3.7064695780085415e-06, 0.5, 1 - 2**-53]
RDPS = [0.0, 5e-324, 1e-300, 2**-60, 1e-5, 1.0, 66.96122643024195, 1e15, 1e300, 1.7e308]


def _exact(alpha, delta, tau, method):
    a, d, t = mp.mpf(alpha), mp.mpf(delta), mp.mpf(tau)
    if method == conv.IMPROVED:
        return t - (mp.log(d) + mp.log(a)) / (a - 1) + mp.log((a - 1) / a)
    return t - mp.log(d) / (a - 1)


@pytest.mark.parametrize("method", [conv.IMPROVED, conv.CLASSIC])
def test_conversions_at_adversarial_points_are_never_below_the_exact_value(method):
    mp.mp.dps = 60
    orders = np.array(ALPHAS)
    for delta in DELTAS:
        for tau in RDPS:
            eps = conv.epsilon_per_order(orders, np.full(orders.shape, tau), delta, method)
            for alpha, e in zip(ALPHAS, eps.tolist()):
                assert mp.mpf(e) >= _exact(alpha, delta, tau, method), (alpha, delta, tau)


@pytest.mark.parametrize("method", [conv.IMPROVED, conv.CLASSIC])
def test_a_delta_at_adversarial_points_is_never_below_the_exact_value(method):
    mp.mp.dps = 60
    orders = np.array(ALPHAS)
    for epsilon in [0.0, 1e-300, 0.1, 3.0, 1e5]:
        for tau in RDPS:
            log_d = conv.log_delta_per_order(orders, np.full(orders.shape, tau), epsilon, method)
            for alpha, ld in zip(ALPHAS, log_d.tolist()):
                a, t = mp.mpf(alpha), mp.mpf(tau)
                exact = (a - 1) * (t - epsilon)
                if method == conv.IMPROVED:
                    exact += -mp.log(a) + (a - 1) * mp.log1p(-1 / a)
                assert mp.mpf(ld) >= exact, (alpha, epsilon, tau)
                assert mp.mpf(conv.delta_from_log(ld)) >= min(mp.mpf(1), mp.exp(exact))


def test_dp_hypo_with_c_equal_to_one_keeps_repeat_and_selects_pure_epsilon():
    # task ul added 2⁻⁵⁰ to log(C/c) even where it is exactly 0 (C = c = 1), unlike the
    # curve's _tnb_bound: DPHyPO(C = c = 1) was no longer RepeatAndSelect (review rul)
    from privguard import mechanisms as M
    from privguard.tuning import TruncatedNegativeBinomial

    runs = TruncatedNegativeBinomial(0.5, gamma=0.05)
    assert M.DPHyPO(M.PureDP(0.3), runs, 1.0, 1.0).pure_epsilon \
        == M.RepeatAndSelect(M.PureDP(0.3), runs).pure_epsilon
