"""A batch sampler for random allocation: every example in exactly one step of each epoch.

The batches of :class:`RandomAllocationSampler` are what
:class:`privguard.mechanisms.RandomAllocation` charges (docs/theory.md §15):
each epoch, every example is placed in one of ``steps_per_epoch`` steps,
uniformly and independently of the other examples.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._allocation import RandomAllocation

__all__ = ["DistributedRandomAllocationSampler", "RandomAllocationSampler"]


class RandomAllocationSampler:
    """Batches of random allocation, drawn afresh for each epoch (a DataLoader ``batch_sampler``).

    Iterating once yields ``steps_per_epoch`` batches (lists of dataset
    indices, ascending); each of the ``num_samples`` indices is in exactly
    one of them, the step chosen uniformly at random and independently of
    the other indices. A batch can be empty (probability about
    t·exp(−n/t) that some is, for n samples and t steps): such a step must
    still run and add its noise, as the accounting assumes; PyTorch's
    default collate function fails on an empty batch (``IndexError``), so
    pass ``collate_fn=EmptyBatchCollate(dataset)``
    (:class:`privguard.integrations.EmptyBatchCollate`), which collates one
    with zero rows.

    Epochs run one after another (docs/theory.md §15.3): once an iterator
    of the next epoch has drawn its first batch, an iterator of an earlier
    epoch raises :class:`privguard.InvalidArgumentError` instead of handing
    out another batch (e.g. ``zip(loader, loader)``), at every request. A
    copy (``copy.copy``, ``copy.deepcopy``) is the sampler itself.

    The allocation is drawn from the operating system's entropy
    (``os.urandom``, exactly uniform by rejection) unless ``generator`` (a
    ``torch.Generator``) is given; a generator makes the batches
    reproducible and is meant for tests only: batches that an adversary can
    predict carry no privacy amplification.

    Use it with any DataLoader, ``DataLoader(dataset,
    batch_sampler=RandomAllocationSampler(len(dataset), t),
    collate_fn=EmptyBatchCollate(dataset))``, and with
    Opacus through ``make_private(..., data_loader=loader,
    poisson_sampling=False)`` (Opacus then sets its sample rate to 1/t;
    ``secure_mode=True`` does not accept a batch sampler other than its own
    there). Charge each epoch as
    ``RandomAllocation(noise_multiplier, steps_per_epoch)`` (not as
    Poisson sampling).

    Example:
        >>> from privguard.integrations import RandomAllocationSampler
        >>> sampler = RandomAllocationSampler(num_samples=10, steps_per_epoch=3)
        >>> batches = list(sampler)
        >>> len(batches), sorted(i for b in batches for i in b) == list(range(10))
        (3, True)
    """

    def __init__(self, num_samples: int, steps_per_epoch: int, generator: Any = None) -> None:
        self.num_samples = check.positive_int("num_samples", num_samples, maximum=2**62)
        self._steps_per_epoch = check.positive_int("steps_per_epoch", steps_per_epoch,
                                                   maximum=2**62)
        if generator is not None and not callable(getattr(generator, "manual_seed", None)):
            raise InvalidArgumentError("generator", check.short(generator),
                                       "must be a torch.Generator or None (OS entropy)")
        self.generator = generator
        self.epochs_started = 0  # epochs whose first batch was drawn (read by attach)
        self._retired = False  # attach's charges moved to another sampler (EpochCharges.rebind)

    @property
    def steps_per_epoch(self) -> int:
        """t, fixed when the sampler is built: every epoch is charged as ``RandomAllocation(σ, t)``."""
        return self._steps_per_epoch

    @steps_per_epoch.setter
    def steps_per_epoch(self, value: Any) -> None:
        # Review rz: a t changed between drawing an epoch (its allocation over the old t)
        # and its first step would charge the epoch at the new t.
        raise InvalidArgumentError("steps_per_epoch", check.short(value),
                                   "is fixed when the sampler is built (an epoch drawn at "
                                   f"t = {self._steps_per_epoch} would be charged at the new "
                                   "t): build a new RandomAllocationSampler")

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        # an iterator object, not a generator: a generator that raised is finished and then
        # ends with StopIteration, which a DataLoader with workers takes for the end of the
        # epoch and goes on handing out the batches it fetched ahead (review ra)
        return _EpochIterator(self)

    def _share(self, batch: list[int]) -> list[int]:
        """What this process steps on of a step's batch (all of it; DDP: this rank's share)."""
        return batch

    def __copy__(self) -> RandomAllocationSampler:
        # one stream of epochs per sampler: a copy with its own epoch count would draw
        # allocations that attach (watching the original) never charges (review ra)
        return self

    def __deepcopy__(self, memo: dict) -> RandomAllocationSampler:
        return self

    def _allocation(self) -> np.ndarray:
        """The step of each index, uniform on {0, ..., t − 1}, independent."""
        n, t = self.num_samples, self.steps_per_epoch
        if self.generator is not None:
            import torch  # the generator is a torch one: torch is there

            return torch.randint(0, t, (n,), generator=self.generator).numpy().astype(np.int64)
        return uniform_from_os_entropy(n, t)


class DistributedRandomAllocationSampler(RandomAllocationSampler):
    """This rank's share of one global random allocation, under DDP (``torch.distributed``).

    Each epoch rank 0 draws the allocation of all ``num_samples`` indices to
    the ``steps_per_epoch`` steps (as :class:`RandomAllocationSampler` does:
    OS entropy unless ``generator`` is given) and broadcasts it; every rank
    then yields, for each step, its share of that step's batch (every
    W-th index from its rank on, W the world size). The ranks' shares of a
    step make up the global batch, so with Opacus' distributed optimizer
    (clipped sums added across ranks, one noise draw) one epoch is one
    ``RandomAllocation(σ, t)``, charged once per epoch by ``attach`` on
    every rank (docs/theory.md §15). Construct it on every rank after
    ``init_process_group``, and iterate it on every rank together (the
    broadcast is a collective call).

    Example:
        >>> import torch.distributed as dist
        >>> dist.is_initialized()  # doctest: +SKIP
        True
        >>> sampler = DistributedRandomAllocationSampler(1000, 10)  # doctest: +SKIP
    """

    def __init__(self, num_samples: int, steps_per_epoch: int, generator: Any = None) -> None:
        super().__init__(num_samples, steps_per_epoch, generator)
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise InvalidArgumentError(
                "torch.distributed", "not initialized",
                "DistributedRandomAllocationSampler needs a process group "
                "(init_process_group) on every rank; on one process use RandomAllocationSampler")
        self.num_replicas = dist.get_world_size()
        self.rank = dist.get_rank()

    def _share(self, batch: list[int]) -> list[int]:
        return batch[self.rank::self.num_replicas]

    def _allocation(self) -> np.ndarray:
        """Rank 0's allocation, broadcast to every rank."""
        import torch
        import torch.distributed as dist

        if self.rank == 0:
            steps = super()._allocation()
        else:
            steps = np.empty(self.num_samples, dtype=np.int64)
        tensor = torch.from_numpy(np.ascontiguousarray(steps, dtype=np.int64))
        if dist.get_backend() == "nccl":
            tensor = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        dist.broadcast(tensor, src=0)
        return tensor.cpu().numpy()


