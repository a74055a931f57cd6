"""Put a privguard ledger under an existing Opacus training loop.

Two lines::

    from privguard.integrations.opacus import attach
    handle = attach(optimizer, ledger, data_loader=loader)  # optimizer: an Opacus DPOptimizer

Every real noisy step is then charged to the ledger exactly once, as a
Poisson-subsampled Gaussian with the noise multiplier and sample rate in force
at that step. The charge runs in the optimizer's step hook, which Opacus calls
after the noisy gradient is formed and before the wrapped optimizer updates
the parameters (``DPOptimizer.pre_step``). A refused step therefore raises
:class:`privguard.BudgetExhausted` (or, with ``on_exhausted="stop"``, is
skipped and flagged) before any parameter changes. Steps Opacus does not
account — the virtual steps of ``BatchMemoryManager``, steps skipped with
``signal_skip_step`` — never reach the hook and are not charged, so the count
matches Opacus' own accountant (the micro-batches a loop's own skipped steps
clipped are counted into the next real step's, below).

What ``attach`` checks and does, so that the ε the ledger reports holds:

* **Sampling.** The accounting assumes Poisson sampling. ``data_loader=`` is
  checked (:class:`NonPoissonSamplingError` otherwise); without it attach
  cannot see the sampling and warns (:class:`PoissonUnverifiedWarning`).
  ``check_poisson=False`` is the explicit opt-out. The q charged must be
  each record's draw probability: a non-distributed Poisson sampler under
  DDP (every rank draws from all records) is refused with both numbers;
  an honest q far above the batch the replaced loader had (Opacus #813, a
  ``WeightedRandomSampler`` behind ``make_private``) warns
  (:class:`SampleRateWarning`, ``integrations/_provenance.py``).
* **Accumulation.** k Poisson micro-batches per real step (several
  ``backward()`` per ``step()``) are charged as
  ``AccumulatedSubsampledGaussian(σ, q, k)`` (docs/theory.md §14), k counted
  from the batches ``data_loader`` delivered, the optimizer's per-sample
  gradients (under ghost clipping, whose optimizer reports 1, the backward
  passes of Opacus' wrapped loss: ``integrations/_ghost.py``, §14.5),
  ``micro_batches=`` and the loop's own ``signal_skip_step`` skips (not
  ``BatchMemoryManager``'s; also with an iterator made before attach, which
  the loader count misses: ``integrations/_skips.py``, §14.4); see
  ``integrations/_describe.py``. An optimizer whose last step was skipped
  (attach in the middle of an accumulation) is refused. The default curve
  holds with dropout or augmentation (§14.2); ``aligned_micro_batches=True``
  (with ``model=``) opts in to the tighter aligned one and refuses dropout
  it can see (``integrations/_aligned.py``).
* **Steps taken before attach.** The steps Opacus' accountant on this
  optimizer already recorded are charged at attach, one record per step with
  its σ and q, labelled ``"before attach"`` (the same records an attach at the
  start would have written). If the ledger's filter refuses them, attach
  raises :class:`privguard.BudgetExhausted`, charges nothing and attaches
  nothing.
* **Once per optimizer.** A second ``attach`` on an attached optimizer raises;
  ``handle.detach()`` restores exactly what was there (step hook, ``step``,
  the engine's accountant). Opacus calls one step hook: one set after attach
  (``optimizer.attach_step_hook(fn)``) that does not call privguard's is
  called after the step's charge (under DDP taken on every rank together),
  never before it; one set while a step is noised is caught by a step
  pre-hook on the wrapped optimizer, before the update: the step, whose
  noisy gradient that hook saw, is charged and not applied.
* **Opacus' accountant.** Opacus' default accountant is PRV; the ledger
  accounts in RDP, which gives a larger ε for the same σ and q. Attach warns
  (:class:`AccountantWarning`) with what the run costs by RDP.
* **DDP.** Under Opacus' distributed optimizers, call ``attach`` on every
  rank: each global step is charged once (once per distinct ledger: a file
  shared by the ranks once in all, or one in-memory replica per rank) and
  every rank takes the same admit/refuse decision before any rank updates
  (protocol in ``integrations/_distributed.py``).
* **Checkpoints.** With ``privacy_engine=``, ``engine.get_epsilon(delta)``
  reports the ledger's running ε, and ``engine.save_checkpoint`` stores
  Opacus' accountant state together with the ledger's entry (an in-memory
  ledger's whole state; a file-backed ledger's path and journal
  fingerprint). Resume in Opacus' usual order, ``make_private →
  engine.load_checkpoint → attach(..., privacy_engine=engine, resume=ckpt)``,
  or attach first and then ``engine.load_checkpoint``. privguard does not see where
  the checkpoints are saved: an in-memory ledger resumed from an earlier checkpoint
  holds its charges only, not those of the later steps that ran (review lrw); resume
  from the latest checkpoint, or keep the ledger in a file.

In a hand-written loop the handle is also a context manager and a stop flag::

    with attach(optimizer, ledger, data_loader=loader, on_exhausted="stop") as guard:
        for x, y in loader:
            optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
            if guard.should_stop:    # refused, or the next step would be
                break
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from privguard import _validation as check
from privguard import mechanisms as M
from privguard._accounting._results import exact, stated_delta, upper, whole_count
from privguard._errors import (
    BudgetExhausted,
    InvalidArgumentError,
    LedgerStateError,
    PipelineMismatchError,
    PrivguardError,
)
from privguard._ledger._ledger import Ledger
from privguard._mechanisms._accumulated import MAX_MICRO_BATCHES
from privguard.integrations import (
    _allocation,
    _describe,
    _ghost,
    _provenance,
    _samplers,
    _sampling,
    _skips,
)
from privguard.integrations._accountants import EngineView, LedgerAccountant
from privguard.integrations._adaptive_clipping import (
    refuse_adaptive_clipping,
    refuse_adjusted_noise,
)
from privguard.integrations._aligned import DropoutGuard, check_model, guard_for
from privguard.integrations._checkpoint import is_entry, restore
from privguard.integrations._distributed import Coordinator, RankDisagreementError, is_distributed
from privguard.integrations._drawn_rates import DrawnRates
from privguard.integrations._forward_pairing import PairingCheck
from privguard.integrations._layer_noise import LayerNoise, refuse_insecure
from privguard.integrations._provenance import SampleRateWarning
from privguard.integrations._recorded import (
    History,
    find_opacus_hook,
    history_of,
    replay,
    steps_beyond,
    total_steps,
)
from privguard.integrations._sampling import NonPoissonSamplingError, PoissonUnverifiedWarning
from privguard.integrations._witnesses import _SIZING, Witnesses, hold, reserve_for

try:  # opacus is a runtime dependency of privguard
    from opacus.accountants.accountant import IAccountant
    from opacus.optimizers import DPOptimizer
except ImportError as exc:  # pragma: no cover - opacus is a hard dependency
    raise ImportError("privguard.integrations.opacus needs opacus: pip install opacus") from exc

__all__ = ["REPLAY_LABEL", "AccountantWarning", "AttachHandle", "LedgerAccountant",
           "NonPoissonSamplingError", "PoissonUnverifiedWarning", "RankDisagreementError",
           "SampleRateWarning", "attach"]

_provenance.install()  # records what each DPDataLoader replaced (Opacus #813 warning at attach)

REPLAY_LABEL = "before attach"
"""Label of the charges for steps Opacus' accountant recorded before attach."""

_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class AccountantWarning(UserWarning):
    """About Opacus' accountant: a PRV/GDP accountant, or steps that may be charged twice."""


def _accumulated_allocation(k: int) -> NonPoissonSamplingError:
    """The refusal of k > 1 micro-batches per step from a random-allocation loader: an epoch
    of t batches would run t/k steps, which ``RandomAllocation(σ, t)`` under-counts."""
    return NonPoissonSamplingError(
        "micro_batches", k,
        "accumulated micro-batches of a RandomAllocationSampler loader are not accounted (an "
        "epoch of t batches would run t/k steps, which RandomAllocation(σ, t) under-counts); "
        "step once per batch")


