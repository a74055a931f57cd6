"""What the witnesses cost: a DP-SGD step with attach(witnesses=True) against Opacus alone.

The issue's MLP (20-64-2), batch 128, one torch thread, all in one run so
the ratios compare like with like.

Run: python -m pytest benchmarks/test_bench_witnesses.py --benchmark-only \
        --benchmark-json=bench_witnesses.json
     python benchmarks/report.py bench_witnesses.json
"""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import Ledger
from privguard.integrations.opacus import attach

warnings.filterwarnings("ignore")
GROUP = "DP-SGD step, 20-64-2 MLP, batch 128, one thread (CPU)"


def dp_sgd_step(mode: str):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(4096, 20)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    engine = PrivacyEngine(accountant="rdp")  # Opacus' own accountant stays attached in all
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=128), noise_multiplier=1.0, max_grad_norm=1.0)
    if mode != "opacus":
        attach(opt, Ledger(epsilon=50.0, delta=1e-5), data_loader=loader,
               witnesses=mode == "witnesses")
    def draws():  # fresh Poisson batches (replayed ones are not Binomial draws: the
        while True:  # sampling witness rightly refuses a replay)
            yield from loader

    batches = draws()

    def step():
        xb, yb = next(batches)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()

    return step


@pytest.mark.benchmark(group=GROUP)
def test_opacus_step(benchmark):
    benchmark.pedantic(dp_sgd_step("opacus"), rounds=300, iterations=1, warmup_rounds=20)


@pytest.mark.benchmark(group=GROUP)
def test_attach_step(benchmark):
    benchmark.pedantic(dp_sgd_step("attach"), rounds=300, iterations=1, warmup_rounds=20)


@pytest.mark.benchmark(group=GROUP)
def test_attach_with_witnesses_step(benchmark):
    benchmark.pedantic(dp_sgd_step("witnesses"), rounds=300, iterations=1, warmup_rounds=20)
