"""Review rlo4 of task lo4: each test fails on lo4's head (7415cd8)."""

from __future__ import annotations

import numpy as np
import pytest

from privguard import DEFAULT_ORDERS
from privguard import mechanisms as M
from privguard._mechanisms import _repeat_select as rs
from privguard.tuning import Poisson

ORDERS = np.array(DEFAULT_ORDERS)


def _main_delta_hat(orders: np.ndarray, base: np.ndarray) -> np.ndarray:
    """δ̂ as main (5a474ed) computed it: at ε̂ = log1p(1/(λ−1)), to nearest, its
    Bretagnolle–Huber term ½·log1p(−exp(−ε(α)))."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        eps_hat = np.log1p(1 / (orders - 1))
        kl = 0.5 * np.log1p(-np.exp(-base))
        kl_best = np.min(np.where(np.isnan(kl), np.inf, kl))
        a = orders[None, :]
        log_d = (a - 1) * (base[None, :] - eps_hat[:, None]) - np.log(a) + (a - 1) * np.log1p(-1 / a)
        log_d = np.where(np.isnan(log_d), np.inf, log_d)
        return np.exp(np.minimum(np.min(log_d, axis=1), kl_best))


def _main_curve(base_mech: M.Mechanism, mu: float, orders: np.ndarray) -> np.ndarray:
    """RepeatAndSelect(base, Poisson(μ))'s curve as main computed it (:func:`_main_delta_hat`)."""
    base = base_mech.rdp(orders)
    delta_hat = _main_delta_hat(orders, base)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.minimum(rs._poisson_bound(orders, base, mu, delta_hat),
                         rs._poisson_convex_bound(orders, base, mu))
    return rs._finish(orders, out, None)


@pytest.mark.parametrize(("sigma", "q", "mu"), [(1.0, 1e-8, 3.0), (0.5, 1e-8, 10.0),
                                               (1.0, 1e-8, 1e4), (0.7, 1e-6, 100.0)])
def test_the_poisson_tuning_curve_is_never_below_mains(sigma, q, mu):
    # Review rlo4: lo4 replaced δ̂'s Bretagnolle–Huber term ½·log1p(−exp(−ε)) by a rounded-up
    # ½·log(−expm1(−ε)). The old term lost ~u/ε of its value either way, and where it had
    # been above the exact value the new one is below it: the curve fell against main's by up
    # to 2.2·10⁻⁸ (relative) at Poisson(3), 2.5·10⁻⁵ at Poisson(10⁴). A stored total may lie
    # below today's curve, never above it (privguard/_stores/_revision.py): a state_dict main
    # wrote after such a charge failed to load ("does not replay to the recorded spent
    # totals"). Now the term is never below main's.
    mech = M.SubsampledGaussian(sigma, q, steps=1)
    today = M.RepeatAndSelect(mech, Poisson(mu)).rdp(ORDERS)
    before = _main_curve(mech, mu, ORDERS)
    fell = [(float(lam), float((b - t) / b)) for lam, t, b in zip(ORDERS, today, before)
            if t < b]
    assert not fell


def test_delta_hat_is_never_below_mains_on_random_curves():
    # δ̂ itself against main's (each step of lo4's δ̂ rounds monotonically at or above main's
    # but the Bretagnolle–Huber term, now floored by main's), on curves down to 10⁻³⁰⁰.
    rng = np.random.default_rng(11)
    for trial in range(200):
        orders = np.sort(1 + 10 ** rng.uniform(-5, 6, size=16))
        orders = np.unique(np.clip(orders, 1.00001, 1e6))
        base = np.sort(10 ** rng.uniform(-300 if trial % 2 else -16, 2, size=orders.size))
        assert np.all(rs._delta_hat(orders, base) >= _main_delta_hat(orders, base)), trial