# --------------------------------------------------------------------------- the handle
class AttachHandle:
    """What :func:`attach` returns: the live link between an optimizer and a ledger.

    Attributes:
        ledger: the ledger charged.
        optimizer: the Opacus optimizer.
        steps_charged: real noisy steps admitted through this handle (under
            DDP: global steps, the same on every rank).
        steps_replayed: steps Opacus' accountant had recorded before attach
            (or loaded from a checkpoint without the ledger) and that were
            charged for them.
        exhausted: True once a step was refused (``on_exhausted="stop"``).
        last_refusal: the last :class:`privguard.BudgetExhausted` (``"stop"``).
        distributed: whether the ranks coordinate (DDP).
        aligned_micro_batches: whether accumulated steps are charged with the
            aligned curve (``attach(..., aligned_micro_batches=True)``).

    Use it as a context manager to detach on exit. It cannot be pickled
    (it is a link to a live optimizer): pickle the ledger instead.
    """

    def __init__(self, optimizer: DPOptimizer, ledger: Ledger, rate: Callable[[], float],
                 label: str, on_exhausted: str, coordinator: Coordinator | None,
                 recorder: Any) -> None:
        self.optimizer = optimizer
        self.ledger = ledger
        self.label = label
        self.on_exhausted = on_exhausted
        self.steps_charged = 0
        self.steps_replayed = 0
        self.exhausted = False
        self.last_refusal: BudgetExhausted | None = None
        self.recorder = recorder
        self._rate = rate
        self._coordinator = coordinator
        self._next_ok = True
        self._last_key: tuple[float, float, int] | None = None
        self._last_mechanism: M.Mechanism | None = None
        self.counter: _describe.MicroBatchCounter | None = None  # micro-batches drawn
        self.skips: _skips.SkipCounter | None = None  # micro-batches of skipped steps (u27)
        self.ghost: _ghost.BackwardCounter | None = None  # ghost clipping's backward passes
        self.declared_micro_batches = 1  # what the loop declares (HF, Lightning)
        self.loader_rate: float | None = None  # the data loader's Poisson rate, if known
        self.hook_rate: float | None = None  # the rate of Opacus' own accountant hook, if any
        self._last_micro_batches = 1
        self._active = False
        self._engine: Any = None
        self._engine_accountant: Any = None
        self._view: EngineView | None = None
        self._epochs: _allocation.EpochCharges | None = None  # random allocation: per epoch
        self.witnesses: Witnesses | None = None  # the check stage (attach(..., witnesses=True))
        self.witness_reserve: M.Mechanism | None = None  # δ for their false alarms, charged once
        self._refusal_charged = False  # a step_charged refusal's step was charged (review rwl)
        self.aligned_micro_batches = False  # the user's opt-in to the aligned curve (§14)
        self.dropout_guard: DropoutGuard | None = None  # its per-step re-check
        # a framework callback's own refusals of a step, run with _rank_checks (task adv7)
        self.step_checks: list[Callable[[], None]] = []
        self._awaiting_charge = False  # a real step was noised and not yet seen by _hook
        self._gate: Any = None  # the wrapped optimizer's step pre-hook (_release_gate)
        self._replacing: Any = None  # a step hook that replaced ours, behind _chain (rsmp)
        self._chaining = False  # _chain is calling that hook
        self.drawn: DrawnRates | None = None  # the rates the Poisson loader drew at (smp)
        self.layer_noise: LayerNoise | None = None  # DistributedPerLayerOptimizer's (lo2)
        # rows against the records the loader delivered: batches paired in one backward (adv6)
        self.pairing: PairingCheck | None = None
        # without a data loader: the largest rate of the Opacus accountant hooks seen on the
        # optimizer, which the charged q never falls below (lo2; hooks set later: rlo2)
        self.hook_floor: _HookFloor | None = None

    @property
    def distributed(self) -> bool:
        return self._coordinator is not None

    # Installed last, once every check passed (nothing is changed on refusal).
    def _install(self, privacy_engine: Any) -> None:
        optimizer = self.optimizer
        self._previous_hook = optimizer.step_hook
        self._own_step_attr = vars(optimizer).get("step")  # e.g. an LR scheduler's wrapper
        optimizer.attach_step_hook(self._hook)
        if _describe.is_ghost(optimizer):  # it reports 1: count its backward passes (§14.5)
            self.ghost = _ghost.BackwardCounter(optimizer)
            self.ghost.install()
        self.skips = _skips.SkipCounter(
            optimizer, self._reported, None if self.ghost is None else self.ghost.pre_step,
            real_step=self._expect_charge)
        self.skips.install()
        if LayerNoise.applies(optimizer):  # its noise is drawn at backward (review lo2)
            self.layer_noise = LayerNoise(optimizer)
            self.layer_noise.install()
        self._gate = _release_gate(optimizer, self._unhooked_release)
        if self.witnesses is not None:
            self.witnesses.install(self.counter)
        if self.ghost is None and self.layer_noise is None and self.counter is not None:
            # per-sample rows against the records delivered (adv6; after the witnesses,
            # which give the counter its list of sizes)
            self.pairing = PairingCheck(optimizer, lambda: self.counter)
            self.pairing.install()
        if self.on_exhausted == "stop":
            self._original_step = optimizer.step
            optimizer.step = self._graceful_step  # instance attribute; restored on detach
        if privacy_engine is not None:
            self._engine = privacy_engine
            self._engine_accountant = privacy_engine.accountant
            self._view = EngineView(self, privacy_engine.accountant)
            privacy_engine.accountant = self._view
        self._active = True
        _ATTACHED[optimizer] = self

    # The mechanism of the next real step, read live from the optimizer.
    def next_mechanism(self) -> M.Mechanism:
        """The mechanism the next real step would be charged as.

        k micro-batches accumulated into one step are charged as
        ``AccumulatedSubsampledGaussian(σ, q, k)`` (docs/theory.md §14), k the
        largest of: the batches ``data_loader`` delivered since the last
        step, the optimizer's own count (under ghost clipping the backward
        passes of Opacus' wrapped loss, ``integrations/_ghost.py``), the
        declared accumulation, the micro-batches of the loop's own skipped
        steps (``signal_skip_step``, not ``BatchMemoryManager``'s), and
        (between steps) the last step's k.

        For a :class:`~privguard.integrations.RandomAllocationSampler` loader:
        one epoch, ``RandomAllocation(σ, t)``, charged at the epoch's first
        step only.
        """
        if self._epochs is not None:
            return self._epochs.mechanism(self._sigma())
        return self._mechanism(predict=True)

    def _sigma(self) -> float:
        """The noise multiplier the step is charged at: ``noise_multiplier``, relative to
        the largest clipping bound the step's micro-batches were clipped at.

        Opacus adds noise σ·C with the ``max_grad_norm`` C in force at the real step, but a
        skipped step (``BatchMemoryManager``'s virtual steps, the loop's own
        ``signal_skip_step``) clipped its batch at the C in force then: a C lowered inside
        an accumulation leaves records clipped at C' > C under noise σ·C, which is a
        Gaussian of noise multiplier σ·C/C' (review smp: charged as σ; docs/theory.md §14.7,
        Lemma 14.8). Under ghost
        clipping the batches are clipped in the wrapped loss's backward at the module's own
        ``max_grad_norm``, which a C set on the optimizer alone does not change.
        """
        return self._sigma_and_bound()[0]

    def _sigma_and_bound(self) -> tuple[float, float]:
        """:meth:`_sigma`, and the clipping bound the step is charged at: C′ where the
        records were clipped at a C′ above the noise's C, else C (the noise's std is σ·C,
        the charged σ times this bound). The witnesses check the step against it (task lo3:
        they read ``max_grad_norm``, and a per-layer list raised between backward and step
        made a correctly clipped step, charged at σ·C/C′, fail their clipped-sum check)."""
        optimizer = self.optimizer
        sigma = float(optimizer.noise_multiplier)
        now = _skips.noise_bound(optimizer)
        layer_noise = self.layer_noise
        drawn = None if layer_noise is None else layer_noise.drawn
        if drawn is not None:  # DistributedPerLayerOptimizer: the pair its noise used (lo2)
            sigma, now = drawn
        # the largest clipping bound the skip counter and the ghost counter saw (written
        # out, not as a list: read at every step, issue 26 task hm)
        skips, ghost = self.skips, self.ghost
        clipped = None if skips is None else skips.clip_bound
        other = None if ghost is None else ghost.clip_bound
        if other is not None:  # under ghost clipping also the wrapped module's own bound
            clipped = other if clipped is None else max(clipped, other)
        if clipped is None:
            return sigma, now
        # docs/theory.md §14.7, Lemma 14.8: clipped at C′, noised at σ·C, the step is the
        # Gaussian of noise multiplier σ·C/C′; for C′ ≤ C charging σ over-counts
        return (sigma * now / clipped, clipped) if clipped > now else (sigma, now)

    def _reported(self) -> int | None:
        """The batches the optimizer holds: ``accumulated_iterations``, or under ghost
        clipping the wrapped backward passes since the gradients were cleared (§14.5)."""
        if self.ghost is not None:
            return self.ghost.reported()
        return _describe.reported_micro_batches(self.optimizer)

    def _micro_batches(self, predict: bool) -> int:
        counter, skips = self.counter, self.skips
        counted = 0 if counter is None else counter.count
        reported = self._reported() or 1
        k = max(counted, reported, self.declared_micro_batches)
        if skips is not None:  # the loop's own skipped steps (u27: an iterator made
            k = max(k, skips.floor(reported))  # before attach is not counted above)
        return max(k, self._last_micro_batches) if predict else k

    def _mechanism(self, predict: bool) -> M.Mechanism:
        return self._mechanism_for(self._micro_batches(predict))

    def _mechanism_for(self, micro_batches: int, sigma: float | None = None) -> M.Mechanism:
        """The Poisson step's mechanism for ``micro_batches``; ``sigma``: the step's
        :meth:`_sigma`, read once by the hook (None: read now)."""
        rate = float(self._rate())
        if self.drawn is not None:  # a batch drawn at a larger rate than the one in force
            rate = self.drawn.rate(rate)
        key = (self._sigma() if sigma is None else sigma, rate, micro_batches)
        if key != self._last_key:  # a frozen value object: reuse it while σ, q and k hold
            self._last_mechanism = _describe.step_mechanism(
                *key, aligned=self.aligned_micro_batches)
            self._last_key = key
        assert self._last_mechanism is not None
        return self._last_mechanism

    def can_step(self) -> bool:
        """Whether the ledger would admit the next real step (nothing is charged).

        Under DDP this is the decision all ranks took together at the last
        step (or at attach), for that step's σ and q, so it is the same on
        every rank.
        """
        if self._epochs is not None:  # random allocation: only an epoch's first step charges
            try:
                due = self._epochs.next_due(self._sigma())
            except PrivguardError:
                return False
            if due is not None and self._coordinator is not None:
                return self._next_ok  # decided together at attach or the epoch's last step
            return due is None or self.ledger.can_afford(due)
        if self._coordinator is not None:
            return self._next_ok
        return self.ledger.can_afford(self.next_mechanism())

    def _expect_charge(self) -> None:
        """A real step is about to be noised: its charge must run before its update, and
        before any step hook that replaced ours sees the noisy gradient.

        Review rsmp: a hook set after attach (``optimizer.attach_step_hook(fn)``, Opacus
        calls one) was handed the step uncharged; the release gate then charged it and
        refused it on one process, but under DDP it charged nothing (the charge is a
        collective) and the ranks whose hook was still privguard's waited in that
        collective while this rank entered the gradient ``all_reduce``. Here, before the
        noise, such a hook is put behind :meth:`_chain` for this step: the step is charged
        by :meth:`_hook` (in the step's collective, with every rank), then that hook runs."""
        self._awaiting_charge = True
        hook = self.optimizer.step_hook
        # ours or _chain: a method of this handle (compared by identity: == on a user's
        # callable may be anything)
        own = getattr(hook, "__self__", None) is self and \
            getattr(hook, "__func__", None) in (AttachHandle._hook, AttachHandle._chain)
        if self._active and not own:
            if self.hook_floor is not None:  # an accountant hook set after attach (rlo2)
                self.hook_floor.follow(hook)
            self._replacing = hook
            self.optimizer.step_hook = self._chain

    def _chain(self, optimizer: DPOptimizer) -> None:
        """The step hook for one step whose hook replaced ours (:meth:`_expect_charge`): the
        charge (:meth:`_hook`; a refusal raises before that hook sees the step), then that
        hook, which a call back into :meth:`_hook` (a chained hook) does not charge twice."""
        replacing, self._replacing = self._replacing, None
        optimizer.step_hook = replacing  # the user's hook stays theirs after this step
        self._hook(optimizer)
        if replacing is None:
            return
        self._chaining = True
        try:
            replacing(optimizer)
        finally:
            self._chaining = False

    def _unhooked_release(self, *_: Any) -> None:
        """The wrapped torch optimizer's step pre-hook (:func:`_release_gate`): it is about to
        update after a real step that :meth:`_hook` never saw (review smp: an
        ``optimizer.attach_step_hook(fn)`` after attach replaced the step hook, and every
        later step was released uncharged; since review rsmp such a hook runs behind
        :meth:`_chain`, so this catches one set while the step was noised, after
        :meth:`_expect_charge`), which is refused before the update. The hook
        that replaced ours has seen the step's noisy gradient: the step is charged first
        (not under DDP, whose charge is a collective the other ranks may not be in), so
        whatever that hook kept of it is post-processing of a charged step."""
        if not (self._active and self._awaiting_charge):
            return
        self._awaiting_charge = False
        if self.hook_floor is not None:  # the hook that saw the step: at least its rate (rlo2)
            self.hook_floor.follow(self.optimizer.step_hook)
        try:
            if self._coordinator is None:
                self._charge_step(self.optimizer)
        finally:
            self._discard_step(self.optimizer)
        raise InvalidArgumentError(
            "optimizer.step_hook", check.short(self.optimizer.step_hook),
            "replaced privguard's step hook while this step was noised (after its check; "
            "Opacus calls one hook), so the step was handed to that hook before its charge; "
            "it is charged now and refused before the update. Set a step hook between steps: "
            "privguard then charges each step before that hook sees it")

    def _hook(self, optimizer: DPOptimizer) -> None:
        if self._chaining:  # called back by a hook that replaced ours: charged in _chain
            return
        if self._active:
            self._awaiting_charge = False  # reached: charged below, or refused
            try:
                self._charge_step(optimizer)
            except BaseException:
                # refused (or failed) before the update: the step's clipped sum and noisy
                # gradient are dropped, never noised again into a later step (review bi)
                self._discard_step(optimizer)
                raise
        if self._previous_hook is not None:
            self._previous_hook(optimizer)

    def _discard_step(self, optimizer: DPOptimizer) -> None:
        """Clear what the refused real step accumulated, as a real step's ``zero_grad`` would.

        Opacus' ``pre_step`` had clipped the micro-batches into ``p.summed_grad`` (marked
        processed) and written the noisy ``p.grad`` before calling the hook. After a refusal
        following skipped steps, ``_is_last_step_skipped`` stays True, so ``zero_grad()``
        keeps that sum, and the next real step either noised the refused micro-batches
        again with its own, or (Opacus 1.6) raised a plain ``ValueError`` ("Gradients
        haven't been cleared"). Here every parameter's sum, per-sample and noisy gradient
        is dropped, the optimizer marked as after a real step, and the micro-batch counts
        restart: the next real step holds, and is charged for, only its own micro-batches.
        Nothing of the refused step is released (the parameters were never updated).
        """
        for p in getattr(optimizer, "params", ()):
            for name in ("summed_grad", "grad_sample"):
                if getattr(p, name, None) is not None:
                    setattr(p, name, None)
            p.grad = None
        if hasattr(optimizer, "_is_last_step_skipped"):
            optimizer._is_last_step_skipped = False
        self._restart_counts()

    def _restart_counts(self) -> None:
        """A real step was charged or dropped: every micro-batch count restarts."""
        for count in (self.counter, self.skips, self.ghost, self.drawn, self.layer_noise,
                      self.pairing):
            if count is not None:
                count.take()

    def _charge_step(self, optimizer: DPOptimizer) -> None:
        """Charge the real step about to update the parameters; raises if refused."""
        k = self._micro_batches(predict=False)
        if self._coordinator is None:  # under DDP inside the step's collective
            self._rank_checks()
        # σ read once per step (review lo2; it was read again for the charge after the
        # witnesses' check): Opacus noised the step at σ·C before calling this hook, and
        # nothing between here and the charge changes σ, C or the clip bounds (they change
        # at backward, zero_grad and pre_step; docs/theory.md §14.7)
        sigma, bound = self._sigma_and_bound()
        # the step's mechanism, built once: the witnesses check what the ledger charges
        # (under DDP it is built inside the step's collective, _checked_mechanism)
        single = self._epochs is None and self._coordinator is None
        mechanism = self._mechanism_for(k, sigma) if single else None
        refused: PipelineMismatchError | None = None
        if self.witnesses is not None:  # check stage: raises PipelineMismatchError
            try:
                self._check_witnesses(k, mechanism, sigma, bound)
            except PipelineMismatchError as exc:
                # Review rwl: a refusal that is a function of the step's noisy gradient
                # (the precision guard; its probability is not bounded on every dataset,
                # Proposition 16.1) is charged as the step first, once: it is then a
                # post-processing of the step's release. The step is still not applied
                if not exc.step_charged or self._refusal_charged:
                    raise
                refused = exc
                # a charge refused below (BudgetExhausted) releases nothing of the step:
                # the refusal is not kept for the next step then
                self.witnesses.failure = None
        if self._epochs is not None:  # random allocation: the whole epoch at its first step
            if self._coordinator is None:
                due = self._allocation_due(k, sigma)
            else:  # a refusal on one rank is every rank's (task hl: the others waited in the
                # gradient all_reduce until the process group's timeout)
                # (and every rank's σ and epochs to charge are alike: review rhl, rank 0
                # adds the noise and each charger charged its own σ)
                # (review ir2: the ghost and dropout checks, which a Poisson step runs in
                # its own collective, _checked_mechanism, ran on no path here: an unclipped
                # ghost step was applied and its epoch charged as clipped)
                due = self._coordinator.together(
                    lambda: self._allocation_due(k, sigma, checked=True),
                    "while checking a random-allocation step",
                    lambda due: (sigma, 0 if due is None else due.epochs))
            if due is not None and self._coordinator is not None:  # DDP: once, together
                _allocation.charge_together(self._coordinator, self.ledger, due, self.label)
            elif due is not None:
                self.ledger.charge(due, label=self.label)
            self._epochs.done(sigma, due)
            if self._coordinator is not None and \
                    self._epochs.steps_in_epoch >= self._epochs.sampler.steps_per_epoch:
                # the epoch's last step, reached on every rank together: whether the next
                # epoch fits is one decision for all ranks (should_stop alike everywhere)
                nxt = self._epochs.mechanism(sigma)
                self._next_ok = self._coordinator.all_fit(lambda: self.ledger.can_afford(nxt))
        elif self._coordinator is None:
            assert mechanism is not None
            self.ledger.charge(mechanism, label=self.label)
        else:
            # the ranks agree on σ, q and k before the charge; k: the largest rank's (rgc)
            self._next_ok, k = self._coordinator.step(
                lambda micro_batches: self._checked_mechanism(micro_batches, sigma), k,
                self.label)
        if self.witness_reserve is not None:  # once, after the first step fixed the plan
            self._charge_reserve()
        self.steps_charged += 1
        self._last_micro_batches = k
        self._restart_counts()
        if refused is not None and self.witnesses is not None:  # charged, not applied
            self.witnesses.failure, self._refusal_charged = refused, True
            raise refused

    def _allocation_due(self, k: int, sigma: float, checked: bool = False
                        ) -> M.RandomAllocation | None:
        """The epoch a random-allocation step must charge first (None: its epoch is charged);
        raises if the step is refused (k > 1 micro-batches, σ changed inside the epoch, more
        steps than batches, a batch not of the loader). ``checked`` (under DDP, inside the
        step's collective): the aligned opt-in's dropout and the ghost checks first, as
        :meth:`_checked_mechanism` runs them for a Poisson step (review ir2)."""
        assert self._epochs is not None
        if checked:
            self._rank_checks()
        if k > 1:
            raise _accumulated_allocation(k)
        return self._epochs.pending(sigma)

    def _check_witnesses(self, k: int, mechanism: M.Mechanism | None, sigma: float,
                         bound: float) -> None:
        """The check stage: this rank's witnesses; under DDP the refusal is taken together.

        ``mechanism``: the step's ``_mechanism_for(k)`` where the hook already built it;
        ``sigma`` and ``bound``: the step's σ and the clipping bound it is charged at, read
        together once by the hook (:meth:`_sigma_and_bound`).
        """
        assert self.witnesses is not None
        witnesses = self.witnesses
        witnesses.charged_bound = bound
        if mechanism is None:
            mechanism = (self._epochs.mechanism(sigma) if self._epochs is not None
                         else self._mechanism_for(k, sigma))
        if self._coordinator is None:
            witnesses.check(mechanism)
            return
        try:
            self._coordinator.check_together(lambda: witnesses.check(mechanism))
        except PipelineMismatchError as exc:  # every later step is refused on every rank
            witnesses.failure = witnesses.failure or exc
            raise

    def _checked_mechanism(self, micro_batches: int, sigma: float | None = None
                           ) -> M.Mechanism:
        """Under DDP, the step's mechanism after the aligned opt-in's dropout re-check
        (integrations/_aligned.py), inside the step's own collective: a refusal on one
        rank stops every rank before any charge, at no extra collective."""
        self._rank_checks()
        return self._mechanism_for(micro_batches, sigma)

    def _rank_checks(self) -> None:
        """This process's refusals of the step, before anything is charged: the
        ghost-clipping check (an unclipped gradient, a batch added twice) and the aligned
        opt-in's dropout re-check (dropout switched on since attach). Under DDP they run
        inside the step's collective (:meth:`_checked_mechanism`, and the random-allocation
        step's :meth:`Coordinator.together`), so a refusal on one rank is every rank's.
        Review radv3: first, Opacus' ghost-clipping adaptive criterion, seen only once its
        backward has set the optimizer's ``_adjusted_noise_multiplier`` (or that attribute
        set by hand), integrations/_adaptive_clipping.py; its optimizer is a ghost-clipping
        one, which always has a backward counter (attach refused the other adaptive
        optimizers by their class). Review radv4: the one step check of adaptive clipping
        (task adv4's copy in ``BackwardCounter.check`` is gone)."""
        if self.ghost is not None:
            refuse_adjusted_noise(self.optimizer)
            self.ghost.check(self.steps_charged + 1)
        for check_step in self.step_checks:  # e.g. Lightning's batches (_reused_batches):
            check_step()  # a trainer's own count first, its message names the trainer's remedy
        pairing = self.pairing  # batches paired in one backward (adv6, §14.9): a marked
        if pairing is not None and pairing.failure is not None:  # clip, else no call (hk3)
            pairing.check(self.steps_charged + 1)
        if self.dropout_guard is not None:
            self.dropout_guard.check()

    def _charge_reserve(self) -> None:
        """Charge the witnesses' δ reserve once (under DDP once per distinct ledger)."""
        reserve, label = self.witness_reserve, "witnesses: δ set aside for false alarms"
        assert reserve is not None
        if self._coordinator is None:
            self.ledger.charge(reserve, label=label)
        else:
            self._coordinator.charge_once(self.ledger, reserve, label,
                                          "charging the witnesses' δ reserve",
                                          f"charge {label!r} of {reserve!r} refused")
        self.witness_reserve = None

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
        if self.witnesses is not None and self.witnesses.failure is not None:
            return True  # a witness refused a step: every later step is refused too
        return self.exhausted or not self.can_step()

    def detach(self) -> None:
        """Stop charging; restore the optimizer's previous hook and step, and the engine's
        accountant. Budget already charged stays charged."""
        if not self._active:
            return
        self._active = False
        if self.witnesses is not None:
            self.witnesses.uninstall()
        if self.optimizer.step_hook == self._chain:  # a step that never reached its hook
            self.optimizer.step_hook, self._replacing = self._replacing, None
        if self.optimizer.step_hook == self._hook:
            self.optimizer.step_hook = self._previous_hook
        # else: another hook wraps ours; ours stays in its chain as a pass-through.
        if vars(self.optimizer).get("step") == self._graceful_step:
            if self._own_step_attr is None:
                del self.optimizer.step
            else:
                self.optimizer.step = self._own_step_attr
        if self._engine is not None and self._engine.accountant is self._view:
            self._engine.accountant = self._engine_accountant
        if _ATTACHED.get(self.optimizer) is self:
            del _ATTACHED[self.optimizer]
        if self.counter is not None:
            self.counter.restore()
        if self.drawn is not None:
            self.drawn.restore()
        if self.skips is not None:
            self.skips.restore()
        if self._gate is not None:
            self._gate.remove()
            self._gate = None
        if self.ghost is not None:
            self.ghost.restore()
        if self.layer_noise is not None:
            self.layer_noise.restore()
        if self.pairing is not None:
            self.pairing.restore()

    # -------------------------------------------------------- recorded steps
    def _charge_recorded(self, current: History, held: History | None, label: str, *,
                         from_entry: bool, stacklevel: int,
                         error: PrivguardError | None = None) -> None:
        """Charge the steps of ``current`` (Opacus' record) beyond ``held`` (the ledger's).

        Under DDP this is collective: every rank runs it, and ``error`` (a
        failure found before it on this rank) stops every rank alike.
        """
        todo = steps_beyond(current, held or [])
        if todo is None and error is None:
            error = LedgerStateError(
                f"Opacus' accountant history ({total_steps(current)} steps) does not extend "
                f"the one saved with the ledger ({total_steps(held or [])} steps): they come "
                "from different runs; load the engine's accountant and the ledger from the "
                "same checkpoint")
        if self._coordinator is None:
            if error is not None:
                raise error
            if not todo:
                return
        todo = todo or []
        n = total_steps(todo)
        if n and error is None and not from_entry and len(self.ledger.history) > 0:
            warnings.warn(
                f"charging the {n} steps Opacus' accountant recorded (label {label!r}) to a "
                f"ledger that already holds {len(self.ledger.history)} charges. If those "
                "include these steps (resuming with the same ledger file), they are now "
                "counted twice (safe, but budget is lost): attach with privacy_engine= so "
                "checkpoints carry the ledger, and resume with attach(..., resume=checkpoint)",
                AccountantWarning, stacklevel=stacklevel + 1)
        self.steps_replayed += replay(self.ledger, todo, label, self._coordinator, error, attach_label=REPLAY_LABEL,
                                     base_rate=self._recorded_base_rate(),
                                     aligned=self.aligned_micro_batches)

    def _recorded_base_rate(self) -> float | None:
        """The q Opacus' records multiply by the micro-batches of an accumulated step: the
        loader's, else the rate Opacus' own hook on the optimizer was created with (review
        smp: without data_loader, a step of k draws recorded at k·q was charged as one
        SubsampledGaussian(σ, k·q), an under-count, docs/theory.md §14)."""
        return self.loader_rate if self.loader_rate is not None else self.hook_rate

    def __getstate__(self) -> dict:
        raise InvalidArgumentError(
            "handle", repr(self), "is a live link to one optimizer and cannot be pickled or "
            "copied; pickle the ledger (handle.ledger) and attach again after loading")

    def __enter__(self) -> AttachHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self._active else "detached"
        return f"AttachHandle({state}, {self.steps_charged} steps charged, {self.ledger!r})"


