"""Micro-batches a loop accumulated through Opacus' ``signal_skip_step`` (private).

A step skipped with ``optimizer.signal_skip_step(True)`` runs
``clip_and_accumulate`` on the per-sample gradients the optimizer holds, adds
them to the clipped sum and stops before the noise; the next real step noises
that sum. In a hand-written loop each skipped step is one (or, with several
``backward()`` before it, several) Poisson micro-batches of the real step
(docs/theory.md §14). The loader counter of ``integrations/_describe.py`` sees
those batches only when the loop's iterator was made after attach, and with
``zero_grad()`` between micro-batches the optimizer reports one batch at the
real step: a loop that made its iterator before attach (u27) was charged one
``SubsampledGaussian(σ, q)`` for two draws.

:class:`SkipCounter` counts, between two real steps, the micro-batches the
skipped steps clipped (``accumulated_iterations`` at the skip; under ghost
clipping the backward passes of ``integrations/_ghost.py``), and which skips Opacus' ``BatchMemoryManager`` queued: its virtual
steps split ONE Poisson draw into physical batches and stay one
``SubsampledGaussian`` per logical batch. A skip is taken as
``BatchMemoryManager``'s only when the signal came straight from Opacus' own
``BatchSplittingSampler.__iter__`` (its code object, read from the caller's
frame); every other signal (the loop's, a subclass's, one queued before
attach) is the loop's own. If any skip consumed since the last real step is
the loop's own, or a step clipped several batches (``BatchMemoryManager``
requires one ``step()`` per physical batch: only then does a skip it queued
mark a split of the draw the next real step ends), every skipped step counts
(:meth:`SkipCounter.floor`): each
clipped batch holds at most one Poisson draw, so the count is never below the
draws. The count may be above the draws (a Poisson batch split by hand: its
splits count; a loop mixing its own skips with ``BatchMemoryManager``'s,
skips without ``zero_grad()``): over-counting, never under-counting
(docs/theory.md §14.4). Review rs withdrew u27's exception for a batch split
by hand (records clipped equal to the sizes the loader counter saw): equal
totals do not show that the records clipped are the counted batches' (an
empty draw; a prefetching loop, whose counter window holds the batch it
clips next, with a second Poisson stream).

The signals are mirrored in the order Opacus consumes them (its queue is
FIFO: ``_check_skip_next_step`` pops the oldest), so the origin of each
consumed skip is known even when a ``BatchMemoryManager`` with workers queued
signals ahead of the loop. FIFO pairs the j-th ``step()`` with the j-th
signal queued (review rs): a signal of the loop's own in the queue, or a
physical batch the loop left out without ``step()``, makes every later step
consume the signal of another batch. So every skip counts while a signal of
another origin may be queued (until a real step leaves the queue empty),
and each of ``BatchMemoryManager``'s signals is checked, where a step
consumes it, against the batches its DataLoader iterator handed out.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from privguard.integrations import _describe

_WRAPPED = ("signal_skip_step", "_check_skip_next_step")


@functools.lru_cache(maxsize=1)
def _bmm_code() -> Any:
    """The code object of Opacus' ``BatchSplittingSampler.__iter__`` (None if absent)."""
    try:
        from opacus.utils.batch_memory_manager import BatchSplittingSampler
    except ImportError:  # pragma: no cover - opacus is a dependency of the integration
        return None
    return getattr(BatchSplittingSampler.__iter__, "__code__", None)


@functools.lru_cache(maxsize=1)
def _loader_iter_class() -> Any:
    """torch's ``_BaseDataLoaderIter`` (None if absent)."""
    try:
        from torch.utils.data.dataloader import _BaseDataLoaderIter
    except ImportError:  # pragma: no cover - torch is a dependency of the integration
        return None
    return _BaseDataLoaderIter


# a mirrored signal: (BatchMemoryManager queued it, a weak reference to the DataLoader
# iterator that asked the sampler for the batch, that batch's position in its epoch)
_UNKNOWN: tuple[bool, Any, int] = (False, None, -1)


def _batch_of(sampler_frame: Any) -> tuple[Any, int]:
    """The DataLoader iterator whose request for indices ran ``BatchSplittingSampler.__iter__``
    (a frame up: ``_next_index``) and the position of the batch the signal is for: the
    batches sent to workers so far, or without workers those yielded so far (review rs).
    (None, -1) where it cannot be read: the signal's pairing is then not checked (counted)."""
    base = _loader_iter_class()
    frame = sampler_frame.f_back
    for _ in range(6):
        if frame is None or base is None:
            break
        it = frame.f_locals.get("self")
        if isinstance(it, base):
            idx = getattr(it, "_send_idx", getattr(it, "_num_yielded", None))
            try:
                return (weakref.ref(it), idx) if isinstance(idx, int) else (None, -1)
            except TypeError:  # pragma: no cover - not weakly referenceable
                return None, -1
        frame = frame.f_back
    return None, -1


