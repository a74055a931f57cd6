"""Test accuracy on scikit-learn's digits: Poisson batches against random allocation, same (ε, δ).

Run: python benchmarks/random_allocation_digits.py
A 64-64-10 MLP trained by Opacus' DP-SGD for E = 20 epochs of t = 22 steps (expected
batch 65 of the 1,437 training images), clipping norm 1, lr 0.5, 5 seeds per method
(one torch thread).
For each method σ is the smallest (to 1e-3) for which a ledger's (2, 1e-5) filter admits
the whole run: ``SubsampledGaussian(σ, 1/t, steps=t·E)`` for Poisson (Opacus'
DPDataLoader), ``RandomAllocation(σ, t, epochs=E)`` for random allocation
(``RandomAllocationSampler`` from OS entropy). Each run is charged to such a ledger
through ``attach``, so the budget is enforced, not just computed.
Prints σ, the run's ε by its curve (``RDPCurve.epsilon``, as in
benchmarks/random_allocation_numbers.py), and the test accuracy (mean ± standard error).
"""

from __future__ import annotations

import math
import statistics
import warnings

import numpy as np

from privguard import DEFAULT_ORDERS, Ledger, RDPCurve
from privguard import mechanisms as M

EPS, DELTA, EPOCHS, T, SEEDS, LR = 2.0, 1e-5, 20, 22, 5, 0.5
ORDERS = np.array(DEFAULT_ORDERS)
warnings.filterwarnings("ignore")


def _calibrate(run_of) -> float:
    lo, hi = 0.3, 20.0  # the run's curve decreases in σ
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        if Ledger(epsilon=EPS, delta=DELTA).can_afford(run_of(mid)):
            hi = mid
        else:
            lo = mid
    return hi


def _data():
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.utils.data import TensorDataset

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    return (TensorDataset(torch.tensor(x_tr), torch.tensor(y_tr)),
            TensorDataset(torch.tensor(x_te), torch.tensor(y_te)))


def _run(method: str, sigma: float, seed: int, train, test) -> float:
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader

    from privguard.integrations import RandomAllocationSampler
    from privguard.integrations.opacus import attach

    torch.manual_seed(seed)
    n = len(train)
    if method == "poisson":
        loader = DataLoader(train, batch_size=math.ceil(n / T))  # len = T: Opacus uses q = 1/T
    else:
        loader = DataLoader(train, batch_sampler=RandomAllocationSampler(n, T))
    assert len(loader) == T
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), data_loader=loader,
        noise_multiplier=sigma, max_grad_norm=1.0, poisson_sampling=(method == "poisson"))
    ledger = Ledger(epsilon=EPS, delta=DELTA)
    with attach(opt, ledger, data_loader=loader):
        for _ in range(EPOCHS):
            for x, y in loader:
                if len(x):
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
    model.eval()
    with torch.no_grad():
        x, y = test.tensors
        acc = float((model(x).argmax(1) == y).float().mean())
    assert len(ledger.history) > 0  # charged through attach
    return acc


def main() -> None:
    import torch

    torch.set_num_threads(1)
    train, test = _data()
    runs = {
        "poisson": lambda s: M.SubsampledGaussian(s, 1 / T, steps=T * EPOCHS),
        "random allocation": lambda s: M.RandomAllocation(s, T, epochs=EPOCHS),
    }
    print(f"digits, (ε, δ) = ({EPS}, {DELTA}), {EPOCHS} epochs of t = {T} steps, {SEEDS} seeds")
    print(f"{'method':>18} {'sigma':>6} {'curve eps':>9} {'test accuracy':>16}")
    for method, run_of in runs.items():
        sigma = _calibrate(run_of)
        eps = RDPCurve(ORDERS, run_of(sigma).rdp(ORDERS)).epsilon(DELTA)
        accs = [_run(method, sigma, seed, train, test) for seed in range(SEEDS)]
        se = statistics.stdev(accs) / math.sqrt(len(accs))
        print(f"{method:>18} {sigma:>6.3f} {eps:>9.3f} {statistics.mean(accs):>9.4f} ± {se:.4f}")


if __name__ == "__main__":
    main()
