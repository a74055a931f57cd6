"""What the witnesses cost, interleaved: Opacus alone, attach, attach(witnesses=True).

The three pipelines of benchmarks/test_bench_witnesses.py (20-64-2 MLP, batch
128, one torch thread) step in turn, one step each per round, so a load that
comes and goes on a shared machine hits all three alike; each step is timed in
CPU time of the thread (``time.thread_time``), and the medians and minima are
reported as ratios to Opacus alone, measured in the same run.

Run: python benchmarks/witness_cost.py [--rounds 600]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from test_bench_witnesses import dp_sgd_step  # noqa: E402

MODES = ("opacus", "attach", "witnesses")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    steps = {mode: dp_sgd_step(mode) for mode in MODES}
    for mode in MODES:
        for _ in range(args.warmup):
            steps[mode]()
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            start = time.thread_time()
            steps[mode]()
            times[mode].append(time.thread_time() - start)
    base_median, base_min = statistics.median(times["opacus"]), min(times["opacus"])
    print(f"{args.rounds} interleaved rounds, CPU time of the thread per step:")
    for mode in MODES:
        med, low = statistics.median(times[mode]), min(times[mode])
        print(f"  {mode:10s} median {med * 1e3:.3f} ms ({med / base_median:.3f}×)   "
              f"min {low * 1e3:.3f} ms ({low / base_min:.3f}×)")


if __name__ == "__main__":
    main()
