"""The noise statistic from a float64 Gram matrix (task c28): never below the exact value.

``Witnesses._measure`` reads ‖Z‖² = ‖a‖² − 2s⟨a, g⟩ + s²‖g‖² (a = summed_grad, g = grad)
from one float64 product and widens it by its rounding bound (docs/theory.md §16.2). Checked
against exact rational arithmetic on the stored values, in the cancellation regime (a clipped
sum far larger than the noise) and for float16/bfloat16/float32/float64 gradients; and, on a
seeded pipeline, the noise test's decisions are those of the exact statistic.
"""

from __future__ import annotations

import math
import zlib
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch
from test_witnesses import DELTA, EPSILON, _half_noise, pipeline, run

from privguard import InvalidArgumentError, Ledger, PipelineMismatchError
from privguard.integrations._witnesses import Witnesses, _chi2_lower_tail, gram_widening, level
from privguard.integrations.opacus import attach

SHAPES = ((16, 5), (16,), (2, 16), (2,))


def _fake(grads, summed):
    params = [SimpleNamespace(grad=g, summed_grad=a) for g, a in zip(grads, summed, strict=True)]
    w = Witnesses.__new__(Witnesses)
    w.optimizer, w._buf = SimpleNamespace(params=params), None
    return w


def _draw(gen, dtype, noise_sd, scale):
    """Clipped sums a (N(0, 9) entries) and gradients g = (a + noise)/s, stored in ``dtype``."""
    summed = [torch.randn(s, generator=gen, dtype=torch.float64).mul(3.0).to(dtype)
              for s in SHAPES]
    grads = [((a.double() + noise_sd * torch.randn(a.shape, generator=gen,
                                                    dtype=torch.float64)) / scale).to(dtype)
             for a in summed]
    return summed, grads


def _exact(grads, summed, scale):
    """(‖s·g − a‖², ‖a‖²) in exact rational arithmetic on the stored values."""
    z = s = Fraction(0)
    for g, a in zip(grads, summed, strict=True):
        for gi, ai in zip(g.double().reshape(-1).tolist(), a.double().reshape(-1).tolist(),
                          strict=True):
            diff = Fraction(scale) * Fraction(gi) - Fraction(ai)
            z += diff * diff
            s += Fraction(ai) * Fraction(ai)
    return z, s


def _subnormal(dtype, scale, d):
    """Review rwl: the absolute rounding below the smallest normal number, (1 + s)·η·√d
    (η the subnormal spacing: float16 2⁻²⁴; float32 and wider: < 10⁻⁴⁴)."""
    info = torch.finfo(dtype)
    return (1.0 + scale) * info.smallest_normal * info.eps * math.sqrt(d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("regime", ["noise", "cancel"])
def test_gram_statistic_is_never_below_the_exact_norms(dtype, regime):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype}{regime}".encode()))
    for trial in range(3):
        scale = (1.0, 128.0, 384.0)[trial % 3]
        noise_sd = 1.0 if regime == "noise" else 1e-4  # the clipped sum ≈ 10⁴× the noise
        summed, grads = _draw(gen, dtype, noise_sd, scale)
        w = _fake(grads, summed)
        z_high, sum_high, z_norm, d = w._measure(scale)
        z_sq, a_sq = _exact(grads, summed, scale)
        assert d == sum(math.prod(s) for s in SHAPES)
        assert Fraction(z_high) ** 2 >= z_sq and Fraction(sum_high) ** 2 >= a_sq
        # and not far above: + (d+16)·2⁻⁵³·(‖a‖ + s‖g‖)², then × (1 + 2⁻⁴⁰)²; plus (wr) the
        # 4u_p·s‖g‖ of Opacus' own rounding of a + Z in the gradient's dtype
        g_norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
        r = (math.sqrt(float(a_sq)) + scale * g_norm) ** 2
        drift = 4.0 * torch.finfo(dtype).eps / 2.0 * scale * g_norm \
            + _subnormal(dtype, scale, d)  # review rwl
        assert z_high <= (math.sqrt((float(z_sq) + (d + 16) * 2.0 ** -52 * r) * (1 + 1e-11))
                          + drift * (1 + 1e-11))
        assert sum_high <= math.sqrt(float(a_sq)) * (1 + 1e-11)
        assert math.isclose(z_norm ** 2, float(z_sq), rel_tol=1e-6, abs_tol=1e-6 * r ** 0.5)