def _release_gate(optimizer: DPOptimizer, check_release: Callable[..., None]) -> Any:
    """``check_release`` as a step pre-hook of the wrapped torch optimizer (run before it
    updates anything); its removable handle, or None where the wrapped optimizer has no
    ``register_step_pre_hook`` (not a torch Optimizer)."""
    register = getattr(getattr(optimizer, "original_optimizer", None),
                       "register_step_pre_hook", None)
    if not callable(register):
        return None
    return register(check_release)


def _entry_from(resume: Any) -> dict:
    """The privguard entry in ``resume``: a checkpoint, an accountant state, or the entry."""
    if isinstance(resume, dict):
        for candidate in (resume, resume.get("privguard"),
                          (resume.get("privacy_accountant_state_dict") or {}).get("privguard")):
            if is_entry(candidate):
                assert isinstance(candidate, dict)
                return candidate
    raise InvalidArgumentError(
        "resume", type(resume).__name__,
        "must be the checkpoint engine.load_checkpoint returned (or its "
        "'privacy_accountant_state_dict') from a run attached with privacy_engine=; this one "
        "holds no privguard ledger entry. Without one, attach charges the steps Opacus' "
        "accountant recorded")


def _called_rate(fn: Callable[[], Any]) -> float:
    """What a ``sample_rate=`` callable returns, checked as ``sample_rate`` is (review bd:
    float() took "0.1" and True, and let None, a huge int or a tensor of several values
    raise built-ins). A 0-d tensor or numpy scalar stands for its number."""
    value = fn()
    # a numpy or torch bool (np.True_, torch.tensor(True)) is a bool too: float() made it
    # q = 1, where sample_rate=np.True_ is refused (review rbd)
    if value is None or isinstance(value, (str, bytes, bool)) or str(
            getattr(value, "dtype", "")) in ("bool", "torch.bool"):
        raise InvalidArgumentError("sample_rate", value, "the callable must return a real "
                                   "number in (0, 1]")
    try:
        q = float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):  # RuntimeError: torch's
        raise InvalidArgumentError("sample_rate", check.short(value), "the callable must "
                                   "return a real number in (0, 1]") from None
    return check.sample_rate("sample_rate", q)