def _paired(entry: tuple[bool, Any, int], newest: Any) -> bool:
    """Whether the step consuming ``entry`` runs on the batch it was queued for: its
    iterator is the newest signal's (no later epoch's iterator has started) and has
    handed the loop exactly that batch's position + 1 batches (none left out since)."""
    bmm, ref, idx = entry
    it = None if ref is None else ref()
    return (bmm and it is not None and newest is not None and newest() is it
            and getattr(it, "_num_yielded", None) == idx + 1)


class SkipCounter:
    """Counts the micro-batches of the skipped steps since the optimizer's last real step.

    Installed on the optimizer instance (``signal_skip_step`` and
    ``_check_skip_next_step``) by :meth:`install`; :meth:`restore` gives the
    optimizer back what it had.
    """

    def __init__(self, optimizer: Any,
                 reported: Callable[[], int | None] | None = None,
                 pre_step: Callable[[], None] | None = None,
                 real_step: Callable[[], None] | None = None) -> None:
        self.optimizer = optimizer
        # told of every real step, before its noise (attach: a replaced step hook is put
        # behind the charge, review rsmp; the release gate, review smp)
        self._real_step = real_step
        # told of every step()'s pre_step (ghost clipping: integrations/_ghost.py, review rgc)
        self._pre_step = pre_step
        # the batches a step clips (``accumulated_iterations``; under ghost clipping the
        # backward passes integrations/_ghost.py counts), None where unknown
        self._reported = reported or (lambda: _describe.reported_micro_batches(optimizer))
        self.skipped = 0  # micro-batches clipped by skipped steps since the last real step
        # the largest clipping bound (max_grad_norm) any step() clipped at since the last
        # real step: the noise is σ·C at the real step only (review smp), None: none seen;
        # the step is charged σ·C/C′ for C′ this bound (docs/theory.md §14.7, Lemma 14.8)
        self.clip_bound: float | None = None
        self.own = False  # one of those skips was not BatchMemoryManager's
        # a signal not BatchMemoryManager's was queued (or one of unknown origin found) and
        # the queue has not been empty after a real step since: Opacus' FIFO may pair
        # BatchMemoryManager's skips with other batches than those it queued them for (rs)
        self.misaligned = False
        self._origins: deque[tuple[bool, Any, int]] = deque()  # per queued signal
        self._saved: dict[str, Any] = {}
        self._signal: Any = None
        self._check: Any = None

    def install(self) -> None:
        """Wrap the optimizer's skip signal and its consumption (instance attributes)."""
        opt = self.optimizer
        self._saved = {name: vars(opt)[name] for name in _WRAPPED if name in vars(opt)}
        self._signal, self._check = opt.signal_skip_step, opt._check_skip_next_step
        opt.signal_skip_step = self._on_signal
        opt._check_skip_next_step = self._on_check

    def restore(self) -> None:
        """Give the optimizer back its own methods (or the instance attributes it had)."""
        opt = self.optimizer
        for name, mine in (("signal_skip_step", self._on_signal),
                           ("_check_skip_next_step", self._on_check)):
            if vars(opt).get(name) != mine:
                continue  # replaced since: leave it
            if name in self._saved:
                setattr(opt, name, self._saved[name])
            else:
                delattr(opt, name)

    def _on_signal(self, do_skip: bool = True) -> Any:
        caller = sys._getframe(1)  # BatchSplittingSampler.__iter__ calls optimizer.signal_skip_step
        bmm = _bmm_code()
        is_bmm = bmm is not None and caller.f_code is bmm
        self._origins.append((True, *_batch_of(caller)) if is_bmm else _UNKNOWN)
        self.misaligned = self.misaligned or not is_bmm
        return self._signal(do_skip)

    def _on_check(self, pop_next: bool = True) -> Any:
        if pop_next and self._pre_step is not None:  # once per pre_step, after accumulate()
            self._pre_step()
        if pop_next:  # pre_step clipped at the bound in force now (clip_and_accumulate)
            bound = _bound(self.optimizer)
            self.clip_bound = bound if self.clip_bound is None else max(self.clip_bound, bound)
        queue = getattr(self.optimizer, "_step_skip_queue", None)
        popping = bool(pop_next) and bool(queue)
        origin_bmm = paired = False
        if popping:
            assert queue is not None
            # align the mirror with Opacus' queue: signals we did not see queued (before
            # attach, or appended to the queue directly) are the oldest and of unknown origin,
            # taken as the loop's own (counted)
            if len(self._origins) != len(queue):
                self.misaligned = True  # signals queued or removed unseen: pairing unknown
            while len(self._origins) > len(queue):
                self._origins.popleft()
            while len(self._origins) < len(queue):
                self._origins.appendleft(_UNKNOWN)
            entry = self._origins.popleft()
            origin_bmm = entry[0]
            # a batch left out without step() (review rs) shifts the pairing unseen by the
            # queue: checked against the batches the sampler's DataLoader iterator handed out
            paired = _paired(entry, self._origins[-1][1] if self._origins else entry[1])
            if origin_bmm and not paired:
                self.misaligned = True
        skip = self._check(pop_next)
        if pop_next and not skip and self._real_step is not None:
            self._real_step()
        if popping and skip:  # a skipped step: its clipped batches stay in the sum
            held = self._reported() or 1
            self.skipped += held
            # BatchMemoryManager's contract is one step() per physical batch: a skip of it
            # that clipped several batches breaks it, and its skips no longer mark splits
            # and only while each of its signals is consumed by the step of the batch it was
            # queued for: a signal of the loop's own in the FIFO shifts every later pairing
            self.own = self.own or not paired or held > 1 or self.misaligned
        elif pop_next and not (origin_bmm and paired):
            # a real step that did not consume the sampler's signal of the batch it is on (its
            # own signal, none, another batch's): the skipped batches before it are not the
            # splits of its draw, count them all (review rs: an extra step on another loader's
            # batch between two splits noised a split of one draw with another draw)
            self.own = True
        if pop_next and not skip and not getattr(self.optimizer, "_step_skip_queue", None):
            # a real step left the queue empty: every signal queued so far is consumed, the
            # next one BatchMemoryManager queues is the next step's (under its contract)
            self.misaligned = False
        return skip

    def floor(self, reported: int) -> int:
        """The fewest micro-batches the real step about to run may hold.

        ``reported``: the batches the real step itself clipped (the optimizer's
        ``accumulated_iterations``, 1 where it cannot be trusted). 1 when no
        skip since the last real step was the loop's own, and the step kept
        ``BatchMemoryManager``'s contract (one batch per ``step()``).
        """
        if not (self.own or (self.skipped and reported > 1)):
            return 1
        return self.skipped + reported

    def take(self) -> None:
        """The real step was charged: restart the count."""
        self.skipped, self.own, self.clip_bound = 0, False, None


