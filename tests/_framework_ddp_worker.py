"""One rank of a Lightning or Hugging Face DDP run, launched as torchrun would (private).

Run by tests/test_framework_ddp.py as ``python _framework_ddp_worker.py SCENARIO WORKDIR
EPSILON OUT``
in each of 2 processes whose environment is the one torchrun gives its workers
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RUN_ID): Lightning's
``strategy="ddp"`` and Hugging Face's accelerate both take the process group from it
(gloo on CPU). Writes ``{"ok": payload}`` or ``{"error": text}`` to ``OUT``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings

N, T, SIGMA, DELTA = 64, 4, 1.0, 1e-5
EPOCHS = 4  # the ledgers admit 2: the third epoch is refused before its first step


def _data():
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 10, generator=g)
    x[:, 1] = torch.arange(N, dtype=x.dtype)  # column 1 names the record
    return x, (x[:, 0] > 0).long()


def _sampler(kind: str):
    import torch

    from privguard.integrations import (
        DistributedRandomAllocationSampler,
        RandomAllocationSampler,
    )

    cls = DistributedRandomAllocationSampler if kind == "distributed" else RandomAllocationSampler
    return cls(N, T, generator=torch.Generator().manual_seed(7))


def _optimizer(params):
    import torch
    from opacus.optimizers import DistributedDPOptimizer

    return DistributedDPOptimizer(torch.optim.SGD(params, lr=0.1), noise_multiplier=SIGMA,
                                  max_grad_norm=1.0, expected_batch_size=N // T)


def _params(module) -> list[float]:
    return [v for p in module.parameters() for v in p.detach().flatten().tolist()]


def _journal(ledger) -> list[dict]:
    return [r.mechanism.to_dict() for r in ledger.history]


# ----------------------------------------------------------------------- Lightning
def _lightning_fit(ledger, sampler_kind: str, use_distributed_sampler: bool) -> dict:
    import lightning.pytorch as pl
    import torch
    from opacus import GradSampleModule
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from privguard.integrations.lightning import LedgerCallback

    shares: list[list[int]] = []

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)  # the same initial model on every rank
            self.net = GradSampleModule(nn.Linear(10, 2))

        def training_step(self, batch, batch_idx):
            x, y = batch
            shares.append([int(v) for v in x[:, 1].tolist()])
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return _optimizer(self.net.parameters())

        def train_dataloader(self):
            return DataLoader(TensorDataset(*_data()), batch_sampler=_sampler(sampler_kind))

    model = Tiny()
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=EPOCHS,
                         use_distributed_sampler=use_distributed_sampler,
                         callbacks=[LedgerCallback(ledger)], logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, num_sanity_val_steps=0)
    try:
        trainer.fit(model)
    except Exception as exc:
        return {"raised": type(exc).__name__, "argument": getattr(exc, "argument", None),
                "message": str(exc), "journal": _journal(ledger)}
    return {"raised": None, "journal": _journal(ledger), "shares": shares,
            "global_step": trainer.global_step, "should_stop": trainer.should_stop,
            "params": _params(model.net)}


def lightning(workdir: str, epsilon: float) -> dict:
    """A shared ledger file (WORKDIR/shared.db) admitting two epochs of a DistributedRandomAllocationSampler run
    of EPOCHS; then Lightning's default sampler injection, and a per-rank allocation."""
    from privguard import Ledger

    shared = os.path.join(workdir, "shared.db")
    out = {"allocation": _lightning_fit(Ledger(epsilon, DELTA, path=shared), "distributed",
                                        use_distributed_sampler=False)}
    pids = {r.pid for r in Ledger.open(shared, read_only=True).history}
    out["allocation"]["charging_pids"] = len(pids)
    out["default_sampler"] = _lightning_fit(Ledger(delta=DELTA), "distributed",
                                            use_distributed_sampler=True)
    out["plain"] = _lightning_fit(Ledger(delta=DELTA), "plain", use_distributed_sampler=False)
    return out


# ------------------------------------------------------------------- Hugging Face
def _hf_train(ledger, prepare: bool, outdir: str) -> dict:
    import torch
    import transformers
    from opacus import GradSampleModule
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from privguard.integrations.huggingface import LedgerTrainerCallback

    shares: list[list[int]] = []

    class Pairs(Dataset):
        def __init__(self):
            self.x, self.y = _data()

        def __len__(self):
            return N

        def __getitem__(self, i):
            return {"x": self.x[i], "labels": self.y[i]}

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(10, 2)

        def forward(self, x, labels=None, **unused):
            shares.append([int(v) for v in x[:, 1].tolist()])
            logits = self.lin(x)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    class AllocationTrainer(transformers.Trainer):
        def get_train_dataloader(self):
            loader = DataLoader(self.train_dataset, batch_sampler=_sampler("distributed"),
                                collate_fn=transformers.default_data_collator)
            return self.accelerator.prepare(loader) if prepare else loader

    args = transformers.TrainingArguments(  # creates the process group (accelerate, gloo)
        output_dir=outdir, per_device_train_batch_size=N // T // 2, logging_steps=1,
        report_to=[], use_cpu=True, remove_unused_columns=False, disable_tqdm=True,
        save_strategy="no", num_train_epochs=EPOCHS, ddp_backend="gloo", max_grad_norm=0.0)
    torch.manual_seed(0)  # the same initial model on every rank
    model = GradSampleModule(Tiny())
    trainer = AllocationTrainer(model=model, args=args, train_dataset=Pairs(),
                                optimizers=(_optimizer(model.parameters()), None),
                                callbacks=[LedgerTrainerCallback(ledger)])
    try:
        trainer.train()
    except Exception as exc:
        return {"raised": type(exc).__name__, "argument": getattr(exc, "argument", None),
                "message": str(exc), "journal": _journal(ledger)}
    return {"raised": None, "journal": _journal(ledger), "shares": shares,
            "global_step": trainer.state.global_step,
            "should_stop": trainer.control.should_training_stop, "params": _params(model)}


def huggingface(outdir: str, epsilon: float) -> dict:
    """A ledger per rank (in memory) admitting two epochs of a run of EPOCHS; then the same
    loader passed through accelerator.prepare."""
    from privguard import Ledger

    return {"allocation": _hf_train(Ledger(epsilon, DELTA), False, outdir),
            "prepared": _hf_train(Ledger(delta=DELTA), True, outdir)}


SCENARIOS = {"lightning": lightning, "huggingface": huggingface}


def main(scenario: str, workdir: str, epsilon: float, out: str) -> None:
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    try:
        result = {"ok": SCENARIOS[scenario](workdir, epsilon)}
    except BaseException as exc:  # reported to the test, which fails with it
        result = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])