class _EpochIterator:
    """One epoch of a :class:`RandomAllocationSampler` (private): its t batches, in order.

    The epoch begins (its allocation is drawn, ``epochs_started`` counts it)
    at the first batch asked for, not when the iterator is made. Once the
    next epoch began, every further request raises
    :class:`privguard.InvalidArgumentError`, every time and also after the
    epoch's last batch (docs/theory.md §15.3): a DataLoader with workers asks
    its batch sampler for one more index batch each time it hands out a
    batch it fetched ahead, so a refusal that ended (StopIteration) after
    once being raised, or at the end of the epoch, would let it hand out
    the rest of an earlier epoch between the next epoch's steps.
    """

    def __init__(self, sampler: RandomAllocationSampler) -> None:
        self.sampler = sampler
        self.epoch = 0  # 0: not begun
        self.next_step = 0
        self.order: np.ndarray | None = None
        self.bounds: np.ndarray | None = None

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> list[int]:
        sampler = self.sampler
        if not self.epoch and getattr(sampler, "_retired", False):  # (begun: refused below)
            # Review sc: the loader was rebuilt (EpochCharges.rebind) and attach charges the
            # new loader's sampler only; an epoch of this one would run uncharged.
            raise InvalidArgumentError(
                "data_loader", f"a batch of a replaced RandomAllocationSampler (epoch "
                f"{sampler.epochs_started + 1})",
                "was asked for after the training loader was rebuilt: the ledger charges the "
                "epochs of the new loader's sampler only; iterate the new loader")
        if not self.epoch:  # the first batch asked for: the epoch begins, before its step
            steps = sampler._allocation()  # (if it raises, no epoch began: nothing handed out)
            self.order = np.argsort(steps, kind="stable")  # indices grouped by step, ascending
            self.bounds = np.searchsorted(steps[self.order],
                                          np.arange(sampler.steps_per_epoch + 1))
            sampler.epochs_started += 1
            self.epoch = sampler.epochs_started
        elif sampler.epochs_started != self.epoch:
            # Epochs run one after another (docs/theory.md §15.3): once the next epoch drew
            # its first batch, this one is over, and its remaining batches are refused rather
            # than stepped on between the next epoch's steps.
            raise InvalidArgumentError(
                "data_loader", f"a batch of epoch {self.epoch}",
                f"was asked for after epoch {sampler.epochs_started} of this "
                "RandomAllocationSampler began: random-allocation epochs run one after "
                "another (each is charged as one RandomAllocation(σ, t) block of steps), "
                "so an epoch ends when the next one draws its first batch. Do not step "
                "through two iterators of the loader at once (e.g. zip(loader, loader)); "
                "finish or abandon an epoch before starting the next")
        if self.next_step >= sampler.steps_per_epoch:
            raise StopIteration
        assert self.order is not None and self.bounds is not None
        i, self.next_step = self.next_step, self.next_step + 1
        return sampler._share(self.order[self.bounds[i]:self.bounds[i + 1]].tolist())


