"""The noise statistics in one pass and one host sync a step (task t28).

``Witnesses._measure`` now forms ẑ = a − s·g, its difference from the previous step's and
their norms per parameter in the same pass as the Gram product, and reads every number back
in one ``tolist``; ``_noise_parts`` only does the host arithmetic. The statistics must be
those of the two-pass code it replaces (main at cf54ad5: a second pass in ``_noise_parts``,
a second sync): checked here bit for bit against that computation, restated below, over
consecutive steps with float32, float64 and bfloat16 gradients; and the check stage of a
real witnessed step brings tensors to the host once.
"""

from __future__ import annotations

import math
import zlib
from types import SimpleNamespace

import pytest
import torch
from test_witnesses import DELTA, EPSILON, pipeline, run

from privguard import Ledger
from privguard.integrations._witnesses import Witnesses, gram_widening
from privguard.integrations.opacus import attach

SHAPES = ((16, 5), (16,), (0,), (2, 16), (2,))  # an empty parameter too


class _TwoPass:
    """The two-pass statistics of cf54ad5 (Witnesses._measure then _noise_parts, each with
    its own device pass and sync), restated on the same float64 buffer layout."""

    def __init__(self) -> None:
        self.prev: tuple[torch.Tensor, float] | None = None  # (ẑ of the last step, its R)

    def step(self, grads, summed, scale):
        buf = torch.cat([torch.cat([t.double().reshape(-1) for t in summed]).unsqueeze(0),
                         torch.cat([t.double().reshape(-1) for t in grads]).unsqueeze(0)])
        d = buf.shape[1]
        aa, ag, _, gg = torch.mm(buf, buf.t()).view(-1).tolist()
        z_sq = aa - 2.0 * scale * ag + scale * scale * gg
        gamma = gram_widening(d)
        root_a, root_g = math.sqrt(max(aa, 0.0)), math.sqrt(max(gg, 0.0))
        r = (root_a + scale * root_g) ** 2
        up = 1.0 + 2.0 ** -40
        sum_high = math.sqrt(max(aa, 0.0) / (1.0 - gamma)) * up
        g_high = math.sqrt(max(gg, 0.0) / (1.0 - gamma)) * up
        # wr: the total statistic also adds 4u_p·s‖g‖ (Opacus' own rounding, as the parts do)
        unit = max(torch.finfo(g.dtype).eps / 2.0 for g in grads)
        z_high = (math.sqrt(max(z_sq + gamma * r, 0.0)) + 4.0 * unit * scale * g_high) * up
        measured = (z_high, sum_high, math.sqrt(max(z_sq, 0.0)), d)
        # the second pass (cf54ad5's _noise_parts)
        sizes = [g.numel() for g in grads]
        z = torch.empty(d, dtype=torch.float64)
        torch.sub(buf[0], buf[1], alpha=scale, out=z)
        tensors = list(torch.split(z, sizes))
        if self.prev is not None:
            tensors.append(z - self.prev[0])
        norms = torch.stack(torch._foreach_norm(tensors, 2)).tolist()
        u = 2.0 ** -53
        reach = (sum_high + scale * g_high) * up
        drift = [4.0 * (torch.finfo(g.dtype).eps / 2.0) * scale * g_high for g in grads]
        out = []
        for i, d_p in enumerate(sizes):
            if d_p:
                widen = up / (1.0 - gram_widening(d_p))
                out.append((i, d_p, (norms[i] + 3.0 * u * reach) * widen + drift[i] * up,
                            norms[i]))
        repeat = None
        if self.prev is not None:
            high = (norms[-1] + 5.0 * u * (reach + self.prev[1])) * up \
                / (1.0 - gram_widening(d)) + max(drift) * up
            repeat = (high, norms[-1])
        self.prev = (z, reach)
        return measured, out, repeat


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_one_pass_statistics_equal_the_two_pass_ones(dtype):
    gen = torch.Generator().manual_seed(zlib.crc32(str(dtype).encode()))
    params = [SimpleNamespace(grad=None, summed_grad=None, dtype=dtype) for _ in SHAPES]
    opt = SimpleNamespace(params=params, max_grad_norm=1.0, noise_multiplier=1.0,
                          loss_reduction="mean", expected_batch_size=128,
                          accumulated_iterations=1)
    w, reference = Witnesses(opt, None, false_alarm=1e-10), _TwoPass()
    for step, (scale, noise) in enumerate([(128.0, 1.0), (384.0, 1e-4), (1.0, 0.0),
                                           (128.0, 1.0), (256.0, 3.0)]):
        for p, shape in zip(params, SHAPES, strict=True):
            a = torch.randn(shape, generator=gen, dtype=torch.float64).mul(3.0)
            z = noise * torch.randn(shape, generator=gen, dtype=torch.float64)
            p.summed_grad, p.grad = a.to(dtype), ((a + z) / scale).to(dtype)
        measured = w._measure(scale)
        bounds, repeat = w._noise_parts(scale)
        want = reference.step([p.grad for p in params], [p.summed_grad for p in params], scale)
        assert (measured, bounds, repeat) == want, step  # bit for bit
        assert (repeat is None) == (step == 0)


def test_a_witnessed_step_brings_tensors_to_the_host_once(monkeypatch):
    """cf54ad5 synced twice in the check stage (the Gram product, then the per-parameter
    norms): every number of the step's noise tests now comes back in one ``tolist``."""
    model, opt, loader, crit = pipeline(seed=2)
    handle = attach(opt, Ledger(epsilon=EPSILON, delta=DELTA), data_loader=loader,
                    witnesses=True)
    w = handle.witnesses
    assert run(model, opt, loader, crit, 2) == 2  # past the first step (nothing to repeat)
    syncs: list[str] = []
    for name in ("tolist", "item", "__float__", "__int__", "__bool__", "cpu", "numpy"):
        method = getattr(torch.Tensor, name)

        def counted(self, *args, _method=method, _name=name, **kwargs):
            syncs.append(_name)
            return _method(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    check, per_step = w.check, []

    def counting(mechanism):
        before = len(syncs)
        check(mechanism)
        per_step.append(syncs[before:])

    w.check = counting
    assert run(model, opt, loader, crit, 3) == 3
    monkeypatch.undo()
    assert per_step == [["tolist"]] * 3
