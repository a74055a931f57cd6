"""The rates a Poisson loader drew its batches at, for the step that trains on them (private).

Opacus' ``UniformWithReplacementSampler`` reads its ``sample_rate`` at every
draw, and a step is charged at the loader's rate when it runs. A batch drawn
at q and a rate lowered to q' before the step on it (a batch-size schedule set
at the top of the loop, or a DataLoader whose workers prefetched batches drawn
at q) was charged SubsampledGaussian(σ, q') for a draw at q (review smp).

:class:`DrawnRates` records the rate of every draw (the loader's batch sampler
is swapped for a subclass whose iterator reads ``sample_rate`` right after each
draw, as ``integrations/_describe.py`` swaps the loader). A step's batches are
among the draws made since the real step before the previous one (review
rsmp: a loop that holds the next batch while it trains on this one, a device
prefetcher, trains on a batch drawn before the previous step) and the ones
that were still in flight then (at most ``prefetch_factor × num_workers`` of
each iterator of the batch sampler still alive: review rsmp, two iterators of
one loader, ``zip(loader, loader)``, hold twice one iterator's prefetch, and
the window of one missed a batch drawn before the rate was lowered), so the
step is charged at the largest of those rates and the rate in force. A step
after no recorded draw (an iterator made before attach) is charged at least
the rate of the previous step (or at attach). A loop that holds batches across
more than one step is not seen: lower the rate where it holds none.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from itertools import islice
from typing import Any

from privguard.integrations._describe import swap_iter

_KEPT = 4096  # recent draws kept: more than any loader's batches in flight


def in_flight(loader: Any) -> int:
    """The index batches a DataLoader iterator may have drawn ahead of the loop (its
    workers' prefetch: ``prefetch_factor × num_workers``; none without workers)."""
    workers = getattr(loader, "num_workers", 0)
    workers = workers if isinstance(workers, int) and workers > 0 else 0
    factor = getattr(loader, "prefetch_factor", None)
    factor = factor if isinstance(factor, int) and factor > 0 else 2
    return workers * factor


class DrawnRates:
    """Records the rate each batch of ``loader``'s Poisson batch sampler was drawn at
    (until :meth:`restore`); ``rate`` is the least rate a step may be charged at."""

    def __init__(self, loader: Any, rate_now: float) -> None:
        self.sampler = loader.batch_sampler
        self.ahead = in_flight(loader)
        self.rates: deque[float] = deque(maxlen=_KEPT)
        self.since = 0  # draws since the last real step
        self.before = 0  # draws between the real step before it and that step (review rsmp)
        self.last = rate_now  # the rate the last step was charged at (at attach: the loader's)
        self._seen = rate_now
        # every rate kept in ``rates`` (this very deque) is ``_same`` (None: none
        # recorded), unless ``_mixed``: then :meth:`rate` needs no window (issue 26, task hk)
        self._record = self.rates
        self._same: float | None = None
        self._mixed = False
        # the newest draws' rate and how many draws in a row were at it (nonzero): once
        # they are as many as the record keeps, every kept rate is that one again and the
        # shortcut is re-armed (a schedule that changed the rate once; issue 26, task hm)
        self._tail: float | None = None
        self._tail_count = 0
        # one draw recorded at a time (review rhm: two threads drawing from the sampler,
        # one preempted between marking the record mixed and recording its rate, while
        # the other re-armed the shortcut over it: a step charged below its window)
        self._recording_lock = threading.Lock()
        _LIVE.add(self)  # its lock is made anew in a forked child (task lo7)
        self._original, self._recording = swap_iter(self.sampler, self._drawn)
        # the sampler's iterators alive (a DataLoader iterator holds its own until it is
        # dropped): each may hold ``ahead`` draws in flight
        self._iterators: weakref.WeakSet[Any] = weakref.WeakSet()
        cls: Any = self._recording  # a class made at runtime (swap_iter)
        recording, iterators = cls.__iter__, self._iterators

        def __iter__(sampler: Any) -> Any:
            iterator = recording(sampler)
            iterators.add(iterator)
            return iterator

        cls.__iter__ = __iter__

    def _drawn(self, _batch: Any) -> None:
        with self._recording_lock:  # one draw at a time (review rhm)
            # read in the same next() call that drew the batch: the rate it was drawn at
            try:
                rate = float(self.sampler.sample_rate)
            except (TypeError, ValueError, RuntimeError):
                rate = 1.0  # not a number: the step is charged as if every record were drawn
            rate = rate if rate == rate else 1.0
            # the flags before the record (review rhk): a step read on another thread between
            # the two sees a new rate only with the flag that sends it to the window (at the
            # first draw it may see the rate before the record holds it: more, never less)
            if self._same is None and not self._mixed:
                self._same = rate
            elif rate != self._same or rate == 0:  # (0.0 and -0.0 are equal, not the same float)
                self._mixed = True
            if rate == self._tail and rate != 0:  # equal and nonzero: the same float
                self._tail_count += 1
            else:
                self._tail, self._tail_count = rate, 1
            self.rates.append(rate)
            if self._mixed and rate != 0 and self._tail_count >= len(self.rates) \
                    and self.rates is self._record:
                # every kept rate is ``rate`` (the record holds the newest draws, all at it):
                # the shortcut's answer is the window's again. ``_same`` before the flag, and
                # :meth:`rate` reads the flag first: a step that sees the flag cleared reads
                # this rate (one read before sees the flag set and reads the window)
                self._same = rate
                self._mixed = False
            self.since += 1

    def rate(self, charged: float) -> float:
        """The rate to charge the next real step at: ``charged`` (the rate in force), or
        more where a batch it may train on was drawn at more."""
        # the flag first, then the rate (:meth:`_drawn` re-arms the shortcut by writing
        # ``_same`` before clearing the flag)
        mixed = self._mixed
        same = self._same
        if not mixed and self.rates is self._record:
            # every kept rate is ``same`` (None: none kept), so the window's largest is
            # ``same`` if the window holds a draw, which it does iff it is not empty (the
            # iterators' factor is at least 1) and a rate is kept: the window's own answer,
            # bit for bit, without reading it (issue 26, task hk: ~4 µs of the hook a step)
            if same is not None and self.since + self.before + self.ahead > 0:
                q = max(charged, same)
            else:
                q = charged
        else:
            # the window read from the newest draw back (review rsmp: a copy of every kept
            # rate, up to _KEPT, on each step cost ~15 µs, about 1% of a small model's step)
            window = self.since + self.before + self.ahead * max(1, len(self._iterators))
            q = max(charged, max(islice(reversed(self.rates), window), default=charged))
        if not self.since:  # no draw recorded since the last step: at least that step's rate
            q = max(q, self.last)
        self._seen = q
        return q

    def take(self) -> None:
        """A real step was charged (or dropped): the window restarts."""
        self.since, self.before, self.last = 0, self.since, self._seen

    def restore(self) -> None:
        """Give the batch sampler its own class back."""
        if type(self.sampler) is self._recording:
            self.sampler.__class__ = self._original


#: Every DrawnRates alive, whose lock a forked child makes anew (:func:`_after_fork_in_child`).
_LIVE: weakref.WeakSet[DrawnRates] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A fresh recording lock for every DrawnRates in a forked child (task lo7): a thread of
    the parent inside :meth:`DrawnRates._drawn` at the fork (another thread drawing from the
    sampler) left the child's copy of the lock held by a thread the child does not have,
    and the child's next draw waited for ever. The child has one thread, so no draw of its
    own is under way; what the parent's thread was recording is lost to the child, whose
    batches are its own draws from here on (as ``privguard._stores._handles`` does for its
    lock)."""
    for rates in list(_LIVE):
        rates._recording_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
