"""What attach adds to one ``next()`` of a Poisson DPDataLoader's iterator (issue 26, task hk4).

attach swaps the loader's class (``MicroBatchCounter``: counts each batch the loop gets)
and its batch sampler's (``DrawnRates``: records the rate of each draw under a lock); a
loop that draws its batches pays both on every batch. Two loaders made alike (the
issue-26 data: 8192 rows of 20 features, batch 128, Opacus' Poisson sampling), one with
attach, are drawn from in turn (interleaved), ``--rounds`` rounds of ``--draws`` batches
each; the table gives each round's median ``next()`` time and attach's extra. No step is
taken: this is the per-draw cost alone, with warm caches (inside a training loop the
same code runs colder).

Run: python benchmarks/attach_per_draw.py [--draws 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _loader(attached: bool) -> tuple[Any, Any]:
    """A Poisson DPDataLoader of the issue-26 data (with attach, and its ledger, or not)."""
    torch.manual_seed(0)
    x = torch.randn(8192, 20)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, opt, loader = PrivacyEngine(accountant="rdp").make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=128), noise_multiplier=1.0,
            max_grad_norm=1.0, poisson_sampling=True)
        ledger = None
        if attached:
            from privguard import Ledger
            from privguard.integrations.opacus import attach

            ledger = Ledger(delta=1e-5)
            attach(opt, ledger, data_loader=loader)
    return loader, ledger


def _draws(loader: Any, n: int) -> list[int]:
    """The time (ns) of each of ``n`` ``next()`` calls, epoch after epoch."""
    spent: list[int] = []
    it = iter(loader)
    clock = time.perf_counter_ns
    while len(spent) < n:
        t0 = clock()
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            continue
        spent.append(clock() - t0)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain, _ = _loader(False)
    attached, ledger = _loader(True)
    _draws(plain, 200), _draws(attached, 200)  # warm-up
    print(f"next() of a Poisson DPDataLoader (batch 128 of 8192), {args.draws} draws a round;"
          " median µs")
    print("| round | plain | attached | attach's extra |\n|---|---|---|---|")
    extras = []
    for r in range(args.rounds):
        a = statistics.median(_draws(plain, args.draws)) / 1e3
        b = statistics.median(_draws(attached, args.draws)) / 1e3
        extras.append(b - a)
        print(f"| {r + 1} | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    print(f"median extra over rounds: {statistics.median(extras):+.2f} µs")
    if ledger is not None:
        ledger.close()


if __name__ == "__main__":
    main()
