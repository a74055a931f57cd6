"""What attach, a durable ledger and the witnesses cost on a GPU step (issues 26 and 28).

Issue 26: "On a GPU, a small model's step is a millisecond or less: a durable ledger would
double it." This times one DP-SGD step under Opacus alone and under each privguard
variant, on the device given (``--device cuda``; ``cpu`` runs the same code here):

* ``opacus``: Opacus alone (its RDP accountant, as in every variant);
* ``attach``: ``attach(optimizer, Ledger(epsilon=50, delta=1e-5))``, in memory (a target,
  as the witnesses need one: benchmarks/test_bench_witnesses.py's ledger);
* ``attach, SQLite leases``: the same ledger with ``path=...`` (leases, the default);
* ``attach, SQLite lease=1``: a durable commit per step;
* ``witnesses``: ``attach(..., witnesses=True)`` in memory.

Two models: ``small``, the issues' 20-64-2 MLP with batch 128, and ``large``, a
784-512-512-10 MLP with batch 256. Data stay on the host (a ``TensorDataset``, Opacus'
Poisson loader) and each batch is copied to the device, as in a usual training loop.

Steps are timed in blocks of ``--block`` steps ending with one device synchronisation (a
loop that reads its loss now and then, not every step): a variant that forces a host sync
at every step (the witnesses read their statistics back) pays for it here, as it would in
training. The variants' blocks alternate, in a new random order each round; the table gives
the median step time and two ratios to Opacus alone measured in the same run: of the
medians, and ``paired``, the median over rounds of each round's ratio (a load that moves
from round to round cancels in it).

Run: python benchmarks/gpu_step_cost.py [--device cuda] [--rounds 40] [--block 20]
     [--model small|large|both]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
import warnings

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import Ledger
from privguard.integrations.opacus import attach

warnings.filterwarnings("ignore")
VARIANTS = ("opacus", "attach", "attach, SQLite leases", "attach, SQLite lease=1",
            "witnesses")
MODELS = {"small": ((20, 64, 2), 128, 8192), "large": ((784, 512, 512, 10), 256, 16384)}


def _mlp(widths: tuple[int, ...]) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def make_step(variant: str, model_name: str, device: torch.device, tmp: str):
    """A closure running one DP-SGD step of ``model_name`` under ``variant``; the ledger."""
    widths, batch, n = MODELS[model_name]
    torch.manual_seed(0)
    x = torch.randn(n, widths[0])
    data = TensorDataset(x, (x[:, 0] > 0).long())
    model = _mlp(widths).to(device)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        data_loader=DataLoader(data, batch_size=batch), noise_multiplier=1.0,
        max_grad_norm=1.0, poisson_sampling=True)
    ledger = None
    if variant != "opacus":
        path = None
        if "SQLite" in variant:
            path = os.path.join(tmp, f"{model_name}-{variant.split()[-1]}.db")
        ledger = Ledger(epsilon=50.0, delta=1e-5, path=path,
                        lease=1 if "lease=1" in variant else None)
        attach(opt, ledger, data_loader=loader, witnesses=variant == "witnesses")

    def draws():  # fresh Poisson batches, without end
        while True:
            yield from loader

    batches = draws()

    def step() -> None:
        xb, yb = next(batches)
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()

    return step, ledger


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(model_name: str, device: torch.device, rounds: int, block: int, tmp: str) -> None:
    steps = {v: make_step(v, model_name, device, tmp) for v in VARIANTS}
    for step, _ in steps.values():  # warm-up: kernels, caches, the first leases
        for _ in range(block):
            step()
    _sync(device)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    for _ in range(rounds):
        random.shuffle(order)
        for v in order:
            step = steps[v][0]
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(block):
                step()
            _sync(device)
            times[v].append((time.perf_counter() - t0) / block)
    for _, ledger in steps.values():
        if ledger is not None:
            ledger.close()
    widths, batch, _ = MODELS[model_name]
    base = statistics.median(times["opacus"])
    print(f"\n{'-'.join(map(str, widths))} MLP, batch {batch}, on {_name(device)}; "
          f"{rounds} rounds of {block}-step blocks, variants interleaved")
    print("| variant | step (median) | vs Opacus (medians) | paired |\n|---|---|---|---|")
    for v in VARIANTS:
        med = statistics.median(times[v])
        paired = statistics.median(a / b for a, b in zip(times[v], times["opacus"],
                                                          strict=True))
        print(f"| {v} | {med * 1e6:,.0f} µs | {med / base:.3f}× | {paired:.3f}× |")


def _name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} torch threads)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--model", choices=[*MODELS, "both"], default="both")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (the issues' setting: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in (MODELS if args.model == "both" else [args.model]):
            run(name, device, args.rounds, args.block, tmp)


if __name__ == "__main__":
    main()