def test_buffer_is_reused_and_rebuilt_when_the_shapes_change():
    grads = [torch.ones(s) for s in SHAPES]
    w = _fake(grads, [torch.zeros(s) for s in SHAPES])
    w._measure(1.0)
    first = w._buf
    w._measure(1.0)
    assert w._buf is first
    w.optimizer.params = w.optimizer.params[:2]
    assert w._measure(1.0)[3] == 16 * 5 + 16 and w._buf is not first


def test_noise_decisions_are_those_of_the_exact_statistic():
    """Seeded run: at every step the test's decision (pass, or refuse at step 6 under half
    the noise) is the one the exactly computed ‖Z‖²/(σC)² gives at the same level."""
    model, opt, loader, crit = pipeline(seed=5)
    handle = attach(opt, Ledger(epsilon=EPSILON, delta=DELTA), data_loader=loader,
                    witnesses=True)
    w = handle.witnesses
    measure, decisions = w._measure, []

    def spy(scale):
        out = measure(scale)
        z_sq, _ = _exact([p.grad for p in opt.params], [p.summed_grad for p in opt.params],
                         scale)
        sd = float(opt.noise_multiplier) * float(opt.max_grad_norm)
        tail = _chi2_lower_tail(float(z_sq) / sd ** 2, out[3])
        decisions.append(tail <= level(w.noise_checks + 1, w.false_alarm))
        return out

    w._measure = spy
    assert run(model, opt, loader, crit, 5) == 5
    _half_noise(opt)
    with pytest.raises(PipelineMismatchError) as info:
        run(model, opt, loader, crit, 1)
    assert info.value.witness == "noise" and info.value.step == 6
    assert decisions == [False] * 5 + [True]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int32])
def test_gradients_float64_cannot_hold_exactly_are_refused(dtype):
    """A complex or integer gradient would not copy exactly into the float64 buffer."""
    grads = [torch.ones(s, dtype=dtype) for s in SHAPES]
    w = _fake(grads, [torch.zeros(s, dtype=dtype) for s in SHAPES])
    with pytest.raises(InvalidArgumentError, match="witnesses"):
        w._measure(1.0)
    assert w._buf is None


@pytest.mark.parametrize("d", [1, 1_474, 10**6, 3 * 10**8, 10**9, 10**12, 10**14])
def test_widening_covers_both_rounding_terms_at_any_d(d):
    """Review rw: the widening must cover γ_d/(1 − γ_d) (the Gram entries) plus
    6u(1 + γ_d)/(1 − γ_d) (the float64 evaluation) and the rest (docs/theory.md §16.2): the
    final sum's rounding, ≤ u(1 + O(γ_d))·R, and R's own (≤ 7u, two roots, a product, a sum,
    a square) and the product g·R's (≤ u), both relative to g·R: 2u + 20u·γ_d covers them.
    In exact arithmetic on the float it returns. γ_{d+16}, used before, fails from
    d ≈ 2.7·10⁸ (a 300M-parameter model): its second-order term is (du)², the two terms'
    2(du)²."""
    u = Fraction(1, 2**53)
    gamma_d = d * u / (1 - d * u)
    need = (gamma_d / (1 - gamma_d) + 6 * u * (1 + gamma_d) / (1 - gamma_d)
            + 2 * u + 20 * u * gamma_d)
    assert Fraction(gram_widening(d)) >= need