def _against_loader(q: float, loader: Any) -> float:
    """The q to charge for ``q``, set by hand: :func:`_samplers.check_hand_rate` against the
    Poisson rate ``loader`` samples at now (none: ``loader`` is None or its sampler not
    Poisson), which refuses a q further from it than float32 rounding and returns the larger
    of the two (review lo2: a rate within float32 rounding of the loader's was refused). A
    Poisson sampler whose ``sample_rate`` is no longer a rate in (0, 1] (or not a plain
    float: numpy's float32, a tensor, which the sampler still draws at) is read as the
    number it stands for, and refused where there is none."""
    sampler = None if loader is None else getattr(loader, "batch_sampler", None)
    if type(sampler).__name__ not in _samplers.ACCOUNTED:
        return q
    value: Any = getattr(sampler, "sample_rate", None)
    try:
        live = float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        live = math.nan
    if not 0 < live <= 1:
        raise InvalidArgumentError(
            "data_loader", f"{type(sampler).__name__}(sample_rate={check.short(value)})",
            "samples at no rate in (0, 1] that the charge could be checked against")
    return _samplers.check_hand_rate("sample_rate", q, live)


class _HookFloor:
    """The largest rate of the Opacus accountant hooks seen on the optimizer: the one at
    attach, then any set later (``optimizer.attach_step_hook``), which privguard finds before
    it charges the step that hook sees (review rlo2: the rate was read once, at attach, and a
    hook at 4q set afterwards recorded 4q while the ledger charged q). It only grows."""

    def __init__(self, rate: float | None) -> None:
        # a NaN rate is no floor (review ir3: kept, no later rate compared above it, and a
        # hook at 4q set after attach was charged the hand q)
        self.rate = rate if rate is None or rate == rate else None

    def follow(self, hook: Any) -> None:
        """Raise the floor to the rate of the Opacus accountant hook in ``hook``, if larger."""
        _accountant, rate = find_opacus_hook(hook)
        if rate is not None and (self.rate is None or rate > self.rate):
            self.rate = rate


