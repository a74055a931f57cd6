"""Subset tuning (seed 000): tune on a 10% Poisson subset, extrapolate, train the final model.

Run: python examples/tune_subset.py [--seeds 3]

Data: a generated classification problem (scikit-learn's make_classification,
12,000 examples, 20 features, 4 classes; 10,000 private training examples,
1,000 validation examples treated as public for scoring, 1,000 test) —
digits has only ~1,300 training examples, too few for a q = 0.1 subset.

Three ways to pick the DP-SGD learning rate, each with the noise σ calibrated
(never overshooting) so that the ledger's (ε = 4, δ = 1e-5) filter admits the
WHOLE procedure (its improved-conversion ε is printed; the filter's default δ
shares make it slightly below 4):
* variant 1: random-K tuning (Poisson, μ = 15) on X₁ ~ Poisson(q = 0.1),
  learning rate × (1−q)/q, final model on X ∖ X₁ (seed 000 Theorem 6);
* variant 2: the same, final model on X (Theorem 4 + composition);
* baseline: random-K tuning on the full data; the best run is the model
  (Papernot & Steinke).
Sample rate γ = 0.02 and 150 steps for every run (kept in extrapolation).
Prints test accuracy (mean over seeds), total ε, per-example gradient
evaluations and wall time; writes examples/out/tune_subset.png.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from sklearn.datasets import make_classification
from torch import nn
from torch.utils.data import TensorDataset

from _common import OUT, write_outputs
from privguard import DEFAULT_ORDERS, Ledger, RDPCurve
from privguard import mechanisms as M
from privguard.integrations.opacus import attach
from privguard.tuning import Poisson, RandomSearch, SubsetSearch
from privguard.tuning._calibration import smallest_sigma

warnings.filterwarnings("ignore")
GAMMA, STEPS, MU, Q, EPS, DELTA = 0.02, 150, 15.0, 0.1, 4.0, 1e-5
LRS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5]


def data():
    x, y = make_classification(n_samples=12_000, n_features=20, n_informative=10, n_classes=4,
                               n_clusters_per_class=2, class_sep=1.0, random_state=0)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    t = lambda a, b: (torch.tensor(a), torch.tensor(b))  # noqa: E731
    return t(x[:10_000], y[:10_000]), t(x[10_000:11_000], y[10_000:11_000]), t(x[11_000:], y[11_000:])


def train(xy, idx, lr, sigma, ledger, seed, counter, init=None):
    """DP-SGD, sample rate GAMMA, STEPS steps, charged to ``ledger``; counts gradient evaluations."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
    if init is not None:
        model.load_state_dict(init)  # Remark 8: start from the tuned model
    x, y = xy[0][idx], xy[1][idx]
    loader = DPDataLoader(TensorDataset(x, y), sample_rate=GAMMA)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(
        model.parameters(), lr=lr), data_loader=loader, noise_multiplier=sigma, max_grad_norm=1.0)
    attach(opt, ledger, sample_rate=GAMMA)
    done = 0
    while done < STEPS:
        for xb, yb in loader:
            opt.zero_grad()
            if len(xb):
                nn.functional.cross_entropy(model(xb), yb).backward()
            counter[0] += len(xb)
            opt.step()
            done += 1
            if done == STEPS:
                break
    return {k.removeprefix("_module."): v for k, v in model.state_dict().items()}


def accuracy(state, xy) -> float:
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
    model.load_state_dict(state)
    with torch.no_grad():
        return float((model(xy[0]).argmax(1) == xy[1]).float().mean())


def run_cost(sigma):
    return M.SubsampledGaussian(sigma, GAMMA, STEPS)


def searcher(method: str, sigma: float):
    tuner = RandomSearch({"lr": LRS}, Poisson(MU), cost=run_cost(sigma), progress=False)
    if method == "baseline":
        return tuner
    return SubsetSearch(tuner, Q, final_cost=run_cost(sigma),
                        variant=1 if method == "variant 1" else 2)


def plan_epsilon(method: str, sigma: float) -> float:
    """ε (improved conversion) of exactly what the method charges."""
    grid = np.array(DEFAULT_ORDERS)
    return RDPCurve(grid, searcher(method, sigma).cost(grid).rdp(grid)).epsilon(DELTA)