def _bound(optimizer: Any) -> float:
    """The bound the optimizer clips each record's gradient to now: ``max_grad_norm`` (a 0-d
    tensor after an adaptive update), and under per-layer clipping the norm of the layers'
    ``max_grad_norms`` (which Opacus clips with, and which its noise bound ``max_grad_norm``
    does not follow when the list is changed), computed as Opacus computes that noise bound
    from the list (a float32 norm: an unchanged list gives the noise bound exactly), and
    under ``DistributedPerLayerOptimizer`` the bounds its backward hooks clip with
    (:func:`_hook_bounds`); inf where it is not a number, so that the step is refused (fail
    closed). The largest of these: a C′ read too large only lowers the charged σ·C/C′
    (docs/theory.md §14.7, Lemma 14.8: an over-count)."""
    try:
        value = float(optimizer.max_grad_norm)
        layers = getattr(optimizer, "max_grad_norms", None)
        if layers is not None:
            import torch  # per-layer clipping: an Opacus optimizer, torch is there

            value = max(value, float(torch.norm(torch.Tensor(list(layers)), p=2).item()))
            hooked = _hook_bounds(optimizer)
            if hooked is not None:
                value = max(value, float(torch.norm(torch.Tensor(hooked), p=2).item()))
    except (AttributeError, TypeError, ValueError, RuntimeError, OverflowError):
        return float("inf")
    return value if value == value else float("inf")  # NaN: inf


def _hook_bounds(optimizer: Any) -> list[float] | None:
    """The per-layer bounds ``DistributedPerLayerOptimizer`` clips with, one per trainable
    parameter (the largest where a parameter has several hooks); None for an optimizer that
    clips in ``pre_step`` (it has no ``_ddp_per_layer_hook``).

    Review lo2: that optimizer clips in each parameter's backward hook, registered when it
    is built as ``partial(_ddp_per_layer_hook, p, bound)``: the bound is the list's value at
    build time, and a ``max_grad_norms`` set later (lowered with ``max_grad_norm``, which the
    noise σ·C follows) does not change what it clips at. Reading the list then gave C′ too
    small and the step was charged σ where the noise multiplier was σ·C/C′ < σ. The bounds
    are read from the hooks themselves, so that raising the list between ``pre_step`` and
    the next backward cannot make C′ too small either (the hooks do not follow the list). A
    trainable parameter without such a hook raises (``_bound``: inf, the step refused)."""
    hook = getattr(type(optimizer), "_ddp_per_layer_hook", None)
    if hook is None:
        return None
    bounds = []
    for p in optimizer.params:
        if not p.requires_grad:
            continue
        found = [fn.args[1] for fn in (getattr(p, "_backward_hooks", None) or {}).values()
                 if getattr(getattr(fn, "func", None), "__func__", None) is hook
                 and len(fn.args) == 2 and fn.args[0] is p]
        if not found:
            raise ValueError("a trainable parameter without its per-layer clipping hook")
        bounds.append(max(float(b) for b in found))
    return bounds


def noise_bound(optimizer: Any) -> float:
    """The ``max_grad_norm`` Opacus' noise σ·C uses; 0 where it is not a number (the step's
    noise multiplier is then 0, which the charge refuses)."""
    try:
        value = float(optimizer.max_grad_norm)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return 0.0
    return value if value == value else 0.0

