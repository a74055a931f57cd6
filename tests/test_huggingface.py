"""The Hugging Face TrainerCallback on a tiny model: charges, logs ε, stops, checkpoints."""

from __future__ import annotations

import pytest
import torch
import transformers  # privguard[huggingface], installed by the test extra
from opacus import GradSampleModule
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.utils.data import DataLoader, Dataset

from privguard import Ledger
from privguard import mechanisms as M
from privguard.integrations.huggingface import LEDGER_FILE, LedgerTrainerCallback

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
N, BATCH = 256, 32


class Pairs(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, 10, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 2)

    def forward(self, x, labels=None, **unused):
        logits = self.lin(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class PoissonTrainer(transformers.Trainer):
    """Feeds Poisson-sampled batches (Opacus' DPDataLoader), as the accounting assumes."""

    def get_train_dataloader(self):
        base = DataLoader(self.train_dataset, batch_size=BATCH,
                          collate_fn=transformers.default_data_collator)
        return DPDataLoader.from_data_loader(base)


def make_trainer(tmp_path, ledger, **kw):
    torch.manual_seed(0)
    model = GradSampleModule(Tiny())
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                      max_grad_norm=1.0, expected_batch_size=BATCH)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH, logging_steps=1,
        report_to=[], use_cpu=True, remove_unused_columns=False, disable_tqdm=True, **kw)
    cb = LedgerTrainerCallback(ledger, sample_rate=BATCH / N)
    return PoissonTrainer(model=model, args=args, train_dataset=Pairs(),
                          optimizers=(opt, None), callbacks=[cb]), cb


def test_charges_logs_and_stops_at_exhaustion(tmp_path):
    step = M.SubsampledGaussian(1.0, BATCH / N)
    ledger = Ledger(3.0, 1e-5, plan=step)
    allowed = ledger.remaining(step).repeats
    trainer, cb = make_trainer(tmp_path, ledger, num_train_epochs=100, save_strategy="no")
    trainer.train()
    assert len(ledger.history) == allowed == trainer.state.global_step
    logged = [h["privacy_epsilon"] for h in trainer.state.log_history if "privacy_epsilon" in h]
    assert logged and logged[-1] == pytest.approx(ledger.epsilon())


def test_state_round_trips_through_a_checkpoint(tmp_path):
    ledger = Ledger(delta=1e-5)
    trainer, cb = make_trainer(tmp_path, ledger, max_steps=4, save_strategy="steps", save_steps=4)
    trainer.train()
    ckpt = tmp_path / "checkpoint-4"
    assert (ckpt / LEDGER_FILE).exists()
    fresh = Ledger(delta=1e-5)
    trainer2, _ = make_trainer(tmp_path, fresh, max_steps=6, save_strategy="no")
    trainer2.train(resume_from_checkpoint=str(ckpt))
    assert len(fresh.history) == 6  # 4 restored + 2 new
