"""A Hugging Face ``transformers`` TrainerCallback that charges a privguard ledger.

Install: ``pip install 'privguard[huggingface]'``.

    from privguard.integrations.huggingface import LedgerTrainerCallback
    trainer = Trainer(..., optimizers=(dp_optimizer, None),
                      callbacks=[LedgerTrainerCallback(ledger, sample_rate=q)])

The model is an Opacus ``GradSampleModule`` and the optimizer an Opacus
``DPOptimizer``; feed the Trainer Poisson-sampled batches (Opacus'
``DPDataLoader``) — the accounting assumes Poisson sampling at rate
``sample_rate``. When training begins the callback attaches the ledger to the
optimizer (unwrapping accelerate's wrapper; "stop" mode): each real noisy
step is charged before its update. After each step it sets
``control.should_training_stop`` when the ledger would refuse the next one;
at each log it adds the running ε to the Trainer's logs. At each checkpoint
it writes the ledger state as ``privguard_ledger.json`` into the checkpoint
folder, and reloads it when training resumes from that checkpoint.

The Trainer clears gradients with ``model.zero_grad()``, which does not clear
Opacus' per-sample state; the callback therefore calls the DPOptimizer's
``zero_grad`` after every optimizer step (``on_step_end``), as Opacus requires.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from privguard._errors import InvalidArgumentError
from privguard._ledger import Ledger
from privguard.integrations._frameworks import find_dp_optimizer, require
from privguard.integrations.opacus import attach

_tf = require("transformers", "huggingface")

__all__ = ["LEDGER_FILE", "LedgerTrainerCallback"]

LEDGER_FILE = "privguard_ledger.json"


class LedgerTrainerCallback(_tf.TrainerCallback):
    """Charge every real DP-SGD step to ``ledger``; log ε; stop at exhaustion.

    Args:
        ledger: the privguard ledger.
        sample_rate: Poisson rate (or a callable giving the current one);
            default: the rate of Opacus' accountant hook on the optimizer.
        log_name: key of the running ε in the Trainer's logs.
        label: label of each charge.
    """

    def __init__(self, ledger: Ledger, *, sample_rate: float | Callable[[], float] | None = None,
                 log_name: str = "privacy_epsilon", label: str = "step") -> None:
        if not isinstance(ledger, Ledger):
            raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
        self.ledger = ledger
        self.sample_rate = sample_rate
        self.log_name = log_name
        self.label = label
        self.handle = None

    def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                       **kwargs: Any) -> None:
        if state.global_step > 0:  # resuming: restore the journal saved with the checkpoint
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}", LEDGER_FILE)
            if os.path.exists(path):
                with open(path) as fh:
                    self.ledger.load_state_dict(json.load(fh))
        self.handle = attach(find_dp_optimizer(optimizer), self.ledger,
                             sample_rate=self.sample_rate, label=self.label, on_exhausted="stop")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.handle is None:
            return
        self.handle.optimizer.zero_grad(set_to_none=True)
        if self.handle.should_stop:
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
               **kwargs: Any) -> None:
        if self.ledger.delta is None or logs is None:
            return
        eps = self.ledger.epsilon()
        logs[self.log_name] = eps
        if state.log_history:
            state.log_history[-1][self.log_name] = eps

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, LEDGER_FILE), "w") as fh:
            json.dump(self.ledger.state_dict(), fh)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.handle is not None:
            self.handle.detach()
            self.handle = None
