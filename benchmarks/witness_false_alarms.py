"""False alarms of the witnesses in clean runs (issue 28): R runs of S steps, count alarms.

Each run is a correct Opacus pipeline (20-64-2 MLP, generated data, N = 1024,
Poisson batches of expected size 64, σ = 1, C = 0.1 below the typical
per-sample norm so clipping is active) with ``attach(..., witnesses=True)``;
any PipelineMismatchError is a false alarm. The design bound is 4α per run, α
from the ledger's target (integrations/_witnesses.py reserve_for: at
(10, 10⁻⁵), 4.5·10⁻¹³), so the expected count is ~0.

Run: python benchmarks/witness_false_alarms.py            # 200 runs × 300 steps
     python benchmarks/witness_false_alarms.py --quick    # 10 runs × 50 steps
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
warnings.filterwarnings("ignore")

from test_witnesses import pipeline, run  # noqa: E402  (the test suite's pipeline)

from privguard import Ledger, PipelineMismatchError  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="10 runs of 50 steps")
    parser.add_argument("--progress", action="store_true", help="a line after every run")
    args = parser.parse_args()
    runs, steps = (10, 50) if args.quick else (args.runs, args.steps)
    torch.set_num_threads(1)
    alarms, started = [], time.perf_counter()
    for seed in range(runs):
        model, opt, loader, crit = pipeline(seed=1000 + seed, clip=0.1)
        handle = attach(opt, Ledger(epsilon=10.0, delta=1e-5), data_loader=loader, witnesses=True)
        try:
            run(model, opt, loader, crit, steps)
        except PipelineMismatchError as exc:
            alarms.append((seed, exc.witness, exc.step))
        assert handle.witnesses is not None
        if args.progress:
            print(f"  {seed + 1} runs done, {len(alarms)} false alarms "
                  f"[{time.perf_counter() - started:.0f} s]", flush=True)
    print(f"{runs} clean runs × {steps} steps (witnesses noise, clipping, sampling mean, ties and per-record counts): "
          f"{len(alarms)} false alarms {alarms or ''} "
          f"[{time.perf_counter() - started:.0f} s]")


if __name__ == "__main__":
    main()
