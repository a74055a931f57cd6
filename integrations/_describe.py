"""What a training loop ran, as the mechanism to charge (private).

One real optimizer step of DP-SGD is one noise draw over the clipped
gradients of every micro-batch drawn since the previous real step. One
micro-batch is :class:`~privguard.mechanisms.SubsampledGaussian`; k of them,
each an independent Poisson draw, is
:class:`~privguard.mechanisms.AccumulatedSubsampledGaussian` (docs/theory.md
§14) — never ``SubsampledGaussian(σ, k·q)``, which under-counts.

How many micro-batches a step accumulated is taken as the largest of what
can be seen, never from one source alone:

* the micro-batches the training loader delivered since the last real step
  (:class:`MicroBatchCounter`; exact whatever the loader's workers prefetch,
  since it counts batches handed to the loop);
* what the optimizer reports (``accumulated_iterations``: the per-sample
  gradients it holds), except under ghost clipping, whose optimizer always
  reports 1 (:func:`reported_micro_batches` returns None there; attach
  counts the backward passes of Opacus' wrapped loss instead:
  ``integrations/_ghost.py``);
* what the loop declares (Hugging Face's ``gradient_accumulation_steps``,
  Lightning's ``accumulate_grad_batches``);
* the micro-batches clipped by the steps the loop skipped with
  ``signal_skip_step`` (``integrations/_skips.py``), which the loader count
  misses when the loop's iterator was made before attach.

Opacus' ``BatchMemoryManager`` splits one Poisson batch into physical
batches with skipped virtual steps: the loop iterates its own loader, the
optimizer holds one batch's samples at the real step, and the step stays one
:class:`SubsampledGaussian`. A loop that accumulates independent Poisson
batches through ``signal_skip_step`` looks the same to the optimizer; the two
are told apart by who queued the skip (``BatchMemoryManager``'s sampler or
not: ``integrations/_skips.py``), and by the loader's count where there is one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from privguard import mechanisms as M

_GHOST = ("DPOptimizerFastGradientClipping", "DistributedDPOptimizerFastGradientClipping")


def step_mechanism(sigma: float, rate: float, micro_batches: int,
                   aligned: bool = False) -> M.Mechanism:
    """The mechanism of one real step that accumulated ``micro_batches`` Poisson draws.

    ``aligned`` is the user's opt-in (``aligned_micro_batches=True``,
    integrations/_aligned.py): the aligned curve of docs/theory.md §14 instead
    of the default §14.2 one; a single draw is a ``SubsampledGaussian`` either way.
    """
    if micro_batches <= 1:
        return M.SubsampledGaussian(sigma, rate)
    return M.AccumulatedSubsampledGaussian(sigma, rate, micro_batches, aligned=aligned)


def is_ghost(optimizer: Any) -> bool:
    """Whether ``optimizer`` is Opacus' ghost-clipping optimizer (it reports 1 micro-batch).

    Decided by the optimizer's class, looked up once per class (read at every step):
    Opacus picks the class from ``grad_sample_mode`` in ``make_private`` and stores no
    mode the optimizer could switch later, and a ``__class__`` assignment is another key.
    """
    cls: type = type(optimizer)
    return _ghost_class(cls)


@functools.lru_cache(maxsize=64)
def _ghost_class(cls: type) -> bool:
    return any(c.__name__ in _GHOST for c in cls.__mro__)


def counter_for(loader: Any) -> MicroBatchCounter | None:
    """A :class:`MicroBatchCounter` on ``loader``, or None if its class cannot be swapped."""
    if loader is None or not hasattr(type(loader), "__iter__"):
        return None
    try:
        return MicroBatchCounter(loader)
    except (TypeError, AttributeError):  # a fixed class (builtin; accelerate's DataLoaderShard)
        return None


def batch_size(batch: Any) -> int:
    """The number of records in a batch: the length of its first tensor (-1 if none).

    A tuple or list (Opacus' ``(x, y)``), a mapping (Hugging Face) or a tensor.
    """
    first = batch
    while isinstance(first, (tuple, list)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else -1


def reported_micro_batches(optimizer: Any) -> int | None:
    """The optimizer's ``accumulated_iterations``, or None where it cannot be trusted."""
    if is_ghost(optimizer):
        return None
    try:
        value = optimizer.accumulated_iterations
    except (ValueError, AttributeError, TypeError):  # no per-sample gradients (yet)
        return None
    return value if isinstance(value, int) and value >= 1 else None


def first_grad_sample(params: Iterable[Any]) -> Any:
    """The ``grad_sample`` of the first of ``params`` (an optimizer's) holding one, as Opacus
    left it: a tensor after one ``backward()`` since the last ``zero_grad()``, a list of them
    after several (their leading dimension is each batch's rows); None where no parameter
    holds any. Read by :func:`held_sets` and ``_forward_pairing.held_rows`` (task hk3: one
    walk for both)."""
    for p in params:
        gs = getattr(p, "grad_sample", None)
        if gs is not None:
            return gs
    return None


def held_sets(optimizer: Any) -> list[Any]:
    """The sets of per-sample gradients ``optimizer`` holds, one per ``backward()`` since
    its last ``zero_grad()`` (:func:`first_grad_sample`'s entries); none under ghost
    clipping, which keeps none (review radv7)."""
    if is_ghost(optimizer):
        return []
    gs = first_grad_sample(getattr(optimizer, "params", ()))
    if gs is None:
        return []
    return list(gs) if isinstance(gs, list) else [gs]


class _Each:
    """The iterator of a :func:`swap_iter` subclass: the original's items, ``each`` called on each.

    Not a generator (review ra): a generator that raised is finished, and its
    next ``next()`` ends the iteration (StopIteration) instead of asking the
    original iterator again; a RandomAllocationSampler's refusal of an
    earlier epoch's batch must reach a DataLoader every time it asks.
    The original iterator is made at the first item, as a generator would.
    """

    def __init__(self, make: Callable[[], Any], each: Callable[[Any], None]) -> None:
        self._make, self._each = make, each
        self._it: Any = None

    def __iter__(self) -> _Each:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self._it = iter(self._make())
        item = next(self._it)
        self._each(item)
        return item


def swap_iter(obj: Any, each: Callable[[Any], None]) -> tuple[type, type]:
    """Swap ``obj``'s class for a subclass whose ``__iter__`` calls ``each`` on every item.

    Returns (the original class, the subclass); ``obj.__class__ = original``
    undoes it. Raises TypeError or AttributeError where the class is fixed.
    """
    original = type(obj)

    def __iter__(self):
        return _Each(lambda: original.__iter__(self), each)

    swapped = type(original.__name__, (original,),
                   {"__iter__": __iter__, "__qualname__": original.__qualname__,
                    "__module__": original.__module__})
    obj.__class__ = swapped
    return original, swapped


class MicroBatchCounter:
    """Counts the batches a data loader hands to the loop (until :meth:`restore`).

    The loader's class is swapped for a subclass whose ``__iter__`` counts each
    batch it yields (``DataLoader`` forbids re-assigning its sampler after
    construction, and the sampler itself is read ahead by worker prefetching).
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.count = 0
        self.sizes: list[int] | None = None  # a list: record each batch's size too (witnesses)
        self._original, self._counting = swap_iter(loader, self._one)

    def _one(self, batch: Any) -> None:
        self.count += 1
        if self.sizes is not None:
            self.sizes.append(batch_size(batch))

    def take(self) -> int:
        """The batches delivered since the last call, and restart the count."""
        n, self.count = self.count, 0
        if self.sizes is not None:
            self.sizes.clear()
        return n

    def restore(self) -> None:
        """Give the loader its own class back."""
        if type(self.loader) is self._counting:
            self.loader.__class__ = self._original
