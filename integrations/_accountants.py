"""Opacus accountants backed by a ledger (private; re-exported by the opacus integration).

* :class:`LedgerAccountant` stands in for Opacus' accountant: Opacus' own
  hook then charges the ledger.
* :class:`EngineView` is what ``attach(..., privacy_engine=engine)`` puts in
  ``engine.accountant``: it reports the ledger's ε and carries the ledger's
  checkpoint entry next to Opacus' accountant state, which it keeps.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from privguard import _validation as check
from privguard import mechanisms as M
from privguard._errors import InvalidArgumentError, LedgerStateError, PrivguardError
from privguard._ledger._ledger import Ledger
from privguard.integrations import _describe
from privguard.integrations._adaptive_clipping import refuse_adaptive_clipping
from privguard.integrations._checkpoint import check_entry, is_step_row, ledger_entry, restore
from privguard.integrations._distributed import is_distributed
from privguard.integrations._recorded import History, history_of
from privguard.integrations._skips import _bound, noise_bound

try:  # opacus is a runtime dependency of privguard
    from opacus.accountants.accountant import IAccountant
    from opacus.optimizers import DPOptimizer
except ImportError as exc:  # pragma: no cover - opacus is a hard dependency
    raise ImportError("privguard.integrations.opacus needs opacus: pip install opacus") from exc

__all__ = ["CHECKPOINT_LABEL", "EngineView", "LedgerAccountant"]

CHECKPOINT_LABEL = "opacus checkpoint"
"""Label of the charges for steps a checkpoint's accountant held and the ledger did not."""


