"""Put a privguard ledger under an existing Opacus training loop.

Two lines::

    from privguard.integrations.opacus import attach
    handle = attach(optimizer, ledger)      # optimizer: an Opacus DPOptimizer

Every real noisy step is then charged to the ledger exactly once, as a
Poisson-subsampled Gaussian with the noise multiplier and sample rate in force
at that step. The charge runs in the optimizer's step hook, which Opacus calls
after the noisy gradient is formed and before the wrapped optimizer updates
the parameters (``DPOptimizer.pre_step``). A refused step therefore raises
:class:`privguard.BudgetExhausted` (or, with ``on_exhausted="stop"``, is
skipped and flagged) before any parameter changes. Steps Opacus does not
account — the virtual steps of ``BatchMemoryManager``, steps skipped with
``signal_skip_step`` — never reach the hook and are not charged, so the count
matches Opacus' own accountant.

In a hand-written loop the handle is also a context manager and a stop flag::

    with attach(optimizer, ledger, data_loader=loader, on_exhausted="stop") as guard:
        for x, y in loader:
            optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
            if guard.should_stop:    # refused, or the next step would be
                break

Existing step hooks (Opacus' accountant hook among them) keep running, after
the charge; nothing of Opacus' is replaced unless you pass ``privacy_engine=``,
which makes ``privacy_engine.get_epsilon(delta)`` report the ledger's valid
running ε.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from privguard import mechanisms as M
from privguard._errors import BudgetExhausted, InvalidArgumentError
from privguard._ledger import Ledger

try:  # opacus is a runtime dependency of privguard
    from opacus.accountants.accountant import IAccountant
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizer
except ImportError as exc:  # pragma: no cover - opacus is a hard dependency
    raise ImportError("privguard.integrations.opacus needs opacus: pip install opacus") from exc

__all__ = ["AttachHandle", "LedgerAccountant", "NonPoissonSamplingError", "attach"]


class NonPoissonSamplingError(InvalidArgumentError):
    """The data loader does not sample by Poisson sampling, which the accounting assumes."""


class LedgerAccountant(IAccountant):
    """An Opacus accountant backed by a privguard ledger.

    Usable wherever Opacus expects an accountant: ``get_epsilon(delta)``
    returns the ledger's valid running ε (the odometer, capped by a filter's
    target), and ``step(...)`` charges the ledger (raising
    :class:`privguard.BudgetExhausted` if the filter refuses). Set it on a
    ``PrivacyEngine`` before ``make_private`` to have Opacus' own hook charge
    the ledger::

        engine = PrivacyEngine()
        engine.accountant = LedgerAccountant(ledger)
        model, optimizer, loader = engine.make_private(...)

    ``make_private_with_epsilon`` calibrates σ through Opacus' accountants
    by name and cannot use this one; keep Opacus' accountant there and
    :func:`attach` the ledger to the optimizer instead.

    Example:
        >>> from privguard import Ledger
        >>> acc = LedgerAccountant(Ledger(delta=1e-5))
        >>> acc.step(noise_multiplier=1.0, sample_rate=0.01)
        >>> len(acc), acc.get_epsilon(1e-5) > 0
        (1, True)
    """

    def __init__(self, ledger: Ledger, label: str = "step", charge: bool = True) -> None:
        super().__init__()
        if not isinstance(ledger, Ledger):
            raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
        self.ledger = ledger
        self.label = label
        self._charge = charge

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        if self._charge:
            self.ledger.charge(M.SubsampledGaussian(noise_multiplier, sample_rate), label=self.label)

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        return self.ledger.epsilon(delta)

    def __len__(self) -> int:
        return len(self.ledger.history)

    @classmethod
    def mechanism(cls) -> str:
        return "privguard"

    def state_dict(self, destination: Any = None) -> dict:
        destination = {} if destination is None else destination
        destination["privguard_ledger"] = self.ledger.state_dict()
        return destination

    def load_state_dict(self, state_dict: dict) -> None:
        self.ledger.load_state_dict(state_dict["privguard_ledger"])


def _sample_rate_from_opacus_hook(hook: Callable | None) -> float | None:
    """The sample rate Opacus' accountant hook was created with, if ``hook`` is one."""
    code = getattr(hook, "__code__", None)
    if code is None or hook.__closure__ is None or "sample_rate" not in code.co_freevars:
        return None
    value = hook.__closure__[code.co_freevars.index("sample_rate")].cell_contents
    return float(value) if isinstance(value, (int, float)) else None