def _at_least_hook(q: float, hook_rate: float | None) -> float:
    """``q``, set by hand without a data loader, raised to the rate Opacus' own accountant
    hook records each step at (review lo2: ``sample_rate=q/100`` against a hook at q was
    charged q/100, below what Opacus' accountant reports). A hook's rate is fixed when
    make_private creates it (a closure constant of ``get_optimizer_hook_fn``), but the hook
    may be replaced: ``hook_rate`` is the largest of those seen (:class:`_HookFloor`). The larger is charged, not refused: a smaller hand rate may be right (the
    hook was made for another loader), a larger one always covers the step, and the charge
    never falls below Opacus' own account (a larger q is a garbling-dominated over-count,
    docs/theory.md §2b Lemma 1, step 3)."""
    return q if hook_rate is None else max(q, hook_rate)


def _warn_below_hook(q: float, hook_rate: float | None) -> None:
    """Warn at attach that a hand-set q below Opacus' hook's rate is charged at the hook's."""
    if hook_rate is not None and q < hook_rate and not _samplers.within_float32(q, hook_rate):
        warnings.warn(  # the rates as charged, never rounded (review rfp)
            f"sample_rate={exact(q)} is below the rate Opacus' accountant hook on this "
            f"optimizer records each step at ({exact(hook_rate)}); the steps are charged at "
            f"{exact(hook_rate)}, so "
            "the ledger never reports less than Opacus' own accountant. Pass data_loader= to "
            "charge the rate the loader samples at", AccountantWarning, stacklevel=3)