class LedgerAccountant(IAccountant):
    """An Opacus accountant backed by a privguard ledger.

    Usable wherever Opacus expects an accountant: ``get_epsilon(delta)``
    returns the ledger's valid running ε (the odometer's tail bound, not capped
    by a filter's target; ``get_privacy_spent(delta=)`` the same as ``(ε, nan)``, no best
    order), and ``step(...)`` charges the ledger (raising
    :class:`privguard.BudgetExhausted` if the filter refuses). Set it on a
    ``PrivacyEngine`` before ``make_private`` to have Opacus' own hook charge
    the ledger::

        engine = PrivacyEngine()
        engine.accountant = LedgerAccountant(ledger)
        model, optimizer, loader = engine.make_private(...)

    A step of k micro-batches (several ``backward()`` before ``step()``,
    which the optimizer reports as ``accumulated_iterations``) is charged as
    ``AccumulatedSubsampledGaussian(σ, q, k)`` (docs/theory.md §14), not as
    the ``SubsampledGaussian(σ, k·q)`` Opacus records; a ghost-clipping
    optimizer (it reports one) is refused before its first update, and so is an
    adaptive-clipping one (docs/theory.md §14.8). It sees
    neither the loader's sampling, nor micro-batches accumulated through the
    loop's own ``signal_skip_step``, nor a clipping bound lowered between
    the virtual steps of one real step: :func:`attach` with ``data_loader=``
    checks and counts those.

    ``make_private_with_epsilon`` calibrates σ through Opacus' accountants
    by name and cannot use this one; keep Opacus' accountant there and
    :func:`attach` the ledger to the optimizer instead. It does not
    coordinate ranks: under DDP its hook raises; use :func:`attach`. A step
    clipped above its noise's bound (per-layer ``max_grad_norms`` raised above
    the ``max_grad_norm`` the noise uses) is refused before the update, since
    Opacus' hook reports σ for a step of noise multiplier σ·C/C′
    (docs/theory.md §14.7); :func:`attach` charges that.

    Its ``state_dict`` (what ``engine.save_checkpoint`` stores) holds the
    steps it recorded and the ledger's checkpoint entry; ``load_state_dict``
    brings the ledger forward to it (never backwards).

    Example:
        >>> from privguard import Ledger
        >>> acc = LedgerAccountant(Ledger(delta=1e-5))
        >>> acc.step(noise_multiplier=1.0, sample_rate=0.01)
        >>> len(acc), acc.history, acc.get_epsilon(1e-5) > 0
        (1, [(1.0, 0.01, 1)], True)
    """

    def __init__(self, ledger: Ledger, label: str = "step", charge: bool = True) -> None:
        super().__init__()
        if not isinstance(ledger, Ledger):
            raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
        if label is not None and not isinstance(label, str):
            raise InvalidArgumentError("label", label, "must be a string or None")
        self.ledger = ledger
        self.label = label
        self._charge = check.flag("charge", charge)  # bool() took "no" and raised on arrays

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        if self._charge:
            self.ledger.charge(M.SubsampledGaussian(noise_multiplier, sample_rate), label=self.label)
        _record(self.history, noise_multiplier, sample_rate)

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        return self.ledger.epsilon(delta)

    def get_privacy_spent(self, *, delta: float, alphas: Any = None) -> tuple[float, float]:
        """``(get_epsilon(delta), nan)``: Opacus' RDP accountant's call; the mixture odometer
        has no best order (:func:`_privacy_spent`)."""
        return _privacy_spent(self.ledger, delta, alphas)

    def __len__(self) -> int:
        return len(self.ledger.history)

    @classmethod
    def mechanism(cls) -> str:
        return "privguard"

    def get_optimizer_hook_fn(self, sample_rate: float) -> Callable[[DPOptimizer], None]:
        opacus_hook = super().get_optimizer_hook_fn(sample_rate)

        def hook_fn(optim: DPOptimizer) -> None:
            if not self._charge:  # Opacus' record only (attach charges)
                opacus_hook(optim)
                return
            if is_distributed(optim):
                # Raised on every rank alike (each runs this hook), before any update.
                raise InvalidArgumentError(
                    "optimizer", type(optim).__name__,
                    "is distributed: a LedgerAccountant would charge once per rank; call "
                    "attach(optimizer, ledger) on every rank instead")
            refuse_adaptive_clipping(optim)  # task adv3: not SubsampledGaussian(σ, q) (§14.8)
            k = self._micro_batches(optim)
            _refuse_clip_above_noise(optim)  # task adv4: Lemma 14.8's σ·C/C′ < σ
            if k == 1:
                opacus_hook(optim)
                return
            # Review smp: Opacus' hook steps q·k for k micro-batches, which this accountant
            # charged as SubsampledGaussian(σ, k·q): an under-count (docs/theory.md §14).
            # k Poisson draws noised once are AccumulatedSubsampledGaussian(σ, q, k), as
            # attach charges them; Opacus' record keeps its own (σ, q·k).
            sigma = optim.noise_multiplier
            self.ledger.charge(_describe.step_mechanism(sigma, sample_rate, k), label=self.label)
            _record(self.history, sigma, sample_rate * k)

        return hook_fn

    @staticmethod
    def _micro_batches(optim: DPOptimizer) -> int:
        """The Poisson draws the real step about to be noised clipped, as far as this hook
        can see them (``accumulated_iterations``); a ghost-clipping optimizer, which reports
        one whatever ran, is refused before the update (``attach`` counts its passes)."""
        if _describe.is_ghost(optim):
            raise InvalidArgumentError(
                "optimizer", type(optim).__name__,
                "uses ghost clipping, which reports one micro-batch per step whatever the loop "
                "accumulated, so a LedgerAccountant cannot know what to charge; keep Opacus' "
                "accountant and attach(optimizer, ledger, data_loader=loader) instead")
        return _describe.reported_micro_batches(optim) or 1

    def state_dict(self, destination: Any = None) -> Any:
        destination = OrderedDict() if destination is None else destination
        destination["history"] = copy.deepcopy(self.history)
        destination["mechanism"] = self.mechanism()
        destination["privguard"] = ledger_entry(self.ledger, history_of(self))
        return destination

    def load_state_dict(self, state_dict: Any) -> None:
        if not isinstance(state_dict, dict):
            raise InvalidArgumentError("state_dict", type(state_dict).__name__, "must be a dict")
        # before the ledger moves
        history = _opacus_history(state_dict.get("history", []), "state_dict['history']")
        if "privguard" in state_dict:
            restore(self.ledger, state_dict["privguard"], where="state_dict['privguard']")
        elif "privguard_ledger" in state_dict:  # written by privguard 0.1
            self.ledger.load_state_dict(state_dict["privguard_ledger"])
        else:
            raise LedgerStateError(
                "this accountant state holds no privguard ledger (it was written by "
                f"Opacus' {state_dict.get('mechanism')!r} accountant); load it into Opacus' "
                "accountant and attach() the ledger, which charges the steps it recorded")
        self.history = history


