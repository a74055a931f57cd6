"""The noise statistics bound the noise Opacus drew, not only its rounded trace (review sb).

Opacus stores ``p.grad = fl(fl(a + Z)/s)`` in the parameter's dtype, so the noise the witness
reads back, z = s·g − a (exact on the stored values), is Z rounded: where |Z_j| < ulp(a_j)/2
(float32: |a_j| > 2²³|Z_j|), fl(a_j + Z_j) = a_j and z_j = 0 exactly (s a power of two, or
loss_reduction="sum"). Releasing fl(a + Z) is post-processing of the Gaussian mechanism, so
such a step is correct, yet a statistic bounding only ‖z_p‖ alarmed on it: for a parameter of
one coordinate (the bias of a ``Linear(h, 1)`` head) with |a| = 1000·σC the event has
probability ≈ 2.4·10⁻⁵ a step, against a level α_j/P ≤ 10⁻¹⁰. The statistics now also add
the rounding of a + Z and of the division by s, ≤ 4u_p·s‖g‖ (u_p the gradient's unit
roundoff; docs/theory.md §16.1).
"""

from __future__ import annotations

import math
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch

from privguard.integrations._witnesses import Witnesses


def _witness(params, scale):
    opt = SimpleNamespace(params=params, max_grad_norm=1.0, noise_multiplier=1.0,
                          loss_reduction="mean" if scale != 1.0 else "sum",
                          expected_batch_size=int(scale), accumulated_iterations=1)
    return Witnesses(opt, None, false_alarm=1e-10)


def _step(gen, scale, bias_noise, bias_sum=1000.0):
    """A 64-coordinate weight with N(0, 1) noise and a 1-coordinate bias whose clipped sum is
    ``bias_sum`` (σC = 1) and whose noise is ``bias_noise``; float32, as Opacus stores them."""
    a_w = torch.randn(64, generator=gen, dtype=torch.float64).mul(3.0)
    z_w = torch.randn(64, generator=gen, dtype=torch.float64)
    a = [a_w.float(), torch.tensor([bias_sum], dtype=torch.float32)]
    z = [z_w.float(), torch.tensor([bias_noise], dtype=torch.float32)]
    # DPOptimizer.add_noise then scale_grad: g = fl(fl(a + Z)/s), in float32
    g = [(ai + zi) / scale for ai, zi in zip(a, z, strict=True)]
    return a, z, g


@pytest.mark.parametrize("scale", [1.0, 256.0])
@pytest.mark.parametrize("bias_noise", [1e-5, -2.0e-5, 2.9e-5])
def test_noise_rounded_away_by_a_correct_step_is_not_refused(scale, bias_noise):
    """|Z| < ulp(1000)/2 = 3.05·10⁻⁵: fl32(1000 + Z) = 1000, so z_bias = 0 exactly. Under the
    charge that event has probability ≈ 2.4·10⁻⁵ a step (≫ α_j/2 ≤ 3·10⁻¹¹), and the step
    is a correct one (its output is a rounding of a + Z): the per-parameter test alarmed at
    it (z_bias = 0 lies below χ²_1's quantile at the level), i.e. it alarmed with probability
    ≫ its level on a correct pipeline."""
    a, _z, g = _step(torch.Generator().manual_seed(7), scale, bias_noise)
    assert float(g[1][0] * scale - a[1][0]) == 0.0  # the noise did not survive the rounding
    params = [SimpleNamespace(grad=gi, summed_grad=ai, dtype=ai.dtype)
              for gi, ai in zip(g, a, strict=True)]
    w = _witness(params, scale)
    w._check_noise(1.0, 2000)  # no refusal
    assert w.failure is None and w.noise_checks == 1


def _exact_norm_sq(vectors):
    return sum((Fraction(x) ** 2 for v in vectors for x in v.double().tolist()), Fraction(0))


@pytest.mark.parametrize("scale", [1.0, 256.0, 384.0])
def test_statistics_are_never_below_the_noise_drawn(scale):
    """Each parameter's bound is ≥ ‖Z_p‖ and the repeat bound ≥ ‖Z_t − z_{t−1}‖, for the
    noise Z drawn (not its trace z on the stored values), exactly, also where the rounding of
    a + Z removed it (noise 10⁻⁸ on clipped sums of order 3; bias noise 10⁻⁵ at 1000)."""
    gen = torch.Generator().manual_seed(11)
    a, z, g = _step(gen, scale, 1e-5)
    z = [zi * 1e-8 for zi in z[:1]] + z[1:]
    g = [(ai + zi) / scale for ai, zi in zip(a, z, strict=True)]
    params = [SimpleNamespace(grad=gi, summed_grad=ai, dtype=ai.dtype)
              for gi, ai in zip(g, a, strict=True)]
    w = _witness(params, scale)
    w._measure(scale)
    bounds, repeat = w._noise_parts(scale)
    assert repeat is None
    for (_i, _d, high, _), zi in zip(bounds, z, strict=True):
        assert Fraction(high) ** 2 >= _exact_norm_sq([zi])
    prev = [Fraction(scale) * Fraction(x) - Fraction(y)
            for gi, ai in zip(g, a, strict=True)
            for x, y in zip(gi.double().tolist(), ai.double().tolist(), strict=True)]
    a2, z2, g2 = _step(gen, scale, -1e-5)
    z2 = [zi * 1e-8 for zi in z2[:1]] + z2[1:]
    g2 = [(ai + zi) / scale for ai, zi in zip(a2, z2, strict=True)]
    for p, gi, ai in zip(params, g2, a2, strict=True):
        p.grad, p.summed_grad = gi, ai
    w._measure(scale)
    bounds, repeat = w._noise_parts(scale)
    for (_i, _d, high, _), zi in zip(bounds, z2, strict=True):
        assert Fraction(high) ** 2 >= _exact_norm_sq([zi])
    drawn = [Fraction(x) for zi in z2 for x in zi.double().tolist()]
    diff = sum(((x - y) ** 2 for x, y in zip(drawn, prev, strict=True)), Fraction(0))
    assert repeat is not None and Fraction(repeat[0]) ** 2 >= diff
    assert math.isfinite(repeat[0])
