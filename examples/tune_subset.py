"""Subset tuning (seed 000): tune on a 10% Poisson subset, extrapolate, train the final model.

Run: python examples/tune_subset.py [--seeds 30] [--quick]

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
Every run is DP-SGD on a 20-32-4 MLP (``_fast_dpsgd.py``, the mechanism
Opacus runs, each step charged to the run's child ledger), with sample rate
γ = 0.02 and 150 steps (3 epochs of its data), kept in extrapolation.

Seed 000 §3.4 predicts the expected per-example gradient evaluations: with E
epochs per run and n examples, E·(μqn + (1−q)n) for variant 1, E·(μqn + n)
for variant 2 and E·μn for the baseline, so the baseline needs μ/(μq + 1 − q)
= 6.25× (variant 1) and μ/(μq + 1) = 6.0× (variant 2) as many. The example
counts the examples in every Poisson batch of every run and prints, over
--seeds repetitions, each method's mean (± standard error), the ratios of the
means with a 95% bootstrap interval (resampling repetitions), the same for
wall time, and test accuracy. Repetition s seeds every draw — the subset, K,
the model seeds, DP-SGD's noise — with s, and the three methods share K (the
tuners' seed argument, for experiments only: a real run draws from OS
entropy); sharing K makes the ratios less noisy, not different in
expectation. Writes examples/out/tune_subset.{png,csv,json}.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
import torch
from _common import OUT, write_outputs
from _fast_dpsgd import DPMLP, correct, poisson_batch
from _fmt import up
from sklearn.datasets import make_classification

from privguard import DEFAULT_ORDERS, Ledger, RDPCurve
from privguard import mechanisms as M
from privguard.tuning import Poisson, RandomSearch, SubsetSearch
from privguard.tuning._calibration import smallest_sigma

warnings.filterwarnings("ignore")
GAMMA, STEPS, MU, Q, EPS, DELTA = 0.02, 150, 15.0, 0.1, 4.0, 1e-5
SIZES = (20, 32, 4)
LRS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5]


def data():
    x, y = make_classification(n_samples=12_000, n_features=20, n_informative=10, n_classes=4,
                               n_clusters_per_class=2, class_sep=1.0, random_state=0)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    t = lambda a, b: (torch.tensor(a), torch.tensor(b))
    return t(x[:10_000], y[:10_000]), t(x[10_000:11_000], y[10_000:11_000]), t(x[11_000:], y[11_000:])


def train(xy, idx, lr, sigma, ledger, seed, counter, init=None):
    """DP-SGD on the examples ``idx``: Poisson rate GAMMA, STEPS steps, each charged to
    ``ledger`` before it runs; counts per-example gradient evaluations in ``counter``."""
    gen = torch.Generator().manual_seed(seed)  # the model's initialisation and noise
    rng = np.random.default_rng(seed)  # the Poisson batches
    model = DPMLP(SIZES, gen)
    if init is not None:
        model.load_state_dict(init)  # Remark 8: start from the tuned model
    x, y = xy[0][idx], xy[1][idx]
    step = M.SubsampledGaussian(sigma, GAMMA)
    for _ in range(STEPS):
        ledger.charge(step, label="DP-SGD step")
        batch = poisson_batch(len(y), GAMMA, rng)
        counter[0] += len(batch)
        model.step(x[batch], y[batch], sample_rate=GAMMA, n=len(y), sigma=sigma, clip=1.0, lr=lr,
                   generator=gen)
    return model.state_dict()


def accuracy(state, xy) -> float:
    model = DPMLP(SIZES, torch.Generator())
    model.load_state_dict(state)
    return correct(model, *xy) / len(xy[1])


def run_cost(sigma):
    return M.SubsampledGaussian(sigma, GAMMA, STEPS)


def searcher(method: str, sigma: float, seed: int | None = None):
    tuner = RandomSearch({"lr": LRS}, Poisson(MU), cost=run_cost(sigma), progress=False, seed=seed)
    if method == "baseline":
        return tuner
    return SubsetSearch(tuner, Q, final_cost=run_cost(sigma),
                        variant=1 if method == "variant 1" else 2, seed=seed)


def plan_epsilon(method: str, sigma: float) -> float:
    """ε (improved conversion) of exactly what the method charges."""
    grid = np.array(DEFAULT_ORDERS)
    return RDPCurve(grid, searcher(method, sigma).cost(grid).rdp(grid)).epsilon(DELTA)


def affordable(method: str, sigma: float) -> bool:
    """Would a fresh ledger with budget (EPS, DELTA) admit this method's whole charge?"""
    return Ledger(epsilon=EPS, delta=DELTA).can_afford(searcher(method, sigma).cost())


