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
    parser.add_argument("--simulate", action="store_true",
                        help="no model: the same scores on exactly Gaussian projections (what "
                             "the one-run method allows with a perfect pipeline)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.simulate:
        simulate(args)
        return
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


def simulate(args: argparse.Namespace) -> None:
    """Projections x = [drawn] + N(0, σ²) per step and canary (q = 1/16, sampling hidden),
    scored and bounded exactly as audit_opacus does; the charged ε from the Opacus run."""
    from privguard._audit._audit_scoring import (
        default_guesses,
        lower_bound_over_guesses,
        step_log_likelihood_ratio,
    )

    q, m = 1 / 16, args.canaries
    for sigma in args.sigmas:
        charged = audit_opacus(_build(noise=sigma, seed=0), steps=args.steps, canaries=10,
                               seed=0).epsilon_charged
        rng, low = np.random.default_rng(0), []
        for _ in range(args.runs):
            included = rng.random(m) < 0.5
            x = ((rng.random((args.steps, m)) < q) & included) \
                + rng.normal(0.0, sigma, (args.steps, m))
            scores = step_log_likelihood_ratio(x, sigma, q).sum(0)
            low.append(lower_bound_over_guesses(scores, included, default_guesses(m), 1e-5,
                                                0.95)[0])
        print(f"simulated σ = {sigma:g}, m = {m}, {args.steps} steps: charged ε = {charged:.2f}; "
              f"lower ε median {np.median(low):.2f} (min {min(low):.2f}, max {max(low):.2f}); "
              f"median lower/charged {np.median(low) / charged:.3f}", flush=True)


if __name__ == "__main__":
    main()
