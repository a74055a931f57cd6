"""The main job (for now): a ledger under a simulated DP-SGD run.

Run: bash scripts/demo.sh   (or: python examples/simulated_dp_sgd.py)

No model is trained: each "step" is charged exactly as a DP-SGD step on
60,000 examples with batch size 256 (Poisson rate q = 256/60000) would be.
The run is adaptive: after 10 epochs it lowers the noise from σ = 1.1 to
σ = 0.9, a choice a real policy would make from what it has seen. The
ledger enforces a hard (ε = 3, δ = 1e-5) budget and reports, each epoch,
the running ε that stays valid under that adaptivity and at any stopping
time (the odometer), next to the naive conversion of the spent curve, which
is NOT a guarantee under adaptivity and is shown only for comparison.
"""

from __future__ import annotations

import argparse

from _fmt import up

from privguard import BudgetExhausted, Ledger
from privguard import mechanisms as M


def main(argv: list[str] | None = None) -> Ledger:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args(argv)

    n, batch = 60_000, 256
    q = batch / n
    steps_per_epoch = n // batch
    ledger = Ledger(epsilon=args.epsilon, delta=args.delta,
                    plan=M.SubsampledGaussian(1.1, q))
    print(f"{ledger}\nq = {q:.5f}, {steps_per_epoch} steps per epoch\n")
    print(f"{'epoch':>5} {'sigma':>5} {'steps':>6} {'running eps (valid)':>20} "
          f"{'naive eps (NOT a guarantee)':>28}")
    steps = 0
    try:
        for epoch in range(1, args.epochs + 1):
            sigma = 1.1 if epoch <= 10 else 0.9  # an adaptive policy's choice
            step = M.SubsampledGaussian(noise_multiplier=sigma, sample_rate=q)
            for _ in range(steps_per_epoch):
                ledger.charge(step, label=f"epoch {epoch}")
                steps += 1
            if epoch % 5 == 0 or epoch == 1:
                print(f"{epoch:5d} {sigma:5.1f} {steps:6d} {up(ledger.epsilon()):>20s} "
                      f"{ledger.nonadaptive_epsilon():28.3f}")
    except BudgetExhausted as exc:
        print(f"{epoch:5d} {sigma:5.1f} {steps:6d} {up(ledger.epsilon()):>20s} "
              f"{ledger.nonadaptive_epsilon():28.3f}")
        print(f"\nstopped in epoch {epoch} after {steps} steps: the filter refused the next step "
              f"before it ran.\n  {exc.remaining}")
    print(f"\nReport: {ledger.guarantee()} ({len(ledger.history)} charges).\nThe running ε "
          "column is the odometer's bound, valid at any stopping time; the naive\ncolumn is "
          "for comparison only (docs/theory.md §3–4).")
    return ledger


if __name__ == "__main__":
    main()