def _rdp_warning(kind: str, ledger: Ledger, mech: M.SubsampledGaussian,
                 planned_steps: int | None) -> str:
    """The PRV/GDP warning text, with what the plan costs by RDP."""
    q = mech.sample_rate
    # an epoch's steps, at most 2⁵³ (a subnormal q made 1/q inf: OverflowError, review bd)
    steps = planned_steps or max(1, math.ceil(min(1.0 / q, check.MAX_STEPS) - 1e-9))
    name = kind.upper() + (" (Opacus' default)" if kind == "prv" else "")
    text = (f"the engine's accountant is {name}, but privguard's ledger accounts in RDP, "
            "which gives a larger ε for the same noise and sampling: the ledger's ε and its "
            f"filter will not match the engine's {kind.upper()} numbers (a σ that "
            f"make_private_with_epsilon calibrated by {kind.upper()} reaches the ledger's "
            "target in fewer steps).")
    if ledger.delta is not None:
        probe = Ledger(delta=ledger.delta, orders=ledger.orders)
        probe.charge(M.SubsampledGaussian(mech.noise_multiplier, q, steps=steps))
        what = "the planned" if planned_steps else "one epoch of"
        # σ and q as stated (a σ printed rounded down or a q rounded up has a larger ε than
        # the one printed; task fp)
        text += (f" By RDP, σ = {exact(mech.noise_multiplier)} and q = {exact(q)} over {what} "
                 f"{steps} steps give ε = {upper(probe.nonadaptive_epsilon(), '.4g')} at δ = "
                 f"{exact(ledger.delta)} (running ε, valid at any stopping time: "
                 f"{upper(probe.epsilon(), '.4g')}; rounded up).")
    left = None if ledger.target is None else ledger.remaining(mech).repeats
    if ledger.target is not None and left is not None:  # a float for a mechanism queried
        text += (f" The ledger's filter (ε = {exact(ledger.target[0])}, "
                 f"δ = {exact(ledger.target[1])}) "
                 f"admits {whole_count(left)} more such steps.")
    text += (" To keep pace with PRV, declare the plan and use the hybrid filter, "
             "Ledger(epsilon, delta, plan=Plan(step, steps), filter='hybrid'), which admits "
             "the steps PRV calibrated for while the run follows its plan (docs/theory.md §2b); "
             "or calibrate with PrivacyEngine(accountant='rdp').")
    return text


def _check_records(loader: Any, optimizer: Any, ledger: Ledger) -> None:
    """Refuse a Poisson loader whose q is not each record's rate under DDP; warn when q is
    honest but far above the batch the user's own loader had (Opacus #813)."""
    if is_distributed(optimizer):
        import torch.distributed as dist

        mismatch = _samplers.distributed_mismatch(loader, dist.get_world_size())
        if mismatch is not None:
            raise NonPoissonSamplingError("data_loader", type(loader).__name__, mismatch)
    q = _sampling.poisson_rate(loader)
    meant = None if q is None else _provenance.unintended_rate(loader, q)
    if q is not None and meant is not None:
        sigma = float(getattr(optimizer, "noise_multiplier", 0) or 0)
        warnings.warn(_provenance.warning_text(loader, q, *meant, sigma, ledger),
                      SampleRateWarning, stacklevel=3)


