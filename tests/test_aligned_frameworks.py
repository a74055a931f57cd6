"""The aligned opt-in through the Lightning and Hugging Face callbacks (issue a27)."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch import nn

from privguard import InvalidArgumentError, Ledger, Plan
from privguard import mechanisms as M

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
ALIGNED = M.AccumulatedSubsampledGaussian(1.0, 32 / 256, 2, aligned=True)  # test_huggingface
ALIGNED_L = M.AccumulatedSubsampledGaussian(1.0, 32 / 512, 2, aligned=True)  # test_lightning


def _net(dropout):
    layers = [nn.Linear(10, 10)] + ([] if dropout is None else [nn.Dropout(dropout)])
    return nn.Sequential(*layers, nn.Linear(10, 2))


# ---------------------------------------------------------------- Hugging Face
def _hf_trainer(tmp_path, ledger, dropout=None, eval_mode=False, **kw):
    pytest.importorskip("transformers")
    import test_huggingface as hf  # its dataset, model and Poisson trainer

    torch.manual_seed(0)
    inner = hf.Tiny()
    inner.lin = _net(dropout)
    model = GradSampleModule(inner)
    if eval_mode:
        model.eval()
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                      max_grad_norm=1.0, expected_batch_size=hf.BATCH)
    args = hf.transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=hf.BATCH, logging_steps=1,
        report_to=[], use_cpu=True, remove_unused_columns=False, disable_tqdm=True,
        save_strategy="no", **kw)
    cb = hf.LedgerTrainerCallback(ledger, aligned_micro_batches=True)
    return hf.PoissonTrainer(model=model, args=args, train_dataset=hf.Pairs(),
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
    pytest.importorskip("lightning.pytorch")
    import test_lightning as lt  # its LightningModule and trainer

    module = lt.Tiny()
    module.net = GradSampleModule(_net(dropout))
    return lt.trainer(lt.LedgerCallback(ledger, aligned_micro_batches=True), **kw), module


def test_lightning_accumulate_grad_batches_with_the_opt_in_keeps_part_A_alive():
    ledger = Ledger(epsilon=40.0, delta=1e-5, plan=Plan(ALIGNED_L, steps=3), filter="hybrid")
    trainer, module = _lightning(ledger, max_steps=3, accumulate_grad_batches=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "left the plan")
        trainer.fit(module)
    assert trainer.global_step == 3
    assert [r.mechanism for r in ledger.history] == [ALIGNED_L] * 3
    assert ledger._acc.filter.a_alive


def test_lightning_refuses_a_dropout_model_before_any_step():
    ledger = Ledger(delta=1e-5)
    trainer, module = _lightning(ledger, dropout=0.1, max_steps=2, accumulate_grad_batches=2)
    with pytest.raises(InvalidArgumentError, match=r"model=.*Dropout\(p=0.1\)"):
        trainer.fit(module)
    assert len(ledger.history) == 0
