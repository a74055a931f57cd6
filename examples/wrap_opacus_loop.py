"""Put a privguard ledger under an existing Opacus training loop: two added lines.

Run: python examples/wrap_opacus_loop.py
"""

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import BudgetExhausted, Ledger
from privguard.integrations.opacus import attach

torch.manual_seed(0)
x = torch.randn(2048, 20)
data = TensorDataset(x, (x[:, :2].sum(1) > 0).long())
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
engine = PrivacyEngine()
model, optimizer, loader = engine.make_private(
    module=model, optimizer=optimizer, data_loader=DataLoader(data, batch_size=64),
    noise_multiplier=1.0, max_grad_norm=1.0)

ledger = Ledger(epsilon=3.0, delta=1e-5)                          # added line 1
attach(optimizer, ledger, data_loader=loader, privacy_engine=engine)  # added line 2

try:
    for epoch in range(100):
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()             # charged here; refused before the update if over budget
        print(f"epoch {epoch}: ε = {engine.get_epsilon(1e-5):.3f} (the ledger's running ε)")
except BudgetExhausted as exc:
    print(f"stopped: {exc.remaining}")
print(f"{len(ledger.history)} steps charged; report: {ledger.guarantee()}")