def uniform_from_os_entropy(n: int, t: int) -> np.ndarray:
    """``n`` independent integers uniform on {0, ..., t − 1}, from ``os.urandom``.

    64-bit words at or above the largest multiple of t below 2^64 are
    rejected and redrawn, so every value has probability exactly 1/t.
    """
    limit = (2**64 // t) * t  # accept words < limit: each residue equally often
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        need = n - filled
        words = np.frombuffer(os.urandom(8 * need), dtype=np.uint64)
        if limit < 2**64:
            words = words[words < np.uint64(limit)]
        take = words[:need] % np.uint64(t)
        out[filled:filled + take.size] = take.astype(np.int64)
        filled += take.size
    return out


class EpochCharges:
    """How ``attach`` charges a :class:`RandomAllocationSampler` loader (private).

    The whole epoch, ``RandomAllocation(σ, t)``, is charged at the first
    optimizer step that follows the drawing of its first batch, before that
    step updates anything: the filter admits the epoch or nothing of it is
    released. An epoch stopped early stays charged in full. Within an epoch
    σ may not change and at most t steps may run (each example is in one
    batch: a step more would use some example again); either is refused with
    :class:`privguard.InvalidArgumentError` before the step updates anything.
    """

    def __init__(self, sampler: RandomAllocationSampler) -> None:
        self.sampler = sampler
        # An epoch drawn before attach is charged at the first step after it (review ra:
        # Lightning makes the loader's iterator before on_train_start, and with workers that
        # draws the first epoch). Only the last one drawn can still hand out batches (an
        # earlier epoch's iterator refuses, docs/theory.md §15.3), so only it is charged.
        self.epochs_charged = max(sampler.epochs_started - 1, 0)
        self.sigma: float | None = None
        self.steps_in_epoch = 0

    def rebind(self, sampler: RandomAllocationSampler, ledger: Any, *,
               distributed: bool) -> None:
        """Charge the epochs of ``sampler`` from now on (a framework rebuilt the loader).

        The new sampler passes attach's checks first (:func:`check_attach`:
        a plain sampler under DDP, a hybrid filter with no envelope at its
        t), else nothing changes. The old sampler's epochs end: every
        iterator of it refuses from now on, also one not yet begun, which
        would otherwise draw an epoch of a sampler no longer charged
        (docs/theory.md §15.3); the new one is taken as attach takes a
        loader: its last epoch drawn, if any, is charged at the next step,
        and a step before any of its batches is refused.
        """
        if sampler is self.sampler:
            return
        # Review sc: the same refusals as attach (the sample rate, a resume and recorded
        # steps were checked at attach and stay as they were).
        check_attach(sampler, ledger, sample_rate=None, resume=None, distributed=distributed,
                     recorded=0)
        self.sampler.epochs_started += 1  # ends the old sampler's open epoch for its iterators
        self.sampler._retired = True  # and every other iterator of it, begun or not
        sampler._retired = False  # charged again (a framework may hand back an earlier one)
        self.sampler = sampler
        self.epochs_charged = max(sampler.epochs_started - 1, 0)
        self.sigma = None
        self.steps_in_epoch = 0

    def mechanism(self, sigma: float, epochs: int = 1) -> RandomAllocation:
        """The charge of ``epochs`` new epochs at noise multiplier ``sigma``."""
        return RandomAllocation(sigma, self.sampler.steps_per_epoch, epochs=epochs)

    def pending(self, sigma: float) -> RandomAllocation | None:
        """What the next step must charge first (None: its epoch is charged); raises if refused."""
        new = self.sampler.epochs_started - self.epochs_charged
        if new > 0:
            return self.mechanism(sigma, new)
        if self.sigma is None:
            # Review ra: no epoch was drawn since attach, so this step's batch is not one of
            # the sampler's (another loader, a copy's sampler, a batch made by hand); charging
            # nothing here let t such steps run free.
            raise InvalidArgumentError(
                "optimizer.step", 1,
                "runs before any batch was drawn from the RandomAllocationSampler loader given "
                "to attach, so its batch is not one of that loader's and no epoch is charged "
                "for it; step on batches of that loader only")
        if sigma != self.sigma:
            raise InvalidArgumentError(
                "noise_multiplier", sigma,
                f"changed inside a random-allocation epoch charged at σ = {self.sigma}; change "
                "it between epochs only (the epoch's charge assumed one σ for all its steps)")
        if self.steps_in_epoch >= self.sampler.steps_per_epoch:
            raise InvalidArgumentError(
                "optimizer.step", self.steps_in_epoch + 1,
                f"is more steps than the {self.sampler.steps_per_epoch} batches of this "
                "random-allocation epoch: a further step would use some example a second "
                "time. Draw a new epoch from the data loader first")
        return None

    def next_due(self, sigma: float) -> RandomAllocation | None:
        """What the next step would charge, for ``can_step``/``should_stop`` (raises if refused).

        Before the first epoch, and once all t steps of the charged epoch
        ran, the next step can only be the first of a new epoch (the loop
        draws one from the loader), so it would charge that epoch; otherwise
        as :meth:`pending`.
        """
        if self.sampler.epochs_started == self.epochs_charged and (
                self.sigma is None or self.steps_in_epoch >= self.sampler.steps_per_epoch):
            return self.mechanism(sigma)  # (before the first epoch: the loop draws it first)
        return self.pending(sigma)

    def done(self, sigma: float, charged: RandomAllocation | None) -> None:
        """Record a step that ran (after its charge, if any, was admitted)."""
        if charged is not None:
            self.epochs_charged += charged.epochs
            self.sigma = sigma
            self.steps_in_epoch = 0
        self.steps_in_epoch += 1


def allocation_sampler(loader: Any) -> RandomAllocationSampler | None:
    """The loader's :class:`RandomAllocationSampler`, or None if it has none."""
    sampler = getattr(loader, "batch_sampler", None)
    return sampler if isinstance(sampler, RandomAllocationSampler) else None


def check_attach(sampler: RandomAllocationSampler, ledger: Any, *, sample_rate: Any, resume: Any,
                 distributed: bool, recorded: int) -> None:
    """Refuse what ``attach`` cannot charge soundly per epoch (nothing is attached then)."""
    loader = f"a RandomAllocationSampler loader (t = {sampler.steps_per_epoch})"
    if sample_rate is not None:
        raise InvalidArgumentError(
            "sample_rate", check.short(sample_rate),
            f"does not apply to {loader}: each epoch is charged as RandomAllocation(σ, t), "
            "not as Poisson steps; leave sample_rate out")
    if ledger._acc.config.filter == "hybrid" and not _hybrid_covers(ledger, sampler):
        raise InvalidArgumentError(
            "ledger", "filter='hybrid'",
            f"cannot charge {loader}: this hybrid filter has no certified PLD envelope for "
            f"random allocation at t = {sampler.steps_per_epoch} (it has one only when its plan "
            f"is RandomAllocation(σ₀, t₀) with t₀ = {sampler.steps_per_epoch}, docs/theory.md "
            "§2b.3; no Poisson envelope dominates these epochs), so its epochs could only "
            "close part A; plan RandomAllocation(σ, t) or use the RDP filter "
            "(filter='rdp', the default)")
    if distributed and not isinstance(sampler, DistributedRandomAllocationSampler):
        raise InvalidArgumentError(
            "optimizer", "distributed",
            f"runs under DDP with {loader}: each rank would draw its own allocation, so a "
            "record could be in a batch on every rank in one epoch; use "
            "DistributedRandomAllocationSampler (one global allocation, each rank its share)")
    if not distributed and isinstance(sampler, DistributedRandomAllocationSampler) and \
            sampler.num_replicas > 1:
        raise InvalidArgumentError(
            "optimizer", type(sampler).__name__,
            f"is not an Opacus distributed optimizer, but {loader} gives this rank only its "
            f"share (1/{sampler.num_replicas}) of each step's batch: the epoch is one "
            "RandomAllocation only when the ranks' clipped sums are added before the noise "
            "(make_private on a DPDDP model)")
    if resume is not None or recorded:
        raise InvalidArgumentError(
            "resume" if resume is not None else "optimizer", "recorded steps",
            f"cannot be charged for {loader}: Opacus records steps as Poisson at q = 1/t and "
            "keeps no epoch boundaries; attach before the first step, and resume by keeping the "
            "ledger (its journal holds every epoch charged)")


def _hybrid_covers(ledger: Any, sampler: RandomAllocationSampler) -> bool:
    """Whether the ledger's hybrid filter has the epoch envelope of this sampler's t
    (docs/theory.md §2b.3). An epoch at σ < σ₀ is then outside: it closes part A and
    part B decides, which is sound (§2b, C1)."""
    flt = ledger._acc.filter
    env = getattr(flt, "envelope", None) if getattr(flt, "kind", None) == "hybrid" else None
    return env is not None and env.allocation_steps == sampler.steps_per_epoch


def charge_together(coordinator: Any, ledger: Any, epoch: RandomAllocation, label: Any) -> None:
    """Charge one epoch under DDP: once per distinct ledger, the same outcome on every rank.

    Every rank reaches an epoch's first step together (the ranks share one
    allocation, so each runs its t steps), so the charge is one collective
    of ``integrations/_distributed.py``: each charger charges, and
    every rank admits, or raises BudgetExhausted / RankDisagreementError,
    before any rank updates.
    """
    coordinator.charge_once(ledger, epoch, label, "while charging a random-allocation epoch",
                            f"charge {label!r} of {epoch!r} refused by the ledger: the epoch "
                            "does not fit, and no rank updates")