@pytest.mark.parametrize("d", [1, 2, 4])
@pytest.mark.parametrize("above", [1.01, 4.0, 30.0])
def test_a_small_float64_step_without_noise_is_not_passed_on_the_underflow_allowance(d, above):
    # Review rlo4: lo4 refused float64 steps where the squares' underflow allowance is
    # ≥ σC√d/16, its share of the statistic d/256 or less above that; but χ²_d's quantile at
    # α_j is below d/256 for small d (α = 10⁻¹⁰: d < 10), so a step with no noise at all
    # passed there on the allowance alone, at σC from the guard up to ~10⁻¹⁴³ (d = 1, s = 64),
    # where main refused it (its statistic ~0). Now refused, not charged (a function of σ,
    # C, s, d, the dtype and α_j), unless such a statistic still alarms the test.
    torch = pytest.importorskip("torch")
    from test_leftovers_lo4 import _float64_step

    from privguard import PipelineMismatchError

    sd = above * 16 * 65 * 2.0 ** -510  # above lo4's guard, 16(1 + s)·2⁻⁵¹⁰ at s = 64
    a = torch.randn(d, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 1e-160
    w = _float64_step(a, a / 64.0, sd)
    with pytest.raises(PipelineMismatchError, match="too small to be measured") as info:
        w._check_noise(sd, 64)
    assert not getattr(info.value, "step_charged", False)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_small_steps_at_ordinary_magnitudes_are_judged_as_before(dtype):
    # The guard above moves no ordinary step: a correct float64 or float32 step of 4
    # coordinates at σC = 1 passes, one without noise alarms the noise test.
    torch = pytest.importorskip("torch")
    from test_leftovers_lo4 import _float64_step

    from privguard import PipelineMismatchError

    kind = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(4, generator=gen, dtype=torch.float64).to(kind) * 0.1
    z = torch.randn(4, generator=gen, dtype=torch.float64).to(kind)
    w = _float64_step(a, (a + z) / 64.0, 1.0)
    w._check_noise(1.0, 64)
    assert w.failure is None and w.noise_checks == 1
    w = _float64_step(a, a / 64.0, 1.0)
    with pytest.raises(PipelineMismatchError, match="P\\(this little noise"):
        w._check_noise(1.0, 64)


def _clipping_run(a, sigma, c, records):
    torch = pytest.importorskip("torch")
    from test_leftovers_lo4 import _float64_step

    z = torch.randn(a.numel(), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    w = _float64_step(a, (a + z.to(a.dtype)) / 64.0, sigma)
    w.optimizer.max_grad_norm = c
    w._check_noise(sigma, records)
    assert w.failure is None


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_empty_poisson_batch_of_a_float64_model_passes_the_clipping_check(dtype):
    # Review rlo4: lo4's bound on ‖a‖ adds √(d·2⁻¹⁰²⁰) for float64 steps, so with B = 0
    # records (an empty Poisson batch: the bound is 0) every float64 step was refused
    # ("the clipped sum of this step's 0 records has norm 2.38666e-153 > 0 × C"), at C = 1.
    torch = pytest.importorskip("torch")
    _clipping_run(torch.zeros(64, dtype=getattr(torch, dtype)), 1.0, 1.0, 0)


def test_a_nonzero_clipped_sum_of_no_records_is_refused_below_the_underflow():
    # ... while a clipped sum of no records that is not 0 is refused however small (main
    # passed entries of 10⁻¹⁷⁰: their squares round to 0)
    torch = pytest.importorskip("torch")
    from privguard import PipelineMismatchError

    with pytest.raises(PipelineMismatchError) as info:
        _clipping_run(torch.full((64,), 1e-170, dtype=torch.float64), 1.0, 1.0, 0)
    assert info.value.witness == "clipping"


@pytest.mark.parametrize("norm", [0.0, 0.5, 0.99])
def test_a_correct_float64_clipped_sum_is_never_refused_at_a_tiny_bound(norm):
    # Review rlo4: at B·C just below √(d·2⁻¹⁰²⁰)/11 (C ≈ 3.4·10⁻¹⁵⁶, B = 64, d = 64) lo4
    # refused a correct step whose ‖a‖ = 0.99·B·C and passed one whose a = 0: a refusal,
    # not charged, that depends on the clipped sum. A correct clip never trips the check.
    torch = pytest.importorskip("torch")
    import math

    x = math.sqrt(64 * 2.0 ** -1020 / 120.5)  # B·C
    u = torch.randn(64, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    _clipping_run(u / u.norm() * norm * x, 64.0 / x, x / 64, 64)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_steps_without_float64_tensors_keep_mains_allowances_bit_for_bit(dtype):
    # Task lo4's squares' allowance and review rlo4's guards are float64's only: a step of
    # another dtype keeps main's subnormal terms η·√d exactly, and no floor.
    torch = pytest.importorskip("torch")
    import math

    from test_leftovers_lo4 import _float64_step

    kind = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(6)
    a = (torch.randn(40, generator=gen, dtype=torch.float64) * 0.1).to(kind)
    z = torch.randn(40, generator=gen, dtype=torch.float64).to(kind)
    w = _float64_step(a, (a + z) / 64.0, 1.0)
    w._check_noise(1.0, 64)
    lay = w._buf
    eta = torch.finfo(kind).smallest_normal * torch.finfo(kind).eps
    assert lay.squares_total == 0.0
    assert lay.tiny == [eta * math.sqrt(40)] and lay.tiny_total == eta * math.sqrt(40)
