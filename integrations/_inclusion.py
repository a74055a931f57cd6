"""The per-record sampling witness: how often each record was drawn, against Poisson(q).

Part of the witnesses (issue 28, integrations/_witnesses.py). The
batch-size tests see only how many records a step drew; a sampler can match
that law and still draw the wrong records (a weighted sampler that never draws
half the dataset and draws the other half at 2q; a shuffled loader that draws
every record exactly once an epoch). This witness records the indices the
loader's batch sampler yields (its class is swapped for a recording subclass,
as :class:`~privguard.integrations._describe.MicroBatchCounter` does for the
loader) and, once per expected epoch (every ⌈1/q⌉ draws), tests the counts.

Under Poisson sampling at q, after m draws of the sampler the counts c_i are
independent Binomial(m, q), so for any set S fixed before looking, the number
of records with c_i ∈ S is exactly Binomial(N, P(Binomial(m, q) ∈ S))
(docs/theory.md §16.1). The witness takes S_low = {c ≤ ⌊mq − √(mq)⌋} and
S_high = {c ≥ ⌈mq + √(mq)⌉} and tests both tails of both counts (too many
extreme records: over-dispersed, e.g. weighted; too few: under-dispersed, e.g.
each record once an epoch) with the exact binomial tails, at level α_j/4 per
tail at the j-th test (α_j = α·6/(π²j²)), so over the run it alarms with
probability ≤ α under a correct pipeline, whatever the data.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from privguard._accounting._results import exact as _exact
from privguard._accounting._results import lower as _down
from privguard._accounting._results import upper as _up
from privguard._errors import PipelineMismatchError
from privguard.integrations._describe import swap_iter
from privguard.integrations._tails import binomial_tail_lower, binomial_tail_upper, clopper_pearson

__all__ = ["InclusionCounts"]


def _indices(pending: list[Any]) -> Any:
    """The index lists the sampler yielded, as one int64 array.

    Flat lists of ints (Opacus' samplers) in one ``np.fromiter`` pass (about 2.5 times
    faster than an array per list); anything else (tensors, nested lists) one array each.
    """
    if pending and all(type(i) is list for i in pending):
        try:
            return np.fromiter(itertools.chain.from_iterable(pending), dtype=np.int64)
        except (TypeError, ValueError):  # a nested list: the general path below
            pass
    return (np.concatenate([np.asarray(i, dtype=np.int64).reshape(-1) for i in pending])
            if pending else np.zeros(0, dtype=np.int64))


class InclusionCounts:
    """Records the indices a batch sampler yields and tests their counts against Poisson(q).

    Args:
        batch_sampler: the loader's batch sampler (yields lists of indices).
        num_records: N, the dataset's size.
    """

    def __init__(self, batch_sampler: Any, num_records: int) -> None:
        self.sampler = batch_sampler
        self.num_records = num_records
        self.draws = 0  # sampler yields since the segment began
        self.tests = 0  # tests run (the level index j)
        self._pending: list[Any] = []
        self._counts = np.zeros(num_records, dtype=np.int64)
        self._q: float | None = None
        self._next = 0
        self._original, self._recording = swap_iter(batch_sampler, self._record)

    def _record(self, indices: Any) -> None:
        self._pending.append(indices)
        self.draws += 1

    @classmethod
    def for_loader(cls, loader: Any, num_records: int | None) -> InclusionCounts | None:
        """On ``loader.batch_sampler`` if it is swappable, else None."""
        sampler = getattr(loader, "batch_sampler", None)
        if sampler is None or not num_records or not hasattr(type(sampler), "__iter__"):
            return None
        try:
            return cls(sampler, num_records)
        except (TypeError, AttributeError):  # a fixed class
            return None

    def restore(self) -> None:
        """Give the sampler its own class back."""
        if type(self.sampler) is self._recording:
            self.sampler.__class__ = self._original

    def check(self, q: float, alpha: float, step: int) -> None:
        """Test the counts if an expected epoch of draws passed; raise PipelineMismatchError."""
        if q != self._q:  # a new stretch of constant q: new counts
            self._q, self.draws, self._pending = q, 0, []
            self._counts[:] = 0
            self._next = math.ceil(1.0 / q) if 0.0 < q < 1.0 else 0
            return
        if not self._next or self.draws < self._next:
            return
        self._next = self.draws + math.ceil(1.0 / q)
        pending, self._pending = self._pending, []
        idx = _indices(pending)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_records):
            self._next = 0  # not indices into the dataset: this witness stops testing
            return
        # one counting pass for the epoch's draws (a record drawn twice counts twice)
        self._counts += np.bincount(idx, minlength=self.num_records)
        self.tests += 1
        level = alpha * 6.0 / (math.pi ** 2 * self.tests ** 2) / 4.0  # four tails
        self._test(q, level, step)

    def _test(self, q: float, level: float, step: int) -> None:
        m, n = self.draws, self.num_records
        mean = m * q
        spread = math.sqrt(mean)
        low, high = math.floor(mean - spread), math.ceil(mean + spread)
        for name, k, p in (
            (f"drawn ≤ {low} times", int(np.count_nonzero(self._counts <= low)),
             binomial_tail_lower(low, m, q) if low >= 0 else 0.0),
            (f"drawn ≥ {high} times", int(np.count_nonzero(self._counts >= high)),
             binomial_tail_upper(high, m, q) if high <= m else 0.0),
        ):
            if not 0.0 < p < 1.0:
                continue
            below = binomial_tail_lower(k, n, p)
            above = binomial_tail_upper(k, n, p)
            if min(below, above) > level:
                continue
            lo, hi = clopper_pearson(k, n)
            raise PipelineMismatchError(
                f"sampling witness (per record): the steps are charged as Poisson sampling at "
                f"q = {_exact(q)}, under which, after {m} draws, each of the N = {n} records is "
                f"{name} with probability {p:.4g} independently; {k} records were (fraction "
                f"{k / n:.4g}, 95% interval [{_down(lo, '.4g')}, {_up(hi, '.4g')}]; binomial "
                f"tail {_up(min(below, above), '.3g')} ≤ {_up(level, '.3g')}): the batches are not Poisson draws, each "
                "record independently at q (a weighted or shuffled sampler?). Nothing was "
                "charged or applied",
                witness="sampling", charged=p, measured=k / n, interval=(lo, hi), step=step)


class AllocationEpochs:
    """Random allocation, once per epoch: every record once, batch sizes Binomial(N, 1/t).

    Under :class:`~privguard.integrations.RandomAllocationSampler` each of the N
    records is put in one of the epoch's t steps, uniform and independent, so
    (deterministically) every index appears exactly once in the epoch, and each
    batch size is Binomial(N, 1/t). When an epoch's t batches have been drawn
    (before its last step is applied), the witness checks the first and tests
    every size with the exact binomial tails at level α_e/(2t) each (the union
    over the t sizes and both sides; α_e = α·6/(π²e²) at the e-th epoch tested),
    so it alarms with probability ≤ α over the run under a correct sampler.
    """

    def __init__(self, sampler: Any, num_records: int) -> None:
        self.sampler = sampler
        self.num_records = num_records
        self.steps = int(sampler.steps_per_epoch)
        self.tests = 0
        self._epoch: Any = None
        self._batches: list[Any] = []
        self._done: list[list[Any]] = []
        self._original, self._recording = swap_iter(sampler, self._record)

    def _record(self, indices: Any) -> None:
        epoch = getattr(self.sampler, "epochs_started", None)
        if epoch != self._epoch:  # a new pass over the sampler: an unfinished one is dropped
            self._epoch, self._batches = epoch, []
        self._batches.append(indices)
        if len(self._batches) == self.steps:
            self._done.append(self._batches)
            self._batches = []

    def restore(self) -> None:
        """Give the sampler its own class back."""
        if type(self.sampler) is self._recording:
            self.sampler.__class__ = self._original

    def check(self, alpha: float, step: int) -> None:
        """Test every epoch drawn in full since the last call; raise PipelineMismatchError."""

        done, self._done = self._done, []
        n, t = self.num_records, self.steps
        for batches in done:
            drawn = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches])
            counts = np.bincount(drawn[(drawn >= 0) & (drawn < n)], minlength=n)
            if drawn.size != n or counts.size != n or not np.all(counts == 1):
                raise PipelineMismatchError(
                    f"sampling witness (random allocation): an epoch of {t} steps must draw each "
                    f"of the N = {n} records exactly once; it drew {drawn.size} indices, "
                    f"{int(np.count_nonzero(counts == 0))} records never and "
                    f"{int(np.count_nonzero(counts > 1))} more than once. Nothing was charged "
                    "or applied",
                    witness="sampling", charged=float(n), measured=float(drawn.size),
                    interval=None, step=step)
            self.tests += 1
            level = alpha * 6.0 / (math.pi ** 2 * self.tests ** 2) / (2.0 * t)
            sizes = [len(b) for b in batches]
            if t == 1:
                continue  # one step: the size is N, deterministically (checked above)
            mean = n / t
            for s, k in enumerate(sizes):  # only the tail on k's side can be small (median)
                tail = (binomial_tail_lower(k, n, 1.0 / t) if k <= mean
                        else binomial_tail_upper(k, n, 1.0 / t))
                if tail <= level:
                    raise PipelineMismatchError(
                        f"sampling witness (random allocation): under the charge each batch "
                        f"size of an epoch is Binomial(N = {n}, 1/t = 1/{t}) (mean {mean:.4g}); "
                        f"batch {s + 1} of the epoch had {k} records (tail "
                        f"{_up(tail, '.3g')} ≤ {_up(level, '.3g')}): the records are not allocated uniformly to the steps. "
                        "Nothing was charged or applied",
                        witness="sampling", charged=mean, measured=float(k), interval=None,
                        step=step)
