"""One-run audit numbers (issue 28): lower/charged ε over seeded runs, correct and broken.

The pipeline of tests/test_audit.py (20-128-2 MLP, N = 1024, batch 64, C = 1,
d = 2,946 parameters); σ is chosen per row to give the charged ε shown.

Run: python benchmarks/audit_report.py [--runs 40] [--canaries 1000] [--steps 60] [--width 128]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
warnings.filterwarnings("ignore")

from test_audit import _build  # noqa: E402

from privguard.audit import audit_opacus  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=128,
                        help="hidden width (128: d = 2,946; 512: d = 11,778 ≥ 10,000 canaries)")
    parser.add_argument("--sigmas", type=float, nargs="+", default=[1.6, 1.0, 0.8])
    parser.add_argument("--variants", nargs="+", default=["correct", "noise off", "half noise"],
                        help="which of: 'correct', 'noise off', 'half noise'")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for sigma in args.sigmas:
        correct = None
        for bug in args.variants:
            started, rows = time.perf_counter(), []
            for seed in range(args.runs):
                res = audit_opacus(_build(noise=sigma, broken=bug == "noise off",
                                          half=bug == "half noise", seed=seed,
                                          width=args.width),
                                   steps=args.steps, canaries=args.canaries, seed=seed)
                rows.append((res.epsilon_lower, res.epsilon_charged))
            low = np.array([r[0] for r in rows])
            charged = rows[0][1]
            paired = ""
            if bug == "correct":
                correct = low
            elif correct is not None:  # same seeds: same data order and canaries
                paired = f"; above the correct run's in {int((low > correct).sum())}/{len(low)}"
            print(f"σ = {sigma:g}, {bug:10s}, width {args.width}, m = "
                  f"{args.canaries}, {args.steps} steps: charged ε = {charged:.2f}; lower ε "
                  f"median {np.median(low):.2f} (min {low.min():.2f}, max {low.max():.2f}); "
                  f"lower ≤ charged in {int((low <= charged).sum())}/{len(low)}; median "
                  f"lower/charged {np.median(low) / charged:.3f}{paired} "
                  f"[{time.perf_counter() - started:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
