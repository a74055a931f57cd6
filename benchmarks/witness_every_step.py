"""What the witnesses cost at every step, with the sampled per-sample check skipped.

The pipelines of benchmarks/test_bench_witnesses.py (20-64-2 MLP, batch 128,
one torch thread), interleaved step by step as in benchmarks/witness_cost.py,
CPU time of the thread. Each witnessed mode has both coins (the per-sample
clipping schedule) replaced by one that always skips, so what remains is what
runs at every step: the clipping wrapper, the check stage (noise statistic,
clipped-sum bound, sampling tests), the per-record recording and its
once-an-epoch test.
Printed: the median over rounds of each round's difference to ``attach`` alone
(µs), for

- ``skip all`` — the witnesses as they are (per-sample check skipped);
- ``no per-record`` — without the per-record counts (recording and epoch test);
- ``no check`` — ``Witnesses.check`` replaced by a no-op (the wrapper and the
  recording remain).

Then the check stage timed in place (wall clock, median over steps) against the
same calls in a tight loop on the same state: after Opacus' own work the caches
are cold, and the same Python runs several times slower.

Run: python benchmarks/witness_every_step.py [--rounds 1500]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from test_bench_witnesses import dp_sgd_step  # noqa: E402

SKIP = SimpleNamespace(random=lambda: 1.0)  # a coin that never draws the per-sample check


def witnessed(tweak=None):
    """A witnessed step with the sampled per-sample check skipped, and its Witnesses."""
    from privguard.integrations.opacus import _ATTACHED

    before = set(_ATTACHED)
    step = dp_sgd_step("witnesses")
    (optimizer,) = [o for o in _ATTACHED if o not in before]
    witnesses = _ATTACHED[optimizer].witnesses
    witnesses._coins = SKIP
    if tweak is not None:
        tweak(witnesses)
    return step, witnesses, _ATTACHED[optimizer]


def _no_inclusion(w) -> None:
    w.inclusion.restore()
    w.inclusion = None


def _no_check(w) -> None:
    w.check = lambda mechanism: None


def in_place(steps: int) -> tuple[float, float]:
    """(median µs of Witnesses.check inside real steps, median µs in a tight loop)."""
    step, w, handle = witnessed()
    for _ in range(50):
        step()
    check, inside = w.check, []

    def timed(mechanism):
        start = time.perf_counter_ns()
        try:
            return check(mechanism)
        finally:
            inside.append(time.perf_counter_ns() - start)

    w.check = timed
    for _ in range(steps):
        step()
    w.check = check
    mechanism, sizes, loop = handle._mechanism_for(1), w._counter.sizes, []
    opt = w.optimizer
    sd = float(opt.noise_multiplier) * float(opt.max_grad_norm) / float(opt.expected_batch_size)
    for i in range(steps):  # the same call on the same state, warm
        records = 128 + (i * 7919) % 21 - 10
        w._records, sizes[:] = records, [records]
        for p in opt.params:  # fresh noise (untimed): the repeat test refuses the same noise
            p.grad.add_(torch.randn_like(p.grad), alpha=sd)
        start = time.perf_counter_ns()
        check(mechanism)
        loop.append(time.perf_counter_ns() - start)
        sizes.clear()
    return statistics.median(inside) / 1e3, statistics.median(loop) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1500)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    steps = {"opacus": dp_sgd_step("opacus"), "attach": dp_sgd_step("attach"),
             "skip all": witnessed()[0], "no per-record": witnessed(_no_inclusion)[0],
             "no check": witnessed(_no_check)[0]}
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times: dict[str, list[int]] = {mode: [] for mode in steps}
    for _ in range(args.rounds):
        for mode, step in steps.items():
            start = time.thread_time_ns()
            step()
            times[mode].append(time.thread_time_ns() - start)
    base = times["attach"]
    print(f"{args.rounds} interleaved rounds; attach median {statistics.median(base) / 1e3:.0f} "
          f"µs a step; median over rounds of the difference to attach, CPU time:")
    for mode in steps:
        diff = statistics.median(t - b for t, b in zip(times[mode], base, strict=True)) / 1e3
        print(f"  {mode:14s} {diff:+7.1f} µs")
    inside, loop = in_place(args.rounds)
    print(f"Witnesses.check: {inside:.1f} µs inside real steps, "
          f"{loop:.1f} µs in a tight loop (wall clock, medians)")


if __name__ == "__main__":
    main()
