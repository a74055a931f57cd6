"""The aligned opt-in through the Lightning and Hugging Face callbacks (issue a27)."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import GradSampleModule
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from privguard import InvalidArgumentError, Ledger, Plan
from privguard import mechanisms as M

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
N, BATCH = 256, 32
ALIGNED = M.AccumulatedSubsampledGaussian(1.0, BATCH / N, 2, aligned=True)


def _net(dropout):
    layers = [nn.Linear(10, 10)] + ([] if dropout is None else [nn.Dropout(dropout)])
    return nn.Sequential(*layers, nn.Linear(10, 2))


# ---------------------------------------------------------------- Hugging Face
def _hf_trainer(tmp_path, ledger, dropout=None, eval_mode=False, **kw):
    transformers = pytest.importorskip("transformers")
    from privguard.integrations.huggingface import LedgerTrainerCallback

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
            self.net = _net(dropout)

        def forward(self, x, labels=None, **unused):
            logits = self.net(x)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    class PoissonTrainer(transformers.Trainer):
        def get_train_dataloader(self):
            base = DataLoader(self.train_dataset, batch_size=BATCH,
                              collate_fn=transformers.default_data_collator)
            return DPDataLoader.from_data_loader(base)

    torch.manual_seed(0)
    model = GradSampleModule(Tiny())
    if eval_mode:
        model.eval()
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                      max_grad_norm=1.0, expected_batch_size=BATCH)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH, logging_steps=1,
        report_to=[], use_cpu=True, remove_unused_columns=False, disable_tqdm=True,
        save_strategy="no", **kw)
    cb = LedgerTrainerCallback(ledger, aligned_micro_batches=True)
    return PoissonTrainer(model=model, args=args, train_dataset=Pairs(),
                          optimizers=(opt, None), callbacks=[cb])


def test_hf_gradient_accumulation_with_the_opt_in_keeps_part_A_alive(tmp_path):
    # the opposite of test_huggingface.py::
    # test_gradient_accumulation_steps_under_a_hybrid_ledger_with_the_plan
    ledger = Ledger(epsilon=40.0, delta=1e-5, plan=Plan(ALIGNED, steps=3), filter="hybrid")
    trainer = _hf_trainer(tmp_path, ledger, max_steps=3, gradient_accumulation_steps=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "left the plan")
        trainer.train()
    assert [r.mechanism for r in ledger.history] == [ALIGNED] * 3
    assert ledger._acc.filter.a_alive


@pytest.mark.parametrize("eval_mode", [False, True])
def test_hf_refuses_a_dropout_model_in_either_mode(tmp_path, eval_mode):
    # the Trainer calls model.train() at every step: eval mode at the start is no defence
    ledger = Ledger(delta=1e-5)
    trainer = _hf_trainer(tmp_path, ledger, dropout=0.1, eval_mode=eval_mode, max_steps=2,
                          gradient_accumulation_steps=2)
    with pytest.raises(InvalidArgumentError, match=r"model=.*Dropout\(p=0.1\)"):
        trainer.train()
    assert len(ledger.history) == 0


def test_hf_accepts_dropout_with_p_0(tmp_path):
    ledger = Ledger(delta=1e-5)
    _hf_trainer(tmp_path, ledger, dropout=0.0, max_steps=2,
                gradient_accumulation_steps=2).train()
    assert [r.mechanism for r in ledger.history] == [ALIGNED] * 2


# ---------------------------------------------------------------- Lightning
def _lightning(ledger, dropout=None, **kw):
    pl = pytest.importorskip("lightning.pytorch")
    from privguard.integrations.lightning import LedgerCallback

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = GradSampleModule(_net(dropout))
            x = torch.randn(N, 10)
            self.data = TensorDataset(x, (x[:, 0] > 0).long())

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1),
                               noise_multiplier=1.0, max_grad_norm=1.0,
                               expected_batch_size=BATCH)

        def train_dataloader(self):
            return DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=BATCH))

    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger, aligned_micro_batches=True)],
                         accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, **kw)
    return trainer, Tiny()


def test_lightning_accumulate_grad_batches_with_the_opt_in_keeps_part_A_alive():
    ledger = Ledger(epsilon=40.0, delta=1e-5, plan=Plan(ALIGNED, steps=3), filter="hybrid")
    trainer, module = _lightning(ledger, max_steps=3, accumulate_grad_batches=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "left the plan")
        trainer.fit(module)
    assert trainer.global_step == 3
    assert [r.mechanism for r in ledger.history] == [ALIGNED] * 3
    assert ledger._acc.filter.a_alive


def test_lightning_refuses_a_dropout_model_before_any_step():
    ledger = Ledger(delta=1e-5)
    trainer, module = _lightning(ledger, dropout=0.1, max_steps=2, accumulate_grad_batches=2)
    with pytest.raises(InvalidArgumentError, match=r"model=.*Dropout\(p=0.1\)"):
        trainer.fit(module)
    assert len(ledger.history) == 0
