"""Opacus integration cost against Opacus alone, same machine, same run.

Run: python -m pytest benchmarks/test_bench_integration.py --benchmark-only \
        --benchmark-json=bench_integration.json
     python benchmarks/report.py bench_integration.json
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import Ledger
from privguard import mechanisms as M
from privguard.integrations.opacus import attach

warnings.filterwarnings("ignore")
DELTA = 1e-5
Q = 64 / 4096


def _model(kind: str) -> nn.Module:
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(16 * 16, 64), nn.ReLU(), nn.Linear(64, 2))
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 12 * 12, 2))


def dp_sgd_step(with_ledger: bool, kind: str = "cnn"):
    torch.manual_seed(0)
    x = torch.randn(4096, 1, 16, 16)
    data = TensorDataset(x, (x.mean((1, 2, 3)) > 0).long())
    model = _model(kind)
    engine = PrivacyEngine(accountant="rdp")  # Opacus' own accountant stays attached in both
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=64), noise_multiplier=1.0, max_grad_norm=1.0)
    if with_ledger:
        attach(opt, Ledger(epsilon=1e6, delta=DELTA), data_loader=loader)
    xb, yb = x[:64], data.tensors[1][:64]

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()

    return step


@pytest.mark.benchmark(group="DP-SGD step, small CNN, batch 64 (CPU)")
def test_opacus_step_with_rdp_accountant(benchmark):
    benchmark.pedantic(dp_sgd_step(False), rounds=200, iterations=1, warmup_rounds=10)


@pytest.mark.benchmark(group="DP-SGD step, small CNN, batch 64 (CPU)")
def test_privguard_attached_step(benchmark):
    benchmark.pedantic(dp_sgd_step(True), rounds=200, iterations=1, warmup_rounds=10)


@pytest.mark.benchmark(group="DP-SGD step, small MLP, batch 64 (CPU)")
def test_opacus_mlp_step_with_rdp_accountant(benchmark):
    benchmark.pedantic(dp_sgd_step(False, "mlp"), rounds=500, iterations=1, warmup_rounds=20)


@pytest.mark.benchmark(group="DP-SGD step, small MLP, batch 64 (CPU)")
def test_privguard_attached_mlp_step(benchmark):
    benchmark.pedantic(dp_sgd_step(True, "mlp"), rounds=500, iterations=1, warmup_rounds=20)


def _histories(adaptive: bool, steps: int = 2000):
    if not adaptive:
        return [(1.0, Q, steps)]
    sigmas = np.linspace(0.8, 2.0, 50)
    return [(float(s), Q, steps // 50) for s in sigmas]


def _ledger(hist):
    ledger = Ledger(delta=DELTA)
    for s, q, n in hist:
        for _ in range(n):
            ledger.charge(M.SubsampledGaussian(s, q))
    return ledger


def _accountant(cls, hist):
    acc = cls()
    acc.history = list(hist)
    return acc


for _adaptive in (False, True):
    _name = "adaptive σ (50 values)" if _adaptive else "fixed σ"
    _group = f"running-ε query after 2,000 steps, {_name}"

    @pytest.mark.benchmark(group=_group)
    def _privguard(benchmark, _a=_adaptive):
        benchmark(_ledger(_histories(_a)).epsilon)

    @pytest.mark.benchmark(group=_group)
    def _opacus_rdp(benchmark, _a=_adaptive):
        benchmark.pedantic(_accountant(RDPAccountant, _histories(_a)).get_epsilon, args=(DELTA,),
                           rounds=5, iterations=1)

    @pytest.mark.benchmark(group=_group)
    def _opacus_prv(benchmark, _a=_adaptive):
        benchmark.pedantic(_accountant(PRVAccountant, _histories(_a)).get_epsilon, args=(DELTA,),
                           rounds=3, iterations=1)

    _suffix = "adaptive" if _adaptive else "fixed"
    globals()[f"test_privguard_epsilon_{_suffix}"] = _privguard
    globals()[f"test_opacus_rdp_get_epsilon_{_suffix}"] = _opacus_rdp
    globals()[f"test_opacus_prv_get_epsilon_{_suffix}"] = _opacus_prv


def interleaved_ratio(kind: str = "mlp", rounds: int = 400) -> tuple[float, float, float]:
    """Median step time with the ledger attached over Opacus alone, the two steps
    alternated in one loop so that load on a shared machine hits both alike.

    Returns (median Opacus µs, median attached µs, ratio).
    """
    import time

    torch.set_num_threads(1)
    plain, attached = dp_sgd_step(False, kind), dp_sgd_step(True, kind)
    for _ in range(20):
        plain(), attached()
    a, b = [], []
    for i in range(rounds):
        for fn, out in ((plain, a), (attached, b)) if i % 2 else ((attached, b), (plain, a)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    ma, mb = float(np.median(a)) * 1e6, float(np.median(b)) * 1e6
    return ma, mb, mb / ma


if __name__ == "__main__":  # python benchmarks/test_bench_integration.py
    for _kind in ("mlp", "cnn"):
        _a, _b, _r = interleaved_ratio(_kind)
        print(f"small {_kind.upper()}, batch 64, 1 thread: Opacus {_a:.1f} µs, attached "
              f"{_b:.1f} µs per step (medians, interleaved): {_r:.3f}×")
