"""Propose-test tuning with doubling steps (seed 004, Ding & Wu 2022), charged round by round.

Run: python examples/propose_test.py [--seeds 1000] [--quick]

1. The paper's simulation: 100 candidates with utilities uniform on (0, 1),
   k = 10, ε₀ = 0.1, over 1,000 seeds: the distribution of the number of
   rounds, and how it grows with (u* − u₀)/g (varying g) — close to
   logarithmic, as in the paper's Figure 2. Writes examples/out/propose_test.png.
2. A real run on scikit-learn's digits: candidates are learning rates; each is
   trained WITHOUT privacy on each of k = 10 random disjoint partitions of the
   private training set (the paper allows it: the utility's sensitivity is
   1/k either way); the loop charges each round (pure ε₀-DP) to a ledger;
   then the selected learning rate is used for DP-SGD training through the
   Opacus integration on the same ledger (ε₀ = 0.5 here: at 0.1 the noise swamps
   differences of a few percent). Prints the selection, accuracy,
   rounds and total ε, with the paper's worst-case bound for comparison.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from _common import OUT, accuracy, digits, make_private, mlp, train_epoch, write_outputs
from _fmt import up
from torch import nn

from privguard import BudgetExhausted, Ledger
from privguard.integrations.opacus import attach
from privguard.tuning import ProposeTest

DELTA = 1e-5
EPS0_REAL = 0.5


def simulate(seeds: int) -> dict:
    rounds, growth = [], {}
    for seed in range(seeds):
        u = np.random.default_rng(seed).uniform(0, 1, 100)
        tuner = ProposeTest([{"i": i} for i in range(100)], epsilon0=0.1, partitions=10,
                            granularity=0.01, seed=seed, progress=False)
        rounds.append(tuner.select(u, Ledger(delta=DELTA)).rounds)
    for g in (0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001):
        r = []
        for seed in range(max(seeds // 5, 50)):
            u = np.random.default_rng(seed).uniform(0, 1, 100)
            tuner = ProposeTest([{"i": i} for i in range(100)], epsilon0=0.1, partitions=10,
                                granularity=g, seed=10_000 + seed, progress=False)
            r.append(tuner.select(u, Ledger(delta=DELTA)).rounds)
            ratio = (u.max() - 0.0) / g
        growth[g] = (ratio, float(np.mean(r)), float(np.percentile(r, 99)))
    return {"rounds": np.array(rounds), "growth": growth}


def plot(sim: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    r = sim["rounds"]
    a.hist(r, bins=np.arange(r.min(), r.max() + 2) - 0.5, color="C0")
    a.set_xlabel("rounds (each charged as pure ε₀-DP)")
    a.set_ylabel(f"seeds (of {r.size})")
    a.set_title("100 candidates, k = 10, ε₀ = 0.1, g = 0.01")
    xs = [v[0] for v in sim["growth"].values()]
    b.semilogx(xs, [v[1] for v in sim["growth"].values()], "o-", label="mean rounds")
    b.semilogx(xs, [v[2] for v in sim["growth"].values()], "s--", label="99th percentile")
    b.set_xlabel("(u* − u₀)/g")
    b.set_ylabel("rounds")
    b.set_title("near-logarithmic growth (seed 004, Fig. 2)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def real_run(epsilon: float) -> dict:
    train, test = digits(0)
    x, y = test.tensors
    half = len(y) // 2
    val_x, val_y, test_x, test_y = x[:half], y[:half], x[half:], y[half:]
    tx, ty = train.tensors

    def objective(params: dict, indices: np.ndarray) -> float:
        """Train WITHOUT privacy on one partition; validation accuracy in [0, 1]."""
        torch.manual_seed(0)
        model = nn.Linear(64, 10)
        opt = torch.optim.SGD(model.parameters(), lr=params["lr"])
        xi, yi = tx[indices], ty[indices]
        for _ in range(60):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xi), yi).backward()
            opt.step()
        with torch.no_grad():
            return float((model(val_x).argmax(1) == val_y).float().mean())

    # ε₀ = 0.5 here: at the simulation's ε₀ = 0.1 the candidate noise (scale 4/(kε₀) = 4)
    # swamps utility differences of a few percent and the selection is nearly arbitrary.
    tuner = ProposeTest({"lr": [0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0]}, epsilon0=EPS0_REAL,
                        partitions=10, granularity=0.01)
    ledger = Ledger(epsilon=epsilon, delta=DELTA)
    result = tuner.run(objective, ledger, n_examples=len(ty))
    tuning_eps = ledger.epsilon()
    lr = result.params["lr"] if result.selected else 0.1
    model, opt, loader = make_private(mlp(), train, 64, 1.0, lr=lr)
    attach(opt, ledger, data_loader=loader, label="final DP-SGD")
    epochs = 0
    try:
        for _ in range(20):
            train_epoch(model, opt, loader)
            epochs += 1
    except BudgetExhausted:
        pass
    return {"selected_lr": lr, "rounds": result.rounds, "refused": result.stopped_by_refusal,
            "tuning_running_epsilon": tuning_eps,
            "worst_case_tuning_epsilon": tuner.worst_case_epsilon(DELTA),
            "final_epochs": epochs,
            "test_accuracy": accuracy(model, torch.utils.data.TensorDataset(test_x, test_y)),
            "total_epsilon": ledger.guarantee().epsilon, "delta": DELTA}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--epsilon", type=float, default=12.0)
    parser.add_argument("--quick", action="store_true", help="CI: 100 simulation seeds")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds = 100
    start = time.time()
    sim = simulate(args.seeds)
    r = sim["rounds"]
    print(f"1. simulation ({args.seeds} seeds): rounds mean {r.mean():.2f}, median "
          f"{np.median(r):.0f}, 99th percentile {np.percentile(r, 99):.0f}, max {r.max()} "
          f"(worst case {ProposeTest([{}], epsilon0=0.1, partitions=10).worst_case_rounds()}); "
          "every seed terminated")
    print(f"   {'(u*-u0)/g':>10} {'mean rounds':>12} {'99th pct':>9}")
    for g, (ratio, mean, p99) in sim["growth"].items():
        print(f"   {ratio:10.1f} {mean:12.2f} {p99:9.1f}")
    os.makedirs(OUT, exist_ok=True)
    png = os.path.join(OUT, "propose_test.png")
    plot(sim, png)
    real = real_run(args.epsilon)
    print(f"\n2. digits (ε₀ = {EPS0_REAL}, k = 10, g = 0.01): selected lr = {real['selected_lr']} "
          f"after {real['rounds']} rounds "
          f"(running ε after tuning {up(real['tuning_running_epsilon'])}; the paper's "
          f"worst-case bound for the tuning alone: {up(real['worst_case_tuning_epsilon'])}, rounded up)")
    print(f"   final DP-SGD: {real['final_epochs']} epochs, test accuracy "
          f"{real['test_accuracy']:.4f}; the filter's target, which it guarantees for tuning "
          f"and training together: ε = {up(real['total_epsilon'])} at δ = {DELTA:g}")
    summary = {"simulation": {"seeds": args.seeds, "mean_rounds": float(r.mean()),
                              "max_rounds": int(r.max()),
                              "growth": {str(g): v for g, v in sim["growth"].items()}},
               "digits": real}
    write_outputs("propose_test", [{"seed": i, "rounds": int(x)} for i, x in enumerate(r)], summary)
    print(f"wrote {png} and propose_test.csv/.json ({time.time() - start:.0f} s)")
    return summary


if __name__ == "__main__":
    main()