def test_only_empty_parameters_are_not_tested():
    """Review rw: with every noisy parameter empty (d = 0), χ²_0's quantile and tail are NaN
    and the noise test alarmed ("σ ≈ nan") on a step that releases no coordinate."""
    empty = [torch.zeros(0), torch.zeros(0, 3)]
    assert _fake(empty, [t.clone() for t in empty])._measure(1.0) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("regime", ["noise", "cancel", "none"])
def test_per_parameter_statistic_is_never_below_the_exact_norms(dtype, regime):
    """Review rt: each parameter's bound on ‖Z_p‖ (a − s·g formed in float64) is ≥ the exact
    norm of the stored values, also when the clipped sum is 10⁴× the noise or there is none."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype}{regime}p".encode()))
    for trial in range(3):
        scale = (1.0, 128.0, 384.0)[trial % 3]
        noise_sd = {"noise": 1.0, "cancel": 1e-4, "none": 0.0}[regime]
        summed, grads = _draw(gen, dtype, noise_sd, scale)
        w = _fake(grads, summed)
        w._zbuf = None
        w._measure(scale)
        bounds = w._noise_parts(scale)[0]  # the per-parameter bounds
        assert [b[:2] for b in bounds] == [(i, math.prod(s)) for i, s in enumerate(SHAPES)]
        for (i, _d, z_high, _z), g, a in zip(bounds, grads, summed, strict=True):
            z_sq, _ = _exact([g], [a], scale)
            assert Fraction(z_high) ** 2 >= z_sq, (i, float(z_sq), z_high)
            # and tight: within a relative 10⁻¹² plus the 3u·(‖a‖ + s‖g‖) rounding allowance
            # (the norms of the whole clipped sum and gradient: _measure's Gram bounds), and the
            # 4u_p·s‖g‖ of Opacus' own rounding of a + Z in the gradient's dtype (review sb)
            g_norm = math.sqrt(sum(float(x.double().norm()) ** 2 for x in grads))
            slack = 4 * 2.0 ** -53 * (math.sqrt(sum(float(x.double().norm()) ** 2
                                                    for x in summed))
                                      + scale * g_norm) \
                + 4.0001 * torch.finfo(dtype).eps / 2 * scale * g_norm \
                + 1.0001 * _subnormal(dtype, scale, _d)  # review rwl
            assert z_high <= math.sqrt(float(z_sq)) * (1 + 1e-12) + float(slack)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("regime", ["noise", "cancel", "none"])
def test_repeat_statistic_is_never_below_the_exact_difference(dtype, regime):
    """Review rt: the bound on ‖Z_t − Z_{t−1}‖ is ≥ the exact difference of the two steps'
    z = s·g − a on the stored values (also when the noise repeats exactly: "none")."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype}{regime}r".encode()))
    noise_sd = {"noise": 1.0, "cancel": 1e-4, "none": 0.0}[regime]
    summed, grads = _draw(gen, dtype, noise_sd, 128.0)
    w = _fake(grads, summed)
    w._zbuf = None
    w._measure(128.0)
    assert w._noise_parts(128.0)[1] is None  # the first step has nothing to compare with
    summed2, grads2 = _draw(gen, dtype, noise_sd, 384.0)
    for p, g, a in zip(w.optimizer.params, grads2, summed2, strict=True):
        p.grad, p.summed_grad = g, a
    w._measure(384.0)
    high, _ = w._noise_parts(384.0)[1]
    exact = Fraction(0)
    for g1, a1, g2, a2 in zip(grads, summed, grads2, summed2, strict=True):
        for x1, y1, x2, y2 in zip(*(t.double().reshape(-1).tolist() for t in (g1, a1, g2, a2)),
                                  strict=True):
            diff = (Fraction(384) * Fraction(x2) - Fraction(y2)) \
                - (Fraction(128) * Fraction(x1) - Fraction(y1))
            exact += diff * diff
    assert Fraction(high) ** 2 >= exact