def _check_poisson(data_loader: Any) -> None:
    if isinstance(data_loader, DPDataLoader):
        return
    sampler = getattr(data_loader, "batch_sampler", None)
    if type(sampler).__name__ in ("UniformWithReplacementSampler",
                                  "DistributedUniformWithReplacementSampler"):
        return
    raise NonPoissonSamplingError(
        "data_loader", type(data_loader).__name__,
        "does not do Poisson sampling, which the subsampled-Gaussian accounting "
        "assumes (use Opacus' DPDataLoader, i.e. make_private(..., poisson_sampling=True)); "
        "pass check_poisson=False only if you accept that the reported ε does not "
        "hold for this sampling")


class AttachHandle:
    """What :func:`attach` returns: the live link between an optimizer and a ledger.

    Attributes:
        ledger: the ledger charged.
        steps_charged: real noisy steps charged through this handle.
        exhausted: True once a step was refused (``on_exhausted="stop"``).

    Use it as a context manager to detach on exit.
    """

    def __init__(self, optimizer: DPOptimizer, ledger: Ledger, rate: Callable[[], float],
                 label: str, on_exhausted: str) -> None:
        self.optimizer = optimizer
        self.ledger = ledger
        self.label = label
        self.on_exhausted = on_exhausted
        self.steps_charged = 0
        self.exhausted = False
        self.last_refusal: BudgetExhausted | None = None
        self._rate = rate
        self._active = True
        self._previous_hook = optimizer.step_hook
        self._engine = None
        self._engine_accountant = None
        optimizer.attach_step_hook(self._hook)
        self._own_step_attr = vars(optimizer).get("step")  # e.g. an LR scheduler's wrapper
        if on_exhausted == "stop":
            self._original_step = optimizer.step
            optimizer.step = self._graceful_step  # instance attribute; restored on detach

    # The mechanism of the next real step, read live from the optimizer.
    def next_mechanism(self) -> M.SubsampledGaussian:
        """The mechanism the next real step would be charged as."""
        accumulated = 1
        try:
            accumulated = self.optimizer.accumulated_iterations or 1
        except ValueError:  # no per-sample gradients yet (before the first backward)
            pass
        return M.SubsampledGaussian(float(self.optimizer.noise_multiplier),
                                    self._rate() * accumulated)

    def can_step(self) -> bool:
        """Whether the ledger would admit the next real step (nothing is charged)."""
        return self.ledger.can_afford(self.next_mechanism())

    def _hook(self, optimizer: DPOptimizer) -> None:
        if self._active:
            # Charged before the parameter update; raises if refused.
            self.ledger.charge(self.next_mechanism(), label=self.label)
            self.steps_charged += 1
        if self._previous_hook is not None:
            self._previous_hook(optimizer)

    def _graceful_step(self, *args: Any, **kwargs: Any):
        try:
            return self._original_step(*args, **kwargs)
        except BudgetExhausted as exc:
            self.exhausted = True
            self.last_refusal = exc
            return None

    @property
    def should_stop(self) -> bool:
        """True once a step was refused, or if the next one would be."""
        return self.exhausted or not self.can_step()

    def detach(self) -> None:
        """Stop charging; restore the optimizer's previous hook and step."""
        if not self._active:
            return
        self._active = False
        if self.optimizer.step_hook == self._hook:
            self.optimizer.step_hook = self._previous_hook
        # else: another hook wraps ours; ours stays in its chain as a pass-through.
        if vars(self.optimizer).get("step") == self._graceful_step:
            if self._own_step_attr is None:
                del self.optimizer.step
            else:
                self.optimizer.step = self._own_step_attr
        if self._engine is not None:
            self._engine.accountant = self._engine_accountant

    def __enter__(self) -> AttachHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self._active else "detached"
        return f"AttachHandle({state}, {self.steps_charged} steps charged, {self.ledger!r})"