# --------------------------------------------------------------------------- attach
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
    resume: Any = None,
    planned_steps: int | None = None,
    micro_batches: int | None = None,
    witnesses: bool = False,
    aligned_micro_batches: bool = False,
    model: Any = None,
) -> AttachHandle:
    """Charge every real noisy step of ``optimizer`` to ``ledger``.

    Args:
        optimizer: an Opacus ``DPOptimizer`` (from ``make_private``,
            ``make_private_with_epsilon`` or built directly), not yet attached.
        ledger: the privguard ledger to charge.
        sample_rate: the Poisson sampling rate, or a callable returning the
            rate in force (for a policy that changes the batch size). Default:
            the rate of ``data_loader`` if given, else the rate Opacus' own
            accountant hook on this optimizer was created with. With a
            Poisson ``data_loader`` (and ``check_poisson``), a rate given here
            that differs from the loader's own at any step (read live) is
            refused with :class:`InvalidArgumentError` before the step updates.
        data_loader: the training data loader; checked for Poisson sampling
            and used for the sample rate (read live each step). Something with
            none of ``batch_sampler``, ``sampler``, ``dataset`` (a str, a
            list, a number) is refused with :class:`InvalidArgumentError`, in
            either ``check_poisson`` mode.
        label: label of each charge in the ledger's journal.
        on_exhausted: ``"raise"`` (default): a refused step raises
            :class:`privguard.BudgetExhausted` out of ``optimizer.step()``;
            ``"stop"``: the step returns None without updating and
            ``handle.exhausted`` becomes True. Either way the parameters are
            left exactly as they were.
        privacy_engine: the ``PrivacyEngine``; its accountant is replaced
            (until detach) by a view that reports the ledger's ε
            (``engine.get_epsilon(delta)``) and puts the ledger's entry into
            ``engine.save_checkpoint`` next to Opacus' own accountant state.
            Under ghost clipping, Opacus' adaptive ``PrivacyEngineAdaptiveClipping``
            (or an optimizer carrying its ``_adjusted_noise_multiplier``) is refused
            with :class:`InvalidArgumentError` (``integrations/_adaptive_clipping.py``).
        check_poisson: check ``data_loader`` for Poisson sampling (default
            True; without ``data_loader`` a warning says it was not checked).
            ``False`` is the documented opt-out: you accept that the reported
            ε does not hold if the batches are not Poisson-sampled.
        resume: when resuming in Opacus' order ``make_private →
            engine.load_checkpoint → attach``: the checkpoint
            ``engine.load_checkpoint`` returned. The ledger is brought to the
            checkpoint's journal (an in-memory ledger loads it; a file-backed
            ledger must be the same file) and the steps the checkpoint's
            accountant holds are not charged again.
        planned_steps: the number of steps the run plans; only used to say
            what they cost by RDP when the engine's accountant is PRV or GDP.
        micro_batches: the Poisson micro-batches the loop accumulates into
            each step, where it declares them (Hugging Face's
            ``gradient_accumulation_steps``). Steps are charged with at least
            this many; privguard also counts the batches ``data_loader``
            delivers, the per-sample gradients the optimizer holds and the
            micro-batches of steps the loop skipped with
            ``signal_skip_step``, and charges the largest (docs/theory.md
            §14, §14.4).
        witnesses: check every step against its charge before charging it
            (noise, clipping, and with ``data_loader`` sampling;
            ``integrations/_witnesses.py``). A mismatch raises
            :class:`privguard.PipelineMismatchError` out of
            ``optimizer.step()`` with the parameters untouched and nothing
            charged (except a step whose gradients' dtype cannot hold the noise:
            that refusal depends on the noisy gradient, so its step is charged
            first, ``step_charged``; docs/theory.md §16.2), and every later
            step is refused too. Needs a ledger
            with an (ε, δ) target: with the first step a
            :class:`~privguard.mechanisms.DeltaReserve` is charged that sets
            0.1% of δ aside for the witnesses' false alarms, so the
            witnessed run keeps the target (docs/theory.md §16.2). Off by
            default (its cost, README "Does my pipeline do what I charge?").
            Under DDP the noise witness runs on rank 0, each rank tests the
            batch sizes its Opacus distributed sampler yields (zero-truncated
            binomial draws from its shard; no per-record counts), and a
            refusal is taken on every rank.
        aligned_micro_batches: opt in to the aligned accumulation curve:
            steps of k > 1 micro-batches are charged as
            ``AccumulatedSubsampledGaussian(σ, q, k, aligned=True)``
            (docs/theory.md §14; also the steps Opacus recorded before
            attach), often much tighter than the default ``aligned=False``
            (§14.2), and the only accumulated step a hybrid filter's plan
            covers (§2b.1). Your assertion that each example's clipped
            gradient is the same vector in every micro-batch of a step (no
            dropout or other per-draw randomness in training mode, no
            augmentation drawn per micro-batch). Needs ``model=``; k = 1
            steps are unchanged. Off by default.
        model: the module being trained (the Opacus optimizer holds no
            reference to it), used by the aligned opt-in only: it must hold
            every parameter the optimizer trains, and a dropout layer of it
            in training mode with a rate > 0 is refused at attach and
            before every step's charge
            (``integrations/_aligned.py`` says what it cannot see).

    Returns:
        An :class:`AttachHandle`; ``handle.detach()`` restores the optimizer.

    Raises:
        InvalidArgumentError: bad arguments, no way to know the sample rate,
            or the optimizer is already attached (or charged by a
            :class:`LedgerAccountant`), or clips adaptively (Opacus'
            ``AdaClipDPOptimizer``, docs/theory.md §14.8), or ``data_loader``
            makes up a record for an empty batch (``rand_on_empty=True``).
        NonPoissonSamplingError: ``data_loader`` does not do Poisson sampling,
            or a ghost-clipping optimizer (which reports one micro-batch per
            step whatever ran) comes with neither ``data_loader`` nor
            ``micro_batches``, so the micro-batches per step cannot be known.
        BudgetExhausted: the steps Opacus recorded before attach do not fit;
            nothing was charged and nothing attached.
        LedgerStateError: ``resume`` does not match the ledger or the
            engine's accountant; under DDP, :class:`RankDisagreementError`
            when the ranks' ledgers are not replicas.

    Example:
        >>> import torch, warnings
        >>> from opacus.optimizers import DPOptimizer
        >>> from privguard import Ledger
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> opt = DPOptimizer(torch.optim.SGD([w], lr=0.1), noise_multiplier=1.0,
        ...                   max_grad_norm=1.0, expected_batch_size=8)
        >>> handle = attach(opt, Ledger(delta=1e-5), sample_rate=0.01, check_poisson=False)
        >>> handle.next_mechanism()
        SubsampledGaussian(noise_multiplier=1.0, sample_rate=0.01, steps=1)
        >>> handle.detach()
    """
    # ---- every check first: a refused attach changes nothing
    if not isinstance(optimizer, DPOptimizer):
        raise InvalidArgumentError("optimizer", type(optimizer).__name__,
                                   "must be an Opacus DPOptimizer (see PrivacyEngine.make_private)")
    if not isinstance(ledger, Ledger):
        raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
    # tasks adv3, adv4: its step is not the charge (§14.8); an adaptive engine names
    # privacy_engine (its type is not checked yet: an engine of another type is not one)
    refuse_adaptive_clipping(optimizer, privacy_engine)
    refuse_insecure(optimizer)  # secure_mode without its generator (adv6)
    if not isinstance(on_exhausted, str) or on_exhausted not in ("raise", "stop"):  # review fs
        raise InvalidArgumentError("on_exhausted", on_exhausted, "must be 'raise' or 'stop'")
    if label is not None and not isinstance(label, str):
        raise InvalidArgumentError("label", label, "must be a string or None")
    check.flag("check_poisson", check_poisson)
    if data_loader is not None:  # review rnw: a str or a list is no loader, in either mode
        _sampling.check_loader("data_loader", data_loader)
    if planned_steps is not None:
        planned_steps = check.positive_int("planned_steps", planned_steps, maximum=check.MAX_STEPS)
    # the accumulated step's own bound, at attach (review bi: a larger one was attached and
    # every step then refused with InvalidArgumentError)
    declared = 1 if micro_batches is None else check.positive_int(
        "micro_batches", micro_batches, maximum=MAX_MICRO_BATCHES)
    if _describe.is_ghost(optimizer) and data_loader is None and micro_batches is None:
        raise NonPoissonSamplingError(
            "data_loader", None,
            "is needed with a ghost-clipping optimizer (grad_sample_mode='ghost'): it reports "
            "one micro-batch per step whatever the loop accumulated, so privguard counts the "
            "micro-batches the loader delivers between steps; pass data_loader= (or "
            "micro_batches= if the loop accumulates a fixed number)")
    if _describe.is_ghost(optimizer):
        _ghost.check_torch(optimizer)  # task gz: its per-gradient check needs torch >= 2.1
    check.flag("witnesses", witnesses)
    if witnesses:
        reserve_for(ledger)  # raises before anything changes: no (ε, δ) target
    aligned = check.flag("aligned_micro_batches", aligned_micro_batches)
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    check_model(model)
    guard = guard_for(model, parameters=trained) if aligned else None
    if getattr(optimizer, "_is_last_step_skipped", False) is True:  # u27, integrations/_skips.py
        raise InvalidArgumentError(
            "optimizer", type(optimizer).__name__,
            "is in the middle of an accumulation: its last step() was skipped "
            "(signal_skip_step), so the clipped sum the next real step noises holds micro-batches "
            "attach cannot count; attach before a step's first micro-batch or right after a "
            "real step")
    if LayerNoise.applies(optimizer) and LayerNoise.pending(optimizer):
        raise InvalidArgumentError(
            "optimizer", type(optimizer).__name__,
            "is in the middle of a step: it drew this step's noise in its backward hooks, "
            "before attach, at a noise multiplier attach cannot know (the step would be "
            "charged at the one in force at step()); attach before backward(), or after "
            "step() or zero_grad()")
    previous = _ATTACHED.get(optimizer)
    if previous is not None and previous._active:
        raise InvalidArgumentError(
            "optimizer", type(optimizer).__name__,
            f"already has a ledger attached ({previous!r}); keep using that handle, or call "
            "its detach() first: attaching twice would charge every step twice")
    if privacy_engine is not None and not isinstance(getattr(privacy_engine, "accountant", None),
                                                     IAccountant):
        raise InvalidArgumentError("privacy_engine", type(privacy_engine).__name__,
                                   "must be an Opacus PrivacyEngine (with an accountant)")
    if privacy_engine is not None and isinstance(privacy_engine.accountant, EngineView):
        raise InvalidArgumentError(
            "privacy_engine", type(privacy_engine).__name__,
            "already reports a ledger attached to another optimizer; detach that handle first")
    hook_accountant, hook_rate = find_opacus_hook(optimizer.step_hook)
    engine_accountant = None if privacy_engine is None else privacy_engine.accountant
    for acc in (hook_accountant, engine_accountant):
        if isinstance(acc, LedgerAccountant) and acc._charge:
            raise InvalidArgumentError(
                "optimizer", type(optimizer).__name__,
                "is already charged to a ledger by a LedgerAccountant in the engine; use "
                "either that or attach(), not both (each step would be charged twice)")
    recorder = hook_accountant if hook_accountant is not None else engine_accountant
    sampler = None if data_loader is None else _allocation.allocation_sampler(data_loader)
    if sampler is not None:  # random allocation: charged per epoch (docs/theory.md §15)
        _allocation.check_attach(sampler, ledger, sample_rate=sample_rate, resume=resume,
                                 distributed=is_distributed(optimizer),
                                 recorded=total_steps(history_of(recorder)))
        sample_rate = 1.0 / sampler.steps_per_epoch  # Opacus' own view; not what is charged
        if declared > 1:
            raise _accumulated_allocation(declared)

    if data_loader is not None:  # review radv4: also without the Poisson check, or allocated
        _sampling.refuse_rand_on_empty(data_loader)
    if data_loader is not None and check_poisson and sampler is None:
        _sampling.check_poisson(data_loader)
        _check_records(data_loader, optimizer, ledger)  # issue 27: q against the records
    # review smp: a q given by hand (a number or a callable) is checked against the Poisson
    # loader's own rate at every step, not only at attach: a callable returning less than
    # the loader's q, or a loader whose sample_rate was raised after attach, was charged the
    # smaller q (check_hand_rate: InvalidArgumentError before the step updates anything)
    live = data_loader if data_loader is not None and check_poisson else None
    # review lo2: without a loader, a q given by hand is charged at least at the rate of
    # Opacus' own accountant hook (a callable's at every step)
    # (and of a hook set after attach, review rlo2: _HookFloor, read at every step)
    floor = _HookFloor(hook_rate) if data_loader is None else None
    if callable(sample_rate):
        given = sample_rate
        rate: Callable[[], float] = lambda: _at_least_hook(
            _against_loader(_called_rate(given), live), None if floor is None else floor.rate)
    elif sample_rate is not None:
        fixed = _against_loader(check.sample_rate("sample_rate", sample_rate), live)
        _warn_below_hook(fixed, hook_rate if floor is not None else None)
        rate = lambda: _at_least_hook(_against_loader(fixed, live),
                                      None if floor is None else floor.rate)
    elif data_loader is not None:
        if _sampling.poisson_rate(data_loader) is not None:
            rate = lambda: float(data_loader.batch_sampler.sample_rate)
        else:  # check_poisson=False on a non-Poisson loader: its nominal rate
            nominal = _sampling.nominal_rate("data_loader", data_loader)
            rate = lambda: nominal
    elif hook_rate is not None:
        assert floor is not None  # no data loader here
        found, follows = hook_rate, floor
        rate = lambda: _at_least_hook(found, follows.rate)
    else:
        raise InvalidArgumentError(
            "sample_rate", None,
            "cannot be inferred: pass sample_rate=... or data_loader=... (no Opacus "
            "accountant hook is attached to this optimizer)")
    entry = None if resume is None else _entry_from(resume)

    # ---- distributed: from here on every rank takes the same decisions
    local_error: PrivguardError | None = None
    if entry is not None:
        try:
            restore(ledger, entry, where="resume")
        except PrivguardError as exc:
            local_error = exc
    coordinator = None
    if is_distributed(optimizer):
        coordinator = Coordinator(ledger, local_error)  # collective; raises on every rank alike
    elif local_error is not None:
        raise local_error
    if data_loader is None and check_poisson:
        _sampling.warn_unverified(stacklevel=2)

    handle = AttachHandle(optimizer, ledger, rate, label, on_exhausted, coordinator, recorder)
    handle.declared_micro_batches = declared
    handle.aligned_micro_batches = aligned
    handle.dropout_guard = guard if sampler is None else None  # no accumulation there
    handle.loader_rate = None if data_loader is None else _sampling.poisson_rate(data_loader)
    handle.hook_rate = hook_rate
    handle.hook_floor = floor
    if sampler is not None:
        handle._epochs = _allocation.EpochCharges(sampler)
    if witnesses:  # ---- witnesses (issue 28): the check stage of the hook
        dataset = getattr(data_loader, "dataset", None)
        try:
            size = None if dataset is None else len(dataset)
        except TypeError:
            size = None
        with _SIZING:  # sized and held in one block: another thread's attach
            alpha, handle.witness_reserve = reserve_for(ledger)  # waits (docs/theory.md §16.2)
            if coordinator is None:  # later attaches on this ledger count it (task wr2, 16.4b)
                hold(handle)
        if ledger._acc.config.filter == "hybrid":
            warnings.warn("witnesses=True with the hybrid filter: the δ reserve for the "
                          "witnesses' false alarms is not the plan's step, so the run leaves its "
                          "plan and the filter falls back to RDP (docs/theory.md §16.2)",
                          AccountantWarning, stacklevel=2)
        # DDP: only rank 0 adds noise; each rank samples its own shard, and Opacus' distributed
        # sampler skips empty draws: the sampling witness tests each rank's zero-truncated
        # draws (integrations/_shard.py), without the per-record counts
        handle.witnesses = Witnesses(optimizer, size if coordinator is None else None,
                                     false_alarm=alpha,
                                     loader=data_loader if sampler is None and coordinator is None
                                     else None,
                                     allocation=sampler if coordinator is None else None,
                                     noise=coordinator is None or optimizer.rank == 0,
                                     shard_loader=None if coordinator is None or sampler is not None
                                     else data_loader,
                                     together=coordinator is not None)
    if recorder is not None:
        held = None if entry is None else [tuple(r) for r in entry.get("accountant_history") or []]
        try:
            current, recorded_error = history_of(recorder), None
        except LedgerStateError as exc:  # a malformed record: raised on every rank alike
            current, recorded_error = [], exc
        handle._charge_recorded(current, held, REPLAY_LABEL, from_entry=entry is not None,
                                stacklevel=2, error=recorded_error)
    kind = getattr(recorder, "mechanism", lambda: None)()
    if kind in ("prv", "gdp") and ledger._acc.config.filter != "hybrid" and sampler is None:
        # (a hybrid filter keeps pace with PRV on plan: nothing to warn about)
        try:
            mech = handle.next_mechanism()
        except PrivguardError:
            mech = None
        if isinstance(mech, M.SubsampledGaussian):
            warnings.warn(_rdp_warning(kind, ledger, mech, planned_steps), AccountantWarning,
                          stacklevel=2)
    if getattr(optimizer, "noise_multiplier", 0) == 0:
        warnings.warn("optimizer.noise_multiplier is 0: no privacy; every step will raise "
                      "InvalidArgumentError before it updates anything", stacklevel=2)
    if coordinator is not None:
        handle._next_ok = coordinator.all_fit(lambda: ledger.can_afford(handle.next_mechanism()))
    handle.counter = _describe.counter_for(data_loader)
    if handle.loader_rate is not None and sampler is None:  # review smp: rates at each draw
        handle.drawn = DrawnRates(data_loader, handle.loader_rate)
    if privacy_engine is not None:
        warnings.warn(_engine_warning(ledger, privacy_engine.accountant), AccountantWarning,
                      stacklevel=2)
    handle._install(privacy_engine)
    ledger._prefetch_for_hook()  # a training step between charges: commits overlap it
    return handle