def _privacy_spent(ledger: Ledger, delta: Any, alphas: Any) -> tuple[float, float]:
    """Opacus' ``RDPAccountant.get_privacy_spent(delta=, alphas=)``, answered by the ledger
    (task radv9: the attribute was missing, and Opacus code that calls it after ``attach``
    met an ``AttributeError``).

    The ε is ``get_epsilon(delta)``'s: the ledger's odometer at ``delta`` (its tail bound,
    docs/theory.md §3). Opacus' second number is the single order its conversion took;
    the mixture odometer is a root over all of its orders at once, with no such order, so
    it is ``nan`` (a number there would name an order that does not give the ε). The
    ledger's orders were fixed before the first output: ``alphas`` other than None is
    refused rather than ignored."""
    if alphas is not None:
        raise InvalidArgumentError(
            "alphas", check.short(alphas),
            "cannot be chosen here: the ledger's odometer uses the orders fixed when it was "
            "created (ledger.orders), over all of them at once; call get_privacy_spent(delta=...)")
    return float(ledger.epsilon(delta)), math.nan


def _refuse_clip_above_noise(optim: DPOptimizer) -> None:
    """Refuse a step whose records were clipped above the noise's bound (task adv4).

    ``DPPerLayerOptimizer`` clips at its ``max_grad_norms`` and noises with ``max_grad_norm``,
    the norm of that list when it was built: a list raised since clips each record at
    C′ = ‖max_grad_norms‖ > C under noise σ·C, the Gaussian of noise multiplier σ·C/C′
    (docs/theory.md §14.7, Lemma 14.8), which Opacus' hook records as σ. ``attach`` charges
    σ·C/C′; this accountant, which charges what Opacus' hook reports, refuses the step
    before the update (``_skips._bound``: the bound clipped at, ``noise_bound``: the noise's)."""
    clipped, noised = _bound(optim), noise_bound(optim)
    if clipped > noised:
        raise InvalidArgumentError(
            "optimizer", type(optim).__name__,
            f"clips each record at {clipped!r} (its max_grad_norms, or max_grad_norm) while "
            f"its noise is noise_multiplier·{noised!r}: the step's noise multiplier is "
            f"{optim.noise_multiplier!r}·{noised!r}/{clipped!r}, below the one Opacus' hook "
            "reports (docs/theory.md §14.7). A LedgerAccountant charges what the hook "
            "reports, so the step is refused before the update; use attach(optimizer, ledger) "
            "(it charges the effective noise multiplier), or keep max_grad_norm equal to the "
            "norm of max_grad_norms")


