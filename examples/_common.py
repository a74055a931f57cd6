"""Shared pieces of the digits examples: data, model, one DP epoch, plots and outputs.

Data: scikit-learn's ``load_digits`` (1,797 8×8 images, ships with the
package; nothing is downloaded).
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)  # small models; the machine is shared
warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
warnings.filterwarnings("ignore", message=".*Optimal order is the.*")
warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
warnings.filterwarnings("ignore", message=".*Using a non-full backward hook.*")

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def digits(seed: int = 0, public_fraction: float = 0.0):
    """(train, test[, public]) TensorDatasets; a stratified split fixed by ``seed``."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    if public_fraction:
        x_tr, x_pub, y_tr, y_pub = train_test_split(x_tr, y_tr, test_size=public_fraction,
                                                    random_state=seed, stratify=y_tr)
    out = [TensorDataset(torch.tensor(x_tr), torch.tensor(y_tr)),
           TensorDataset(torch.tensor(x_te), torch.tensor(y_te))]
    if public_fraction:
        out.append(TensorDataset(torch.tensor(x_pub), torch.tensor(y_pub)))
    return out


def opacus_rate_and_steps(n: int, batch_size: int, epochs: int) -> tuple[float, int]:
    """The sample rate and step count Opacus' make_private will use for a DataLoader
    of n examples: q = 1/len(loader) with len(loader) = ceil(n / batch_size)."""
    batches = math.ceil(n / batch_size)
    return 1.0 / batches, epochs * batches


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def make_private(model, train, batch_size, noise, lr=0.5, clip=1.0, seed=0):
    """Opacus' usual make_private on a plain SGD optimizer with Poisson sampling."""
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    engine = PrivacyEngine(accountant="rdp")  # privguard accounts in RDP too
    return engine.make_private(module=model, optimizer=opt,
                               data_loader=DataLoader(train, batch_size=batch_size),
                               noise_multiplier=noise, max_grad_norm=clip)


def train_epoch(model, optimizer, loader) -> None:
    model.train()
    for x, y in loader:
        if len(x) == 0:  # Poisson sampling can draw an empty batch
            continue
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


@torch.no_grad()
def accuracy(model, data) -> float:
    model.eval()
    x, y = data.tensors
    return float((model(x).argmax(1) == y).float().mean())


@torch.no_grad()
def correct_count(model, data) -> int:
    model.eval()
    x, y = data.tensors
    return int((model(x).argmax(1) == y).sum())


@dataclass
class EpsilonTrace:
    """ε over steps, recorded from a ledger's listener (odometer and naive)."""

    every: int = 10
    steps: list = field(default_factory=list)
    running: list = field(default_factory=list)
    naive: list = field(default_factory=list)

    def __call__(self, event) -> None:
        ledger = event.ledger
        if event.kind == "charge" and len(ledger.history) % self.every == 0:
            self.steps.append(len(ledger.history))
            self.running.append(ledger.epsilon())
            self.naive.append(ledger.nonadaptive_epsilon())


def plot_epsilon(path: str, traces: dict, target: float | None, title: str) -> None:
    """PNG of ε over charges: odometer bound, filter budget, naive (labelled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, tr) in enumerate(traces.items()):
        color = f"C{i}"
        ax.plot(tr.steps, tr.running, color=color, label=f"{name}: running ε (odometer, valid)")
        ax.plot(tr.steps, tr.naive, color=color, linestyle=":",
                label=f"{name}: naive conversion (NOT a guarantee under adaptivity)")
    if target is not None:
        ax.axhline(target, color="k", linestyle="--", label=f"filter budget ε = {target:g}")
    ax.set_xlabel("charges (noisy steps and noisy counts)")
    ax.set_ylabel("ε")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(stem: str, rows: list[dict], summary: dict) -> tuple[str, str]:
    """CSV of per-run rows and JSON of the summary, under examples/out/."""
    os.makedirs(OUT, exist_ok=True)
    csv_path, json_path = os.path.join(OUT, f"{stem}.csv"), os.path.join(OUT, f"{stem}.json")
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(json_path, "w") as fh:
        json.dump(summary, fh, indent=2)
    return csv_path, json_path