def run(method: str, sigma: float, seed: int, train_xy, val_xy, test_xy) -> dict:
    counter, start = [0], time.time()
    rng = np.random.default_rng([seed, 7])  # model seeds (experiment: reproducible)

    def score(state):  # the validation split is treated as public
        return accuracy(state, val_xy)

    ledger = Ledger(epsilon=EPS, delta=DELTA)
    search = searcher(method, sigma, seed)
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


def predicted_grad_evals(method: str, n: int = 10_000) -> float:
    """Seed 000 §3.4: expected per-example gradient evaluations (E epochs per run)."""
    epochs = STEPS * GAMMA
    return {"variant 1": epochs * (MU * Q * n + (1 - Q) * n),
            "variant 2": epochs * (MU * Q * n + n),
            "baseline": epochs * MU * n}[method]


def ratio_ci(base: np.ndarray, other: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """mean(base)/mean(other) and a 95% percentile bootstrap interval over paired repetitions."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(base), size=(4000, len(base)))
    boot = base[idx].mean(1) / other[idx].mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(base.mean() / other.mean()), float(lo), float(hi)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="CI: 2 repetitions")
    args = parser.parse_args(argv)
    seeds = 2 if args.quick else args.seeds
    t0 = time.time()
    train_xy, val_xy, test_xy = data()
    methods = ("variant 1", "variant 2", "baseline")
    sigmas = {m: smallest_sigma(lambda s, m=m: affordable(m, s), rtol=1e-3) for m in methods}
    rows = [run(m, sigmas[m], seed, train_xy, val_xy, test_xy)
            for seed in range(seeds) for m in methods]
    print(f"generated data (10,000 private training examples); q = {Q}, μ = {MU}, γ = {GAMMA}, "
          f"{STEPS} steps per run; each method calibrated to ε = {EPS:g} at δ = {DELTA:g}; "
          f"{seeds} repetitions (mean ± SE)\n")
    print(f"{'method':10s} {'σ':>6} {'ε':>6} {'test accuracy':>17} {'grad evals':>18} "
          f"{'predicted':>10} {'seconds':>13}")
    summary = {"seeds": seeds}
    per = {m: [x for x in rows if x["method"] == m] for m in methods}

    def mean_se(v):
        v = np.asarray(v, float)
        return float(np.nanmean(v)), float(np.nanstd(v, ddof=1) / np.sqrt(np.sum(~np.isnan(v))))

    for m in methods:
        r = per[m]
        acc, evals, secs = (mean_se([x[k] for x in r])
                            for k in ("test_accuracy", "grad_evals", "seconds"))
        summary[m] = {"sigma": sigmas[m], "epsilon": r[0]["epsilon"], "accuracy": acc,
                      "grad_evals": evals, "predicted_grad_evals": predicted_grad_evals(m),
                      "seconds": secs}
        print(f"{m:10s} {sigmas[m]:6.3f} {up(r[0]['epsilon']):>6s} {acc[0]:8.4f} ± {acc[1]:.4f} "
              f"{evals[0]:9.0f} ± {evals[1]:6.0f} {predicted_grad_evals(m):10.0f} "
              f"{secs[0]:6.2f} ± {secs[1]:.2f}")
    base_evals = np.array([x["grad_evals"] for x in per["baseline"]], float)
    base_secs = np.array([x["seconds"] for x in per["baseline"]], float)
    print()
    for m, predicted in (("variant 1", 6.25), ("variant 2", 6.0)):
        evals = ratio_ci(base_evals, np.array([x["grad_evals"] for x in per[m]], float))
        secs = ratio_ci(base_secs, np.array([x["seconds"] for x in per[m]], float))
        summary[m]["evals_ratio"] = {"measured": evals, "predicted": predicted}
        summary[m]["time_ratio"] = secs
        print(f"baseline ÷ {m}: {evals[0]:.2f}× the gradient evaluations (95% CI {evals[1]:.2f}–"
              f"{evals[2]:.2f}; §3.4 predicts {predicted:g}×), {secs[0]:.2f}× the time "
              f"({secs[1]:.2f}–{secs[2]:.2f})")
    os.makedirs(OUT, exist_ok=True)
    png = os.path.join(OUT, "tune_subset.png")
    _plot(summary, methods, png)
    write_outputs("tune_subset", rows, summary)
    print(f"wrote {png} and tune_subset.csv/.json ({time.time() - t0:.0f} s)")
    return summary


def _plot(summary: dict, names, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    for ax, key, title in zip(axes, ("accuracy", "grad_evals", "seconds"),
                              ("test accuracy (same ε = 4)", "gradient evaluations",
                               "wall time (s)")):
        ax.bar(names, [summary[n][key][0] for n in names],
               yerr=[1.96 * summary[n][key][1] for n in names], color=["C0", "C1", "C2"])
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
