"""Task ul: PureDP near the smallest normal float never below the exact curve, and the
pure-ε corollary products of seeds 002 and 003 rounded up (mpmath, 50 digits)."""

from __future__ import annotations

import mpmath as mp
import numpy as np

from privguard import mechanisms as M
from privguard._curves import _stable
from privguard.tuning import TruncatedNegativeBinomial

mp.mp.dps = 50


def _exact_pure_dp(e: float, a: float):
    # Mironov 2017, Prop. 5 through cosh A − cosh B = 2 sinh((A+B)/2) sinh((A−B)/2)
    e, a = mp.mpf(e), mp.mpf(a)
    return mp.log1p(2 * mp.sinh(a * e / 2) * mp.sinh((a - 1) * e / 2) / mp.cosh(e / 2)) / (a - 1)


def test_pure_dp_near_the_smallest_normal_float_is_not_below_the_exact_curve():
    # main: 8.7e-15 (relative) below at ε₀ = 4.4e-154, α = 1.0001 (e^L subnormal), and a
    # few subnormal steps below further down (review rcv, scripts/rcv_pure_dp_scan.py)
    orders = np.array([1.00001, 1.0001, 1.001, 1.01, 1.1, 2.0, 10.0, 1000.0])
    for e in [4.4e-154, *np.logspace(-160, -150, 25).tolist(), 1e-308, 3e-300, 1e-320]:
        values = M.PureDP(e).rdp(orders)
        for a, v in zip(orders.tolist(), values.tolist()):
            assert mp.mpf(v) >= _exact_pure_dp(e, a), (e, a, v)


def test_the_absolute_margin_leaves_every_curve_from_1e_140_on_unchanged():
    # the per-params rule of the checkpoint version (_resumable.UNCHANGED_SINCE[5]):
    # the margin is below half an ulp of every value there
    orders = np.array([1.00001, 1.1, 2.0, 64.0, 1e6])
    for e in np.logspace(-140, 1.7, 300).tolist():
        margin = M.PureDP(e).rdp(orders)
        without = np.clip(_stable.pure_dp_rdp(e, orders) * (1.0 + _stable.MARGIN),
                          min(5e-324, e), e) if e < _stable.PURE_DP_FLAT else margin
        assert margin.tobytes() == np.asarray(without).tobytes(), e


def _tnb(eta: float) -> TruncatedNegativeBinomial:
    return TruncatedNegativeBinomial(eta=eta, gamma=0.5)


def test_the_pure_epsilon_corollaries_are_never_below_the_theorems():
    # seed 002 Corollary 3, (2+η)ε₀, and seed 003 Theorem 2, (2+θ)(ε₀ + log(C/c)): main's
    # float products were rounded to nearest, an ulp or two below the exact value
    from fractions import Fraction

    rng = np.random.default_rng(7)
    below_before = 0
    for _ in range(300):
        eta = float(rng.choice([0.0, 1.0, float(rng.uniform(-0.99, 5.0)),
                                float(10.0 ** rng.uniform(-12, 2))]))
        e0 = float(10.0 ** rng.uniform(-300, 300))
        big, small = float(10.0 ** rng.uniform(0, 300)), float(10.0 ** rng.uniform(-300, 0))
        ras = M.RepeatAndSelect(M.PureDP(e0), _tnb(eta)).pure_epsilon
        exact_ras = (2 + Fraction(eta)) * Fraction(e0)
        assert ((ras == float("inf") and exact_ras > Fraction(1.7976931348623157e308))
                or Fraction(ras) >= exact_ras), (eta, e0)
        below_before += (2 + eta) * e0 < float("inf") and Fraction((2 + eta) * e0) < exact_ras
        hypo = M.DPHyPO(M.PureDP(e0), _tnb(eta), C=big, c=small).pure_epsilon
        exact = (2 + mp.mpf(eta)) * (mp.mpf(e0) + mp.log(mp.mpf(big) / mp.mpf(small)))
        assert mp.mpf(hypo) >= exact, (eta, e0, big, small)
        assert hypo == float("inf") or mp.mpf(hypo) <= exact * (1 + 2.0**-45)
    assert below_before > 0  # the float product was below the exact one in some cases
    # past the float range: +inf, as the float product gave
    assert M.RepeatAndSelect(M.PureDP(1e308), _tnb(1.0)).pure_epsilon == float("inf")


def test_a_version_5_checkpoint_is_resumed_from_unless_a_curve_task_ul_changed_is_before_it():
    from privguard._stores._resumable import RESUMABLE, UNCHANGED_SINCE, changed
    from privguard._stores._rows import CHECKPOINT_CURVES

    # version 7 (task sr) resumes from no older checkpoint; changed() still decides for 2-5
    # (version 8, review radv8: the Gaussian's and zCDP's curves rounded up)
    assert CHECKPOINT_CURVES == 8 and not RESUMABLE and set(UNCHANGED_SINCE) == {2, 3, 4, 5}

    def pure(e):
        return {"type": "PureDP", "params": {"epsilon": e}}

    tnb = _tnb(1.0).to_dict()
    assert changed(pure(1e-150), 5) and changed(pure(1e-150), 4)  # the absolute margin
    assert changed(pure("x"), 5)  # unreadable: fail closed
    assert not changed(pure(0.5), 5) and not changed(pure(50.0), 5)  # cv's rule: before 5
    assert changed(pure(50.0), 4)
    for kind in ("RepeatAndSelect", "DPHyPO"):  # the corollary's round-up
        params = {"base": pure(0.5), "runs": tnb, **({"C": 2.0, "c": 0.5} if kind == "DPHyPO"
                                                     else {})}
        assert changed({"type": kind, "params": params}, 5)
    assert not changed(M.RepeatAndSelect(M.Laplace(1.0), _tnb(1.0)).to_dict(), 5)
    assert changed(M.SubsampledGaussian(1.0, 0.01).to_dict(), 5)  # task sg's, version 6 too
    assert changed({"type": "Composed", "params": {"parts": [pure(1e-200)]}}, 5)
