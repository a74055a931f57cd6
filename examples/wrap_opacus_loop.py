"""Put a privguard ledger under an existing Opacus training loop: two added lines,
a checkpoint and a resumed run that keeps the spent budget.

Run: python examples/wrap_opacus_loop.py [--quick]
"""

import argparse
import os
import tempfile

import torch
from _fmt import up
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import BudgetExhausted, Ledger
from privguard.integrations.opacus import attach


def make_private(data):
    """The user's Opacus setup, with Opacus' default accountant (PRV), as most users have it."""
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.2),
        data_loader=DataLoader(data, batch_size=128), noise_multiplier=1.5, max_grad_norm=1.0)
    return engine, model, optimizer, loader


def train(model, optimizer, loader, epochs, engine):
    for epoch in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()         # charged here; refused before the update if over budget
        eps = engine.get_epsilon(1e-5)  # the ledger's running ε (odometer)
        print(f"epoch {epoch}: ε = {up(eps)} (the ledger's running ε)")


def main(argv=None) -> Ledger:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="CI: 1024 examples instead of 2048 (sample rate 1/8, not 1/16: "
                             "the same budget is spent in fewer, larger steps)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    x = torch.randn(1024 if args.quick else 2048, 20)
    data = TensorDataset(x, (x[:, :2].sum(1) > 0).long())

    # ---- first run: two epochs, then a checkpoint
    engine, model, optimizer, loader = make_private(data)
    ledger = Ledger(epsilon=3.0, delta=1e-5)                               # added line 1
    attach(optimizer, ledger, data_loader=loader, privacy_engine=engine)   # added line 2
    train(model, optimizer, loader, 2, engine)
    checkpoint = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")
    engine.save_checkpoint(path=checkpoint, module=model, optimizer=optimizer)  # ledger included
    print(f"checkpoint after {len(ledger.history)} steps")

    # ---- resumed run (a new process would start here): Opacus' usual order
    engine, model, optimizer, loader = make_private(data)
    ckpt = engine.load_checkpoint(path=checkpoint, module=model, optimizer=optimizer)
    ledger = Ledger(epsilon=3.0, delta=1e-5)  # in memory: its state comes from the checkpoint
    attach(optimizer, ledger, data_loader=loader, privacy_engine=engine, resume=ckpt)
    print(f"resumed with {len(ledger.history)} steps already charged")
    try:
        train(model, optimizer, loader, 100, engine)
    except BudgetExhausted as exc:
        print(f"stopped: {exc.remaining}")

    steps = sum(n for _, _, n in engine.accountant.history)  # Opacus' own record, kept too
    rdp = RDPAccountant()
    rdp.history = list(engine.accountant.history)
    print(f"{len(ledger.history)} steps charged ({steps} recorded by Opacus); "
          f"report: {ledger.guarantee()}; running ε (odometer) {up(ledger.epsilon())}")
    # neither Opacus number is valid under adaptive choices; compare like with like:
    # the ledger's non-adaptive RDP conversion with Opacus' RDP accountant
    print(f"the same steps as if fixed in advance: ledger.nonadaptive_epsilon() = "
          f"{up(ledger.nonadaptive_epsilon())}, Opacus' RDP accountant ε = {up(rdp.get_epsilon(1e-5))}, "
          f"Opacus' default PRV accountant (engine.accountant.wrapped) ε = "
          f"{up(engine.accountant.wrapped.get_epsilon(1e-5))}")
    return ledger


if __name__ == "__main__":
    main()
