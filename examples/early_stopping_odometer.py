"""Early stopping under an odometer — seed 001 §5.2, on scikit-learn's digits.

Run: python examples/early_stopping_odometer.py [--seeds 3]

A model is pretrained without privacy on a public split (10% of the training
images, treated as public), then fine-tuned with DP-SGD on the private rest,
planned for 30 epochs. After each epoch it checks accuracy on a validation
split held out from the test images (public, so checking costs no privacy)
and stops as soon as it reaches the target accuracy or stops improving for 3
epochs. The ledger has no filter, only an odometer, whose running ε is valid
at that data-dependent stopping time.

Prints, per seed, the stopping epoch, test accuracy, the odometer's ε at the
stop and the ε the full planned run would have cost (what you would report
without an odometer); writes examples/out/early_stopping_odometer.{png,csv,json}.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _common import (
    OUT,
    EpsilonTrace,
    accuracy,
    digits,
    make_private,
    mlp,
    plot_epsilon,
    train_epoch,
    write_outputs,
)
from privguard import Ledger, RDPCurve
from privguard import mechanisms as M
from privguard.integrations.opacus import attach

BATCH, SIGMA, PLANNED_EPOCHS, PATIENCE = 64, 1.0, 30, 3


def pretrain(model, public, epochs=30, seed=0):
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(public, batch_size=32, shuffle=True)
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return model


def run(seed: int, target: float, delta: float):
    private, test, public = digits(seed, public_fraction=0.1)
    x, y = test.tensors
    half = len(y) // 2
    val, test = TensorDataset(x[:half], y[:half]), TensorDataset(x[half:], y[half:])
    model = pretrain(mlp(), public, seed=seed)
    start_acc = accuracy(model, test)
    model, opt, loader = make_private(model, private, BATCH, SIGMA, lr=0.2, seed=seed)
    ledger = Ledger(delta=delta)  # report only: an odometer, no budget
    trace = EpsilonTrace(every=5)
    ledger.add_listener(trace)
    attach(opt, ledger, data_loader=loader)
    best, since_best, stop_reason = -1.0, 0, "planned epochs done"
    for epoch in range(1, PLANNED_EPOCHS + 1):
        train_epoch(model, opt, loader)
        acc = accuracy(model, val)
        if acc >= target:
            stop_reason = f"validation accuracy {acc:.3f} >= target"
            break
        best, since_best = (acc, 0) if acc > best + 1e-9 else (best, since_best + 1)
        if since_best >= PATIENCE:
            stop_reason = f"no improvement for {PATIENCE} epochs"
            break
    planned = M.SubsampledGaussian(SIGMA, loader.sample_rate, steps=PLANNED_EPOCHS * len(loader))
    planned_epsilon = RDPCurve(ledger.orders, planned.rdp(ledger.orders)).epsilon(delta)
    return {"seed": seed, "stop_epoch": epoch, "stop_reason": stop_reason,
            "pretrained_test_accuracy": start_acc, "test_accuracy": accuracy(model, test),
            "odometer_epsilon_at_stop": ledger.epsilon(),
            "planned_run_epsilon": planned_epsilon, "delta": delta}, trace, planned_epsilon


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args(argv)
    start = time.time()
    rows, trace0, planned0 = [], None, None
    print(f"digits, MLP pretrained on a public split, DP fine-tuning (σ={SIGMA}, batch {BATCH}), "
          f"planned {PLANNED_EPOCHS} epochs, δ={args.delta:g}\n")
    print(f"{'seed':>4} {'stop':>5} {'pretrained':>10} {'test acc':>9} {'ε at stop (odometer)':>21} "
          f"{'ε of full plan':>15}  reason")
    for seed in range(args.seeds):
        row, trace, planned = run(seed, args.target, args.delta)
        rows.append(row)
        trace0, planned0 = (trace, planned) if trace0 is None else (trace0, planned0)
        print(f"{seed:4d} {row['stop_epoch']:5d} {row['pretrained_test_accuracy']:10.4f} "
              f"{row['test_accuracy']:9.4f} "
              f"{row['odometer_epsilon_at_stop']:21.3f} {row['planned_run_epsilon']:15.3f}  "
              f"{row['stop_reason']}")
    summary = {
        "test_accuracy_mean": float(np.mean([r["test_accuracy"] for r in rows])),
        "stop_epoch_mean": float(np.mean([r["stop_epoch"] for r in rows])),
        "odometer_epsilon_mean": float(np.mean([r["odometer_epsilon_at_stop"] for r in rows])),
        "planned_run_epsilon": rows[0]["planned_run_epsilon"], "delta": args.delta}
    print(f"\nmean: stop at epoch {summary['stop_epoch_mean']:.1f}, test accuracy "
          f"{summary['test_accuracy_mean']:.4f}, odometer ε {summary['odometer_epsilon_mean']:.3f} "
          f"vs {summary['planned_run_epsilon']:.3f} for the full plan.")
    print("The odometer's ε is valid at a stopping time chosen from the results; the plan's ε "
          "is what a\nnon-adaptive accountant lets you report only if you commit to all "
          f"{PLANNED_EPOCHS} epochs in advance.")
    png = os.path.join(OUT, "early_stopping_odometer.png")
    write_outputs("early_stopping_odometer", rows, summary)
    plot_epsilon(png, {"fine-tuning": trace0}, None,
                 f"early stopping under an odometer (seed 0); full plan ε = {planned0:.2f}")
    print(f"wrote {png} and early_stopping_odometer.csv/.json ({time.time() - start:.0f} s)")
    return summary


if __name__ == "__main__":
    main()
