"""A PyTorch Lightning callback that charges a privguard ledger.

Install: ``pip install 'privguard[lightning]'``.

    from privguard.integrations.lightning import LedgerCallback
    trainer = Trainer(callbacks=[LedgerCallback(ledger)])

The LightningModule trains with an Opacus ``DPOptimizer`` (returned from
``configure_optimizers``). The callback attaches the ledger to it when
training starts (:func:`privguard.integrations.opacus.attach`, in "stop"
mode): each real noisy step is charged before its update; steps Opacus does
not account are not charged. After every batch it logs the running ε with
``pl_module.log`` and sets ``trainer.should_stop`` when the ledger would
refuse the next step. The ledger's state is saved in and restored from
Lightning checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from privguard._errors import InvalidArgumentError
from privguard._ledger import Ledger
from privguard.integrations._frameworks import find_dp_optimizer, require
from privguard.integrations.opacus import attach

_pl = require("lightning.pytorch", "lightning")

__all__ = ["LedgerCallback"]


def _train_loader(trainer: Any) -> Any:
    loader = getattr(trainer, "train_dataloader", None)
    return getattr(loader, "iterables", loader)  # Lightning's CombinedLoader


class LedgerCallback(_pl.Callback):
    """Charge every real DP-SGD step to ``ledger``; log ε; stop at exhaustion.

    Args:
        ledger: the privguard ledger.
        sample_rate: Poisson rate (or a callable giving the current one);
            default: read from the training DPDataLoader, else from Opacus'
            accountant hook on the optimizer.
        log_name: the metric name for the running ε (logged when the ledger
            has a δ).
        label: label of each charge.
        prog_bar: show ε in the progress bar.
    """

    def __init__(self, ledger: Ledger, *, sample_rate: float | Callable[[], float] | None = None,
                 log_name: str = "privacy/epsilon", label: str = "step",
                 prog_bar: bool = True) -> None:
        if not isinstance(ledger, Ledger):
            raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
        self.ledger = ledger
        self.sample_rate = sample_rate
        self.log_name = log_name
        self.label = label
        self.prog_bar = prog_bar
        self.handle = None

    @property
    def state_key(self) -> str:
        return f"privguard.LedgerCallback[{self.label}]"

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizer = find_dp_optimizer(trainer.optimizers)
        loader = _train_loader(trainer)
        from opacus.data_loader import DPDataLoader

        data_loader = loader if isinstance(loader, DPDataLoader) else None
        self.handle = attach(optimizer, self.ledger, sample_rate=self.sample_rate,
                             data_loader=data_loader, label=self.label, on_exhausted="stop")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.handle is None:
            return
        if self.ledger.delta is not None:
            pl_module.log(self.log_name, self.ledger.epsilon(), on_step=True, on_epoch=False,
                          prog_bar=self.prog_bar, logger=True)
        if self.handle.should_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.handle is not None:
            self.handle.detach()
            self.handle = None

    def state_dict(self) -> dict[str, Any]:
        return {"ledger": self.ledger.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.ledger.load_state_dict(state_dict["ledger"])