def _engine_warning(ledger: Ledger, wrapped: Any) -> str:
    """Said once, at attach with ``privacy_engine=``: engine.get_epsilon changes meaning.

    Its numbers are at the δ a running ε is stated at: the ledger's, after a retarget the
    one it was created with (docs/theory.md §4). Task adv9: it named the retargeted δ,
    chosen after outputs, and called the odometer there valid under adaptive choices."""
    delta = stated_delta(ledger._acc)
    kind = str(getattr(wrapped, "mechanism", lambda: "?")()).upper()
    if delta is None:
        return ("engine.get_epsilon(delta) now reports the ledger's any-time ε (valid under "
                f"adaptivity and early stopping), no longer Opacus' {kind} accountant's ε")
    try:
        theirs = upper(wrapped.get_epsilon(delta), ".4g") if len(wrapped) else "0"
    except Exception:  # Opacus' accountant failing to answer must not stop the attach
        theirs = "unavailable"
    ours = ledger.epsilon(delta)
    if ours == 0 and theirs == "0":
        # review rnw: attached before training, both numbers read "(0 now)", which says
        # nothing; say that nothing ran yet and where Opacus' own figure stays readable
        now = (f", no longer Opacus' {kind} accountant's ε (nothing has run yet: both are 0 "
               f"now; Opacus' stays readable as engine.accountant.wrapped.get_epsilon("
               f"{exact(delta)}))")
    else:
        now = (f" ({upper(ours, '.4g')} now), no longer Opacus' {kind} accountant's ε "
               f"({theirs} now)")
    text = (f"engine.get_epsilon({exact(delta)}) now reports the ledger's any-time ε{now}: "
            "the ledger's number stays valid under adaptive choices and early stopping, "
            "so it is usually larger (smaller only where the ledger's orders above Opacus' 63 "
            "convert better), " + (
                "and at this δ, the one the ledger was created with: its target was changed "
                "after charges, so ledger.guarantee() is this odometer's statement, and a "
                "running ε read at the retargeted δ is not covered (docs/theory.md §4)."
                if ledger._acc.retargeted else
                "and it may exceed the target while the filter's guarantee holds."
                if ledger.target is not None else
                # review radv9: said of a ledger without an (ε, δ) target too, which has no
                # filter and no guarantee but this odometer's
                "and this ledger has no (ε, δ) target: this odometer's tail bound is its "
                "statement (ledger.guarantee())."))
    meter = ledger.budget()
    if meter is not None:
        text += (f" Log ledger.budget() ({meter}) for how much of the target is used, and "
                 "report ledger.guarantee().")
    return text
