"""Task adv7: a plain optimizer beside the DPOptimizer in a Lightning fit.

Lightning's manual optimization (``automatic_optimization = False``) trains with every
optimizer ``configure_optimizers`` returns. The callback looked for the one Opacus
DPOptimizer among ``trainer.optimizers`` and passed over the others: a ``torch.optim.SGD``
beside it, stepping a second head on the batch's own gradients (no clipping, no noise),
ran every step while the ledger charged only the DPOptimizer's steps. The fit is now
refused when training starts, with ``InvalidArgumentError`` naming ``optimizer``, before
any step is charged or applied.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from _adv7_manual import fit_one_epoch, poisson_loader  # noqa: E402
from opacus import GradSampleModule  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
N, BATCH = 64, 16


class _TwoOptimizers(pl.LightningModule):
    """A private body (DPOptimizer) and, with ``plain``, a head trained without noise."""

    def __init__(self, plain: bool):
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.net = GradSampleModule(nn.Linear(4, 2))
        self.head = nn.Linear(4, 2)
        x = torch.randn(N, 4, generator=torch.Generator().manual_seed(0))
        self.data = TensorDataset(x, (x[:, 0] > 0).long())
        self.plain = plain
        self.plain_updates = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        opts = self.optimizers()
        private = opts[0] if isinstance(opts, list) else opts
        self.manual_backward(nn.functional.cross_entropy(self.net(x), y))
        private.step()
        private.zero_grad()
        if self.plain:  # the batch's raw gradient, applied as it is
            self.manual_backward(nn.functional.cross_entropy(self.head(x), y))
            opts[1].step()
            opts[1].zero_grad()
            self.plain_updates += 1

    def configure_optimizers(self):
        private = DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1),
                              noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=BATCH)
        if not self.plain:
            return private
        return [private, torch.optim.SGD(self.head.parameters(), lr=0.1)]

    def train_dataloader(self):
        return poisson_loader(self.data, BATCH)




def test_a_plain_optimizer_beside_the_dp_optimizer_is_refused_before_any_step():
    ledger, model = Ledger(delta=1e-5), _TwoOptimizers(plain=True)
    with pytest.raises(InvalidArgumentError) as info:
        fit_one_epoch(ledger, model)
    assert info.value.argument == "optimizer" and "SGD" in str(info.value)
    assert "outside this fit" in str(info.value)  # review radv7: what to do instead
    assert len(ledger.history) == 0 and model.plain_updates == 0  # nothing charged or run


def test_the_dp_optimizer_alone_still_trains_and_is_charged():
    ledger, model = Ledger(delta=1e-5), _TwoOptimizers(plain=False)
    trainer = fit_one_epoch(ledger, model)
    assert trainer.global_step > 0 and len(ledger.history) == trainer.global_step
