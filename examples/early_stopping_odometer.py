"""Early stopping under an odometer — seed 001 §5.2, on scikit-learn's digits.

Run: python examples/early_stopping_odometer.py [--seeds 5] [--quick]

A model is pretrained without privacy on a public split (10% of the training
images, treated as public), then fine-tuned with DP-SGD (Opacus, σ = 1, batch
64) on the private rest, planned for 50 epochs as in the paper. After each
epoch it checks accuracy on a validation split held out from the test images
(public, so checking costs no privacy) and stops once it has not improved
for 3 epochs (or at the 50th). The released model is the one of the best
epoch; the privacy cost is that of every epoch trained, up to the stop.

The ledger has no filter, only the odometer (the default mixture), with the
run's plan declared before the first step —
``Plan(SubsampledGaussian(1, q), steps=50 epochs, every=1 epoch)`` — which
fixes its weights. Its running ε is valid at the data-dependent stop
(docs/theory.md §3), so the ε to report is ``ledger.guarantee()`` at the stop.

Prints, per seed: the best and stopping epochs, test accuracy, the ε the
odometer reports at the stop, the odometer's ε at the best epoch (what
stopping exactly there would have cost, which needs hindsight), and two
full-run numbers: the non-adaptive RDP ε of all 50 epochs (what you report
without an odometer, having committed to the whole plan) and the odometer's
ε after 50 epochs. Means ± standard errors over the seeds; writes
examples/out/early_stopping_odometer.{png,csv,json}. Seeded (seeds 0, 1, …)
so that the table reproduces; a real run must not seed its noise (Opacus:
secure_mode=True).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
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
from _fmt import up
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import Ledger, Plan, RDPCurve
from privguard import mechanisms as M
from privguard.integrations.opacus import attach

BATCH, SIGMA, PLANNED_EPOCHS, PATIENCE = 64, 1.0, 50, 3


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


def run(seed: int, delta: float, planned_epochs: int):
    private, test, public = digits(seed, public_fraction=0.1)
    x, y = test.tensors
    half = len(y) // 2
    val, test = TensorDataset(x[:half], y[:half]), TensorDataset(x[half:], y[half:])
    torch.manual_seed(seed)  # the initialisation too, so the table reproduces
    model = pretrain(mlp(), public, seed=seed)
    start_acc = accuracy(model, test)
    model, opt, loader = make_private(model, private, BATCH, SIGMA, lr=0.2, seed=seed)
    q, per_epoch = loader.sample_rate, len(loader)
    step = M.SubsampledGaussian(SIGMA, q)
    plan = Plan(step, steps=planned_epochs * per_epoch, every=per_epoch)
    ledger = Ledger(delta=delta, plan=plan)  # report only: the odometer, no budget
    trace = EpsilonTrace(every=5)
    ledger.add_listener(trace)
    attach(opt, ledger, data_loader=loader)
    best, best_epoch, best_state, per_epoch_eps = -1.0, 0, None, []
    for epoch in range(1, planned_epochs + 1):
        train_epoch(model, opt, loader)
        per_epoch_eps.append(ledger.epsilon())
        acc = accuracy(model, val)
        if acc > best + 1e-9:
            best, best_epoch = acc, epoch
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        if epoch - best_epoch >= PATIENCE:
            break
    stop_guarantee = ledger.guarantee()  # the one statement to report, read at the stop
    model.load_state_dict(best_state)  # release the best epoch's model
    full = M.SubsampledGaussian(SIGMA, q, steps=planned_epochs * per_epoch)
    full_nonadaptive = RDPCurve(ledger.orders, full.rdp(ledger.orders)).epsilon(delta)
    full_ledger = Ledger(delta=delta, plan=plan)  # the same odometer, run to the end of the plan
    full_ledger.charge(full)
    return {"seed": seed, "best_epoch": best_epoch, "stop_epoch": epoch,
            "pretrained_test_accuracy": start_acc, "test_accuracy": accuracy(model, test),
            "odometer_epsilon_at_stop": stop_guarantee.epsilon, "guarantee": stop_guarantee.kind,
            "odometer_epsilon_at_best": per_epoch_eps[best_epoch - 1],
            "nonadaptive_epsilon_at_stop": ledger.nonadaptive_epsilon(),
            "full_run_nonadaptive_epsilon": full_nonadaptive,
            "full_run_odometer_epsilon": full_ledger.epsilon(), "delta": delta}, trace


def _mean_se(rows: list[dict], key: str) -> tuple[float, float]:
    v = np.array([r[key] for r in rows], float)
    return float(v.mean()), (float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan"))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--quick", action="store_true", help="CI: 1 seed, 10 planned epochs")
    args = parser.parse_args(argv)
    seeds, planned = (1, 10) if args.quick else (args.seeds, PLANNED_EPOCHS)
    start = time.time()
    rows, trace0 = [], None
    print(f"digits, MLP pretrained on a public split, DP fine-tuning (σ={SIGMA}, batch {BATCH}), "
          f"planned {planned} epochs, patience {PATIENCE}, δ={args.delta:g}; mixture odometer "
          f"with the plan declared\n")
    print(f"{'seed':>4} {'best':>4} {'stop':>4} {'pretrained':>10} {'test acc':>8} "
          f"{'ε at stop':>9} {'ε at best':>9} {'full: non-adaptive':>18} {'full: odometer':>14}")
    for seed in range(seeds):
        row, trace = run(seed, args.delta, planned)
        rows.append(row)
        trace0 = trace0 or trace
        print(f"{seed:4d} {row['best_epoch']:4d} {row['stop_epoch']:4d} "
              f"{row['pretrained_test_accuracy']:10.4f} {row['test_accuracy']:8.4f} "
              f"{up(row['odometer_epsilon_at_stop']):>9s} {up(row['odometer_epsilon_at_best']):>9s} "
              f"{up(row['full_run_nonadaptive_epsilon']):>18s} {up(row['full_run_odometer_epsilon']):>14s}",
              flush=True)
    summary = {"seeds": seeds, "planned_epochs": planned, "delta": args.delta}
    for key in ("best_epoch", "stop_epoch", "test_accuracy", "pretrained_test_accuracy",
                "odometer_epsilon_at_stop", "odometer_epsilon_at_best"):
        summary[key] = _mean_se(rows, key)
    summary["full_run_nonadaptive_epsilon"] = rows[0]["full_run_nonadaptive_epsilon"]
    summary["full_run_odometer_epsilon"] = rows[0]["full_run_odometer_epsilon"]
    ratio = np.array([r["odometer_epsilon_at_stop"] / r["full_run_nonadaptive_epsilon"]
                      for r in rows])
    summary["stop_over_full_nonadaptive"] = [float(ratio.mean()), float(ratio.min()),
                                             float(ratio.max())]
    m = {k: summary[k] for k in ("stop_epoch", "odometer_epsilon_at_stop", "test_accuracy")}
    print(f"\nmean ± SE over {seeds} seed(s): stop at epoch {m['stop_epoch'][0]:.1f} ± "
          f"{m['stop_epoch'][1]:.1f}, test accuracy {m['test_accuracy'][0]:.4f} ± "
          f"{m['test_accuracy'][1]:.4f}, reported ε {m['odometer_epsilon_at_stop'][0]:.3f} ± "
          f"{m['odometer_epsilon_at_stop'][1]:.3f} (δ = {args.delta:g})")
    print(f"the full {planned}-epoch run: ε = {up(summary['full_run_nonadaptive_epsilon'])} "
          f"(non-adaptive RDP, valid only if all {planned} epochs are committed to in advance), "
          f"{up(summary['full_run_odometer_epsilon'])} (odometer)")
    print(f"reported ε at the stop ÷ the full run's non-adaptive ε: mean {ratio.mean():.3f} "
          f"(min {ratio.min():.3f}, max {ratio.max():.3f})")
    png = os.path.join(OUT, "early_stopping_odometer.png")
    write_outputs("early_stopping_odometer", rows, summary)
    plot_epsilon(png, {"fine-tuning": trace0}, None,
                 f"early stopping under an odometer (seed 0); full plan ε = "
                 f"{up(summary['full_run_nonadaptive_epsilon'], 2)}")
    print(f"wrote {png} and early_stopping_odometer.csv/.json ({time.time() - start:.0f} s)")
    return summary


if __name__ == "__main__":
    main()