def attach(
    optimizer: DPOptimizer,
    ledger: Ledger,
    *,
    sample_rate: float | Callable[[], float] | None = None,
    data_loader: Any = None,
    label: str = "step",
    on_exhausted: str = "raise",
    privacy_engine: Any = None,
    check_poisson: bool = True,
) -> AttachHandle:
    """Charge every real noisy step of ``optimizer`` to ``ledger``.

    Args:
        optimizer: an Opacus ``DPOptimizer`` (from ``make_private``,
            ``make_private_with_epsilon`` or built directly).
        ledger: the privguard ledger to charge.
        sample_rate: the Poisson sampling rate, or a callable returning the
            rate in force (for a policy that changes the batch size). Default:
            ``data_loader.sample_rate`` if given, else the rate Opacus' own
            accountant hook on this optimizer was created with.
        data_loader: the training data loader; checked for Poisson sampling
            and used for the sample rate (read live each step).
        label: label of each charge in the ledger's journal.
        on_exhausted: ``"raise"`` (default): a refused step raises
            :class:`privguard.BudgetExhausted` out of ``optimizer.step()``;
            ``"stop"``: the step returns None without updating and
            ``handle.exhausted`` becomes True. Either way the parameters are
            left exactly as they were.
        privacy_engine: if given, its accountant is replaced (until detach)
            by a :class:`LedgerAccountant` view, so
            ``privacy_engine.get_epsilon(delta)`` returns the ledger's ε.
        check_poisson: refuse a ``data_loader`` that does not do Poisson
            sampling (default True).

    Returns:
        An :class:`AttachHandle`; ``handle.detach()`` restores the optimizer.

    Raises:
        InvalidArgumentError: bad arguments, or no way to know the sample rate.
        NonPoissonSamplingError: ``data_loader`` does not do Poisson sampling.
    """
    if not isinstance(optimizer, DPOptimizer):
        raise InvalidArgumentError("optimizer", type(optimizer).__name__,
                                   "must be an Opacus DPOptimizer (see PrivacyEngine.make_private)")
    if not isinstance(ledger, Ledger):
        raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
    if on_exhausted not in ("raise", "stop"):
        raise InvalidArgumentError("on_exhausted", on_exhausted, "must be 'raise' or 'stop'")
    if data_loader is not None and check_poisson:
        _check_poisson(data_loader)
    if sample_rate is None and data_loader is not None:
        if isinstance(data_loader, DPDataLoader):
            rate: Callable[[], float] = lambda: float(data_loader.sample_rate)
        else:
            rate = lambda: 1.0 / len(data_loader)
    elif callable(sample_rate):
        rate = sample_rate
    elif sample_rate is not None:
        fixed = M.SubsampledGaussian(1.0, sample_rate).sample_rate  # validates (0, 1]
        rate = lambda: fixed
    else:
        found = _sample_rate_from_opacus_hook(optimizer.step_hook)
        if found is None:
            raise InvalidArgumentError(
                "sample_rate", None,
                "cannot be inferred: pass sample_rate=... or data_loader=... (no Opacus "
                "accountant hook is attached to this optimizer)")
        rate = lambda: found
    handle = AttachHandle(optimizer, ledger, rate, label, on_exhausted)
    if privacy_engine is not None:
        handle._engine = privacy_engine
        handle._engine_accountant = privacy_engine.accountant
        privacy_engine.accountant = LedgerAccountant(ledger, label=label, charge=False)
    if getattr(optimizer, "noise_multiplier", 0) == 0:
        warnings.warn("optimizer.noise_multiplier is 0: no privacy; every step will raise "
                      "InvalidArgumentError before it updates anything", stacklevel=2)
    return handle
