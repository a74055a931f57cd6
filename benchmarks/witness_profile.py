"""Where a witnessed step's extra time goes: each witness timed in place, inside real steps.

The witnessed pipeline of benchmarks/test_bench_witnesses.py (20-64-2 MLP, batch
128, one torch thread). Each part is wrapped with a wall-clock timer and run
inside real steps (after Opacus' own work, with the caches as a step leaves
them: the same small kernels cost several times their cost in a tight loop), and
the median per step is printed beside Opacus' own ``clip_and_accumulate`` and
the whole ``optimizer.step``:

- ``clip wrapper`` — the clipping witness's wrapper around Opacus' clipping on a
  micro-batch it does not recompute (7 in 8 after the first);
- ``clip check`` — the exact per-sample recomputation (every micro-batch here;
  1 in 8 in a real run);
- ``noise statistic`` — ``Witnesses._measure`` (copy, subtraction, norms);
- ``check`` — the whole check stage (noise, clipped-sum bound, sampling tests,
  per-record counts: all at every step), ``sampling tests`` its binomial tests.

Timers add about a microsecond each; the VM's load moves every number (run it
twice). What the witnesses cost as a ratio: benchmarks/witness_cost.py.

Run: python benchmarks/witness_profile.py [--steps 3000]
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

from test_bench_witnesses import dp_sgd_step  # noqa: E402


def _timed(record: list[int], call):
    def timed(*args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return call(*args, **kwargs)
        finally:
            record.append(time.perf_counter_ns() - start)
    return timed


def profile(steps: int, check_every: bool) -> dict[str, float]:
    """Median microseconds per step of each part, the per-sample check on every
    micro-batch (``check_every``) or never after the first."""
    from privguard.integrations.opacus import _ATTACHED

    before = set(_ATTACHED)
    step = dp_sgd_step("witnesses")
    (optimizer,) = [o for o in _ATTACHED if o not in before]
    witnesses = _ATTACHED[optimizer].witnesses
    witnesses._coins = SimpleNamespace(random=lambda: 0.0 if check_every else 1.0)
    times: dict[str, list[int]] = {k: [] for k in (
        "opacus clip", "wrapper", "noise statistic", "sampling tests", "check", "step")}
    witnesses._original = _timed(times["opacus clip"], witnesses._original)
    optimizer.clip_and_accumulate = _timed(times["wrapper"], optimizer.clip_and_accumulate)
    witnesses._measure = _timed(times["noise statistic"], witnesses._measure)
    witnesses._check_sampling = _timed(times["sampling tests"], witnesses._check_sampling)
    witnesses.check = _timed(times["check"], witnesses.check)
    optimizer.step = _timed(times["step"], optimizer.step)
    for _ in range(50):
        step()
    for record in times.values():
        record.clear()
    for _ in range(steps):
        step()
    own = [w - o for w, o in zip(times.pop("wrapper"), times["opacus clip"], strict=True)]
    out = {k: statistics.median(v) / 1e3 for k, v in times.items() if v}
    out["clip check" if check_every else "clip wrapper"] = statistics.median(own) / 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    never = profile(args.steps, check_every=False)
    every = profile(args.steps, check_every=True)
    print(f"{args.steps} steps, median µs per step (one thread, wall clock):")
    print(f"  optimizer.step (all)           {never['step']:8.1f}")
    print(f"  Opacus clip_and_accumulate     {never['opacus clip']:8.1f}")
    print(f"  clip wrapper (not recomputed)  {never['clip wrapper']:8.1f}")
    print(f"  clip check (recomputed)        {every['clip check']:8.1f}   (1 micro-batch in 8)")
    print(f"  check stage (every step)       {never['check']:8.1f}")
    print(f"    noise statistic              {never['noise statistic']:8.1f}")
    print(f"    sampling tests               {never['sampling tests']:8.1f}")


if __name__ == "__main__":
    main()
