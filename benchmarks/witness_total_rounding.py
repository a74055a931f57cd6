"""How far below the noise drawn the total noise statistic fell without Opacus' rounding term.

Opacus stores g = fl(fl(a + Z)/s) in the gradient's dtype, so the trace z = s·g − a that the
witness reads is the noise drawn, Z, within 4u_p·s‖g‖ (docs/theory.md §16.1). Before task wr
the total statistic, √(‖z‖² + g_d·R)·(1 + 2⁻⁴⁰), lacked that term; this script searches
float32 steps of d coordinates (a uniform on [−1, 1], Z uniform within a few ulps of a) for
the largest ratio ‖Z‖ / statistic, with the term left out ("before") and with it ("now":
never above 1).

Run: python benchmarks/witness_total_rounding.py [--trials 3000]
"""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace

import numpy as np
import torch

from privguard.integrations._witnesses import Witnesses


def _statistic(a: torch.Tensor, g: torch.Tensor, scale: float) -> tuple[float, float]:
    """(statistic now, statistic without the 4u_p·s‖g‖ term) for one float32 parameter."""
    p = SimpleNamespace(grad=g, summed_grad=a, dtype=a.dtype)
    opt = SimpleNamespace(params=[p], max_grad_norm=1.0, noise_multiplier=1.0,
                          loss_reduction="mean" if scale != 1.0 else "sum",
                          expected_batch_size=int(scale), accumulated_iterations=1)
    w = Witnesses(opt, None, false_alarm=1e-10)
    now = w._measure(scale)[0]
    assert w._buf is not None and w._norms_high is not None
    term = 4.0 * w._buf.unit_max * scale * w._norms_high[1]
    return now, now / (1.0 + 2.0 ** -40) - term  # the term removed (up to 2⁻⁵³ relative)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3000)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    print("d  s      max ‖Z‖/statistic before   now")
    for d in (1, 4):
        for scale in (1.0, 3.0, 384.0):
            before = now = 0.0
            for _ in range(args.trials):
                a = torch.tensor(rng.uniform(-1, 1, d), dtype=torch.float32)
                z = torch.tensor(rng.uniform(-1, 1, d) * 2.0 ** -22, dtype=torch.float32)
                g = (a + z) / scale  # DPOptimizer.add_noise then scale_grad, in float32
                drawn = math.sqrt(float((z.double() ** 2).sum()))
                stat_now, stat_before = _statistic(a, g, scale)
                before, now = max(before, drawn / stat_before), max(now, drawn / stat_now)
            print(f"{d}  {scale:<6g} {before:.4f}                    {now:.6f}")
            assert now <= 1.0, "the statistic fell below the noise drawn"


if __name__ == "__main__":
    main()
