"""attach's step hook per step in a loop that iterates its Poisson loader.

``attach_overhead.py`` steps on one fixed batch, so the loader never draws and the
per-draw record of the rates (``integrations/_drawn_rates.py``) stays empty. Here the
20-64-2 MLP (batch 128, one thread) trains on the loader's batches for ``--steps`` steps
(the default fills that record), and the hook is timed as attach's own; the table gives
the median and mean of the last 2,000 steps.

Run: python benchmarks/attach_hook_in_loop.py [--steps 5000]
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
from attach_overhead import hook_timed  # benchmarks/ (the script's folder)
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import Ledger
from privguard.integrations.opacus import attach


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(8192, 20)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=128), noise_multiplier=1.0,
        max_grad_norm=1.0)
    spent: list[int] = []
    with hook_timed(spent):
        attach(opt, Ledger(delta=1e-5), data_loader=loader)
        while len(spent) < args.steps:
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
    last = spent[-2000:]
    print(f"attach's step hook over {len(spent)} steps, the last {len(last)}: "
          f"median {statistics.median(last) / 1e3:.1f} µs, "
          f"mean {statistics.mean(last) / 1e3:.1f} µs")


if __name__ == "__main__":
    main()