def affordable(method: str, sigma: float) -> bool:
    """Would a fresh ledger with budget (EPS, DELTA) admit this method's whole charge?"""
    return Ledger(epsilon=EPS, delta=DELTA).can_afford(searcher(method, sigma).cost())


def run(method: str, sigma: float, seed: int, train_xy, val_xy, test_xy) -> dict:
    counter, start = [0], time.time()
    rng = np.random.default_rng()  # model seeds: OS entropy

    def score(state):  # the validation split is treated as public
        return accuracy(state, val_xy)

    ledger = Ledger(epsilon=EPS, delta=DELTA)
    search = searcher(method, sigma)
    if method == "baseline":
        def objective(params, child):
            state = train(train_xy, np.arange(10_000), params["lr"], sigma, child,
                          int(rng.integers(1 << 30)), counter)
            return score(state), state
        result = search.run(objective, ledger)
        model = result.artifact
    else:
        def tune_obj(params, child, idx):
            state = train(train_xy, idx, params["lr"], sigma, child, int(rng.integers(1 << 30)),
                          counter)
            return score(state), state

        def final_obj(params, child, idx, tuned_state):
            return train(train_xy, idx, params["lr"], sigma, child, int(rng.integers(1 << 30)),
                         counter, init=tuned_state)

        result = search.run(tune_obj, final_obj, ledger, 10_000)
        model = result.artifact
    return {"method": method, "seed": seed, "sigma": sigma,
            "test_accuracy": accuracy(model, test_xy) if model is not None else float("nan"),
            "epsilon": plan_epsilon(method, sigma), "grad_evals": counter[0],
            "seconds": time.time() - start}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    t0 = time.time()
    train_xy, val_xy, test_xy = data()
    methods = ("variant 1", "variant 2", "baseline")
    sigmas = {m: smallest_sigma(lambda s, m=m: affordable(m, s), rtol=1e-3) for m in methods}
    rows = [run(m, sigmas[m], seed, train_xy, val_xy, test_xy)
            for m in methods for seed in range(args.seeds)]
    print(f"generated data (10,000 private training examples); q = {Q}, μ = {MU}, γ = {GAMMA}, "
          f"{STEPS} steps per run; each method calibrated to ε = {EPS:g} at δ = {DELTA:g}\n")
    print(f"{'method':10s} {'σ':>6} {'test accuracy':>17} {'ε':>6} {'grad evals':>11} {'seconds':>8}")
    summary = {}
    for m in methods:
        r = [x for x in rows if x["method"] == m]
        acc = np.array([x["test_accuracy"] for x in r])
        summary[m] = {"sigma": sigmas[m], "accuracy_mean": float(np.nanmean(acc)),
                      "accuracy_std": float(np.nanstd(acc)), "epsilon": r[0]["epsilon"],
                      "grad_evals": float(np.mean([x["grad_evals"] for x in r])),
                      "seconds": float(np.mean([x["seconds"] for x in r]))}
        s = summary[m]
        print(f"{m:10s} {s['sigma']:6.3f} {s['accuracy_mean']:8.4f} ± {s['accuracy_std']:.4f} "
              f"{s['epsilon']:6.3f} {s['grad_evals']:11.0f} {s['seconds']:8.2f}")
    base = summary["baseline"]
    for m in ("variant 1", "variant 2"):
        print(f"{m}: {base['grad_evals'] / summary[m]['grad_evals']:.1f}× fewer gradient "
              f"evaluations and {base['seconds'] / summary[m]['seconds']:.1f}× less time than the "
              "baseline")
    os.makedirs(OUT, exist_ok=True)
    png = os.path.join(OUT, "tune_subset.png")
    _plot(summary, png)
    write_outputs("tune_subset", rows, summary)
    print(f"wrote {png} and tune_subset.csv/.json ({time.time() - t0:.0f} s)")
    return summary


def _plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    for ax, key, title in zip(axes, ("accuracy_mean", "grad_evals", "seconds"),
                              ("test accuracy (same ε = 4)", "gradient evaluations",
                               "wall time (s)")):
        ax.bar(names, [summary[n][key] for n in names], color=["C0", "C1", "C2"])
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
