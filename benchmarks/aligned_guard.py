"""What the aligned opt-in's per-step dropout re-check costs (issue a27).

``attach(..., aligned_micro_batches=True, model=model)`` re-reads, before each step's
charge, the training flag and rate of the dropout modules found at attach
(integrations/_aligned.py). This times that re-check on a model with 37 dropout layers
(BERT-base has 37 ``nn.Dropout``), all in training mode at rate 0 (every module read in
full: the worst case that passes), against the issue-26 DP-SGD step
(benchmarks/attach_overhead.py: a 20-64-2 MLP, batch 128, attach in memory), in the same
run, alternating, medians of ``--rounds`` rounds.

Run: python benchmarks/aligned_guard.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]


def main() -> None:
    import torch
    from attach_overhead import make_step
    from torch import nn

    from privguard.integrations._aligned import guard_for

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    blocks = [nn.Sequential(nn.Linear(4, 4), *[nn.Dropout(0.0) for _ in range(3)])
              for _ in range(12)]
    guard = guard_for(nn.Sequential(*blocks, nn.Dropout(0.0)))
    with tempfile.TemporaryDirectory() as tmp:
        step, _ = make_step("attach, in memory", tmp)
        for _ in range(20):
            step()
        checks, steps = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            for _ in range(args.steps):
                step()
            steps.append((time.perf_counter() - t) / args.steps)
            t = time.perf_counter()
            for _ in range(args.steps * 10):
                guard.check()
            checks.append((time.perf_counter() - t) / (args.steps * 10))
    check, one = statistics.median(checks), statistics.median(steps)
    print(f"dropout modules re-read per step: {len(guard)}")
    print(f"re-check: {check * 1e6:.1f} µs; DP-SGD step (20-64-2 MLP, batch 128): "
          f"{one * 1e6:.0f} µs; ratio {check / one:.3%}")


if __name__ == "__main__":
    main()