def _opacus_history(value: Any, where: str) -> list[tuple]:
    """Opacus' run-length record, [(noise_multiplier, sample_rate, steps), ...], checked as a
    checkpoint entry's accountant_history is (review fs: 5 raised TypeError after the ledger
    was restored, "ab" loaded as rows, and an array's truth value raised ValueError)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InvalidArgumentError(where, check.short(value), "must be a list of "
                                   "(noise_multiplier, sample_rate, steps) rows")
    for i, row in enumerate(value):
        if not is_step_row(row):
            raise InvalidArgumentError(where, check.short(value), f"row {i} is not "
                                       "(noise_multiplier, sample_rate, steps)")
    return [tuple(row) for row in value]


def _record(history: list, sigma: float, rate: float) -> None:
    """Append one step to an Opacus-style run-length history, in place."""
    if history and tuple(history[-1][:2]) == (sigma, rate):
        history[-1] = (sigma, rate, history[-1][2] + 1)
    else:
        history.append((sigma, rate, 1))


class EngineView(IAccountant):
    """What ``attach(..., privacy_engine=engine)`` puts in ``engine.accountant`` until detach.

    ``get_epsilon`` reports the ledger, and so does ``get_privacy_spent(delta=)`` (Opacus'
    RDP accountant's call), as ``(ε, nan)``: the mixture odometer has no best order.
    ``history``, ``len()``, ``step`` and ``state_dict`` keep Opacus' record (``history``
    is the wrapped accountant's). Opacus' own accountant (``wrapped``)
    keeps recording every step through its hook on the optimizer, and its
    state is saved and loaded next to the ledger's entry, so an Opacus
    accountant can load this checkpoint too.
    """

    def __init__(self, handle: Any, wrapped: IAccountant) -> None:
        # IAccountant.__init__ is not called: ``history`` is the wrapped accountant's.
        self._handle = handle
        self.wrapped = wrapped
        self.ledger = handle.ledger

    @property
    def history(self) -> list:
        return self.wrapped.history

    @history.setter
    def history(self, value: list) -> None:
        self.wrapped.history = value

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        # The optimizer's hook charges the ledger; this only keeps Opacus' record.
        self.wrapped.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        return self.ledger.epsilon(delta)

    def get_privacy_spent(self, *, delta: float, alphas: Any = None) -> tuple[float, float]:
        """``(get_epsilon(delta), nan)``: Opacus' RDP accountant's call; the mixture odometer
        has no best order (:func:`_privacy_spent`)."""
        return _privacy_spent(self.ledger, delta, alphas)

    def __len__(self) -> int:
        return len(self.wrapped)

    @classmethod
    def mechanism(cls) -> str:
        return "privguard"

    def state_dict(self, destination: Any = None) -> Any:
        destination = OrderedDict() if destination is None else destination
        self.wrapped.state_dict(destination)  # Opacus' own: history and mechanism
        held = history_of(self.wrapped) if self._handle.recorder is self.wrapped else None
        destination["privguard"] = ledger_entry(self.ledger, held)
        return destination

    def load_state_dict(self, state_dict: Any) -> None:
        """Load Opacus' accountant state and bring the ledger to the checkpoint's entry.

        Steps the loaded accountant holds that the ledger does not (a
        checkpoint written without the ledger) are charged. Under DDP every
        rank must load (as every rank attached); a failure on one stops all.

        All or nothing for Opacus' record: whatever refuses the load (the ledger's
        restore, a record that does not extend the one saved with the ledger, steps
        that do not fit the budget, another rank's failure), Opacus' record goes back to
        what it held (tasks lo5, rlo5). Left moved, a later checkpoint saved it as the
        steps the ledger holds, and a resume from it charged none of them. The ledger
        only moves forward: what it took before the refusal stays charged, never less.
        """
        before = copy.copy(self.wrapped.history)
        try:
            self._load(state_dict)
        except BaseException:
            self.wrapped.history = before
            raise

    def _load(self, state_dict: Any) -> None:
        error: PrivguardError | None = None
        entry = state_dict.get("privguard") if isinstance(state_dict, dict) else None
        held: History = []
        try:
            if not isinstance(state_dict, dict):
                raise InvalidArgumentError("state_dict", type(state_dict).__name__,
                                           "must be a dict")
            if entry is None and "privguard_ledger" in state_dict:  # a LedgerAccountant's, 0.1
                raise LedgerStateError(
                    "this checkpoint was written by a LedgerAccountant in place of Opacus' "
                    "accountant; resume the same way (engine.accountant = LedgerAccountant(ledger))")
            where = "privacy_accountant_state_dict['privguard']"
            if "history" in state_dict:
                _opacus_history(state_dict["history"], "state_dict['history']")  # review fs
                if entry is not None:  # before Opacus' record moves (review radv)
                    check_entry(entry, where)
                try:
                    self.wrapped.load_state_dict(
                        {k: state_dict[k] for k in ("history", "mechanism") if k in state_dict})
                except ValueError as exc:  # Opacus' own validation
                    raise LedgerStateError(
                        f"Opacus' accountant refused the checkpoint: {exc}") from exc
            if entry is not None:
                restore(self.ledger, entry, where=where)
                held = [tuple(r) for r in entry.get("accountant_history") or []]
        except PrivguardError as exc:  # under DDP, raised on every rank alike below
            error = exc
        try:
            current = history_of(self.wrapped)
        except LedgerStateError as exc:  # a malformed record: raised on every rank alike
            current, error = [], error or exc
        self._handle._charge_recorded(current, held, CHECKPOINT_LABEL,
                                      from_entry=entry is not None, stacklevel=4, error=error)
