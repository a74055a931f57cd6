"""Code run in child processes by the durability tests."""

from __future__ import annotations

import os
import sys


def charge_until_refused(path: str, attempts: int, queue, epsilon: float = 2.0,
                         lease: int | None = None) -> None:
    """Open the shared ledger (a file or a URL) and try ``attempts`` charges; report how
    many were admitted. ``lease``: as for Ledger (None: leases for a file or server)."""
    from privguard import BudgetExhausted, Ledger
    from privguard import mechanisms as M

    ledger = Ledger(epsilon, 1e-5, path=path, lease=lease)
    admitted = 0
    for _ in range(attempts):
        try:
            ledger.charge(M.SubsampledGaussian(1.0, 0.01), label=f"pid {os.getpid()}")
            admitted += 1
        except BudgetExhausted:
            pass
    queue.put(admitted)


def record_applied(counter_path: str, applied: int) -> None:
    """Durably write how many updates were applied (fsync'd, then renamed into place)."""
    tmp = counter_path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(str(applied))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, counter_path)


def train_forever(path: str, counter_path: str) -> None:
    """Train a tiny Opacus model under a persistent ledger; after each applied update,
    durably write how many updates were applied so far (across restarts)."""
    import warnings

    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from privguard import BudgetExhausted, Ledger
    from privguard.integrations.opacus import attach

    warnings.filterwarnings("ignore")
    applied = int(open(counter_path).read()) if os.path.exists(counter_path) else 0
    torch.manual_seed(applied)
    x = torch.randn(1024, 8)
    model = nn.Linear(8, 2)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=16),
        noise_multiplier=1.0, max_grad_norm=1.0)
    ledger = Ledger(6.0, 1e-5, path=path)
    attach(opt, ledger, data_loader=loader)
    print("ready", flush=True)
    try:
        while True:
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()  # charged (committed) before the update
                applied += 1
                record_applied(counter_path, applied)
    except BudgetExhausted:
        print("exhausted", flush=True)


if __name__ == "__main__":
    train_forever(sys.argv[1], sys.argv[2])
