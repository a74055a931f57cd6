"""Shared pieces of the training-framework callbacks (private)."""

from __future__ import annotations

import math
from typing import Any

from privguard import _validation as check
from privguard._accounting._accounting import check_label
from privguard._errors import InvalidArgumentError
from privguard._optional import require

__all__ = ["AttachedCallback", "check_callback_arguments", "find_dp_optimizer", "require"]


def find_dp_optimizer(candidates: Any):
    """The Opacus DPOptimizer among ``candidates``, unwrapping framework wrappers.

    Every candidate must be that one DPOptimizer (task adv7: Lightning's manual
    optimization trains with every optimizer ``configure_optimizers`` returns, and a plain
    ``torch.optim`` optimizer beside the DPOptimizer was passed over: its updates, from
    the batch's gradients without clipping or noise, were released uncharged).

    Raises:
        InvalidArgumentError: naming ``optimizer``, when ``candidates`` hold no DPOptimizer,
            several, or another optimizer beside it.
    """
    from opacus.optimizers import DPOptimizer

    found, plain = [], []
    for given in candidates if isinstance(candidates, (list, tuple)) else [candidates]:
        opt, seen = given, 0
        while opt is not None and not isinstance(opt, DPOptimizer) and seen < 5:
            opt = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
            seen += 1
        if isinstance(opt, DPOptimizer):
            found.append(opt)
        else:
            plain.append(type(given).__name__)
    if len(found) != 1:
        raise InvalidArgumentError(
            "optimizer", candidates,
            f"expected exactly one Opacus DPOptimizer, found {len(found)}")
    if plain:
        raise InvalidArgumentError(
            "optimizer", candidates,
            f"holds {len(plain)} optimizer(s) beside the Opacus DPOptimizer ({', '.join(plain)}): "
            "their updates are computed from the training data without Opacus' clipping and "
            "noise, and no ledger charges them; train every parameter through the one "
            "DPOptimizer. An optimizer whose loss reads no training record (a GAN's generator "
            "trained through the discriminator, a head trained on public data) is sound, but "
            "privguard cannot check that: step it outside this fit (its own loop or Trainer "
            "without the callback)")
    return found[0]


def check_callback_arguments(ledger: Any, log_name: Any, label: Any, check_poisson: Any,
                             sample_rate: Any = None) -> None:
    """The arguments the Lightning and Hugging Face callbacks share, checked alike.

    ``sample_rate`` as :func:`~privguard.integrations.opacus.attach` checks it: None, a
    callable (its value is checked at every step), or a number in (0, 1] (review rnw: a
    string or 2.0 was taken at construction and refused only when fit/train began).

    Raises:
        InvalidArgumentError: naming the first argument of the wrong type.
    """
    from privguard import Ledger

    if not isinstance(ledger, Ledger):
        raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
    if sample_rate is not None and not callable(sample_rate):
        check.sample_rate("sample_rate", sample_rate)
    if not isinstance(log_name, str):
        raise InvalidArgumentError("log_name", log_name, "must be a string")
    if not isinstance(label, str):
        raise InvalidArgumentError("label", label, "must be a string")
    # the ledger's own check (NUL, lone surrogates), here rather than when training begins
    # (task adv2: LedgerCallback(ledger, label="a\x00b") was taken and refused at fit)
    check_label(label)
    check.flag("check_poisson", check_poisson)


def running_statement(ledger: Any) -> tuple[float, float] | None:
    """The running ε a callback logs and the δ it is stated at: the odometer at the ledger's
    δ, after a retarget the one it was created with (docs/theory.md §4); None when no δ was
    fixed before the first output (nothing to log, rather than an error mid-training).
    The callbacks log the δ beside the ε (:func:`delta_name`; review radv9: the ε was logged
    alone, and after a retarget its δ is not ``ledger.delta``)."""
    from privguard._accounting._results import stated_delta

    delta = stated_delta(ledger._acc)
    return None if delta is None else (float(ledger.epsilon(delta)), float(delta))


def delta_name(log_name: str) -> str:
    """The metric under which a callback logs the δ of the ε it logs as ``log_name``: its
    last ``epsilon`` made ``delta`` (``privacy/epsilon`` → ``privacy/delta``), else
    ``log_name + "_delta"``.

    Example:
        >>> delta_name("privacy/epsilon"), delta_name("privacy_epsilon"), delta_name("eps")
        ('privacy/delta', 'privacy_delta', 'eps_delta')
    """
    head, found, tail = log_name.rpartition("epsilon")
    return f"{head}delta{tail}" if found else f"{log_name}_delta"


_FLOAT32_TINY = 2.0 ** -126  # the least positive normal float32


def float32_up(value: float) -> float:
    """``value`` rounded up to a float32, the ε the callbacks log: Lightning keeps a logged
    float as a float32 tensor, and TensorBoard stores one, rounded to nearest, which logged
    about every other ε below the ledger's (review cbk; Hugging Face: review rcb).

    A positive value up to the least normal float32 becomes that one (review rcb): under
    ``torch.set_flush_denormal(True)`` a subnormal float32 reads as 0, below the ε."""
    import torch

    if 0 < value <= _FLOAT32_TINY:
        return _FLOAT32_TINY
    logged = torch.tensor(value, dtype=torch.float32)
    if float(logged) < value:
        logged = torch.nextafter(logged, torch.tensor(math.inf, dtype=torch.float32))
    return float(logged)


class AttachedCallback:
    """What the Lightning and Hugging Face callbacks share about their ``handle``: the
    :class:`~privguard.integrations.opacus.AttachHandle` of the current fit, or None.

    The callbacks detach it at the end of a fit, on an exception and before the next fit;
    a pickled callback leaves it out (a live link to this process's optimizer).
    """

    handle: Any

    def _detach(self) -> None:
        if self.handle is not None:
            self.handle.detach()
            self.handle = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["handle"] = None  # a live link to this process's optimizer
        return state
