"""What sampler a loader has, and whether its q is the rate each record is drawn at (private).

privguard charges a step by the probability q with which each record of the
dataset being trained on joins it. A loader is accepted when its batch
sampler is one privguard can account (:data:`ACCOUNTED`, one line per kind:
a new kind is added there) *and* the sampler's own parameters give that q
for the records the loader actually reads; anything else is refused by name,
with what was found and the two honest alternatives (:func:`refusal`).
"""

from __future__ import annotations

import math
from typing import Any

from privguard._accounting._results import exact as _exact
from privguard._accounting._results import upper as _up
from privguard._errors import InvalidArgumentError

ALTERNATIVES = (
    "Use Poisson sampling through Opacus' DPDataLoader (make_private(..., "
    "poisson_sampling=True), or DPDataLoader.from_data_loader(loader)), or fixed-size "
    "batches with each example once per epoch through privguard's RandomAllocationSampler; "
    "pass check_poisson=False only if you accept that the reported ε does not hold for "
    "this sampling")

ACCOUNTED: dict[str, str] = {
    # batch sampler class name -> what privguard charges for it
    "UniformWithReplacementSampler": "Poisson",
    "DistributedUniformWithReplacementSampler": "Poisson",
}
"""The batch samplers privguard can account, by class name (no torch import needed)."""

_KNOWN = {
    "RandomSampler": "a shuffled loader (fixed-size batches of a random permutation)",
    "SequentialSampler": "a sequential loader (fixed-size batches in dataset order)",
    "WeightedRandomSampler": "a WeightedRandomSampler (fixed-size batches drawn with weights)",
    "DistributedSampler": "a DistributedSampler (each rank's fixed share of a permutation)",
    "SubsetRandomSampler": "a SubsetRandomSampler (fixed-size batches of a permutation)",
}


def found(loader: Any) -> str:
    """What sampling ``loader`` does, in words (for a refusal)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    name = type(batch_sampler).__name__
    if name in ACCOUNTED and getattr(loader, "drop_last", False):
        return f"drop_last=True on a {ACCOUNTED[name]} loader (it drops the last partial batch)"
    inner = getattr(batch_sampler, "sampler", None)
    if name == "BatchSampler":
        return _KNOWN.get(type(inner).__name__,
                          f"fixed-size batches from a sampler privguard does not know "
                          f"({type(inner).__name__})")
    if batch_sampler is None:
        return f"a {type(loader).__name__} without a batch sampler"
    wrapped = wrapped_poisson(batch_sampler) or wrapped_allocation(batch_sampler)
    if wrapped is not None:  # a sharding wrapper around a sampler privguard accounts
        return wrapped
    return f"a batch sampler privguard does not know ({name})"


def refusal(loader: Any) -> str:
    """The requirement text of a NonPoissonSamplingError for ``loader``."""
    return (f"is {found(loader)}, which the accounting does not cover: the ε it would report "
            f"does not hold for it. {ALTERNATIVES}")


def records(loader: Any) -> int | None:
    """How many records the loader reads (len of its dataset), or None if unknown."""
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        return None


def rate_mismatch(loader: Any) -> str | None:
    """Why the sampler's q is not each record's draw probability, or None if it is.

    Opacus' Poisson sampler draws from ``range(num_samples)``: when that is
    not the dataset the loader reads (a Subset whose size the sampler
    ignores), records are drawn at another rate than q, or never.
    """
    batch_sampler = getattr(loader, "batch_sampler", None)
    if type(batch_sampler).__name__ != "UniformWithReplacementSampler":
        return None
    n, m = records(loader), getattr(batch_sampler, "num_samples", None)
    if n is None or not isinstance(m, int) or n == m:
        return None
    return (f"draws indices from {m} samples but its dataset has {n} records: the charged "
            f"q = {getattr(batch_sampler, 'sample_rate', None)} is not the rate at which each record is drawn; "
            "build the DPDataLoader from a loader over the dataset you train on "
            "(DPDataLoader.from_data_loader(DataLoader(subset, ...)))")


FLOAT32_ROUNDING = 2.0**-24
"""The relative error of rounding a number to float32 (half its unit in the last place)."""


def within_float32(a: float, b: float) -> bool:
    """Whether ``a`` and ``b`` differ by no more than rounding one of them to float32."""
    return abs(a - b) <= FLOAT32_ROUNDING * max(abs(a), abs(b))


def check_hand_rate(name: str, given: float, loader_rate: float | None) -> float:
    """The q to charge for a q set by hand, given the Poisson loader's own: refused where
    they differ by more than float32 rounding (a rate written down as ``np.float32`` or
    read from a float32 tensor), else the larger of the two, so the charge never falls
    below the rate the loader draws at (the RDP of the subsampled Gaussian grows with q)."""
    if loader_rate is None:
        return given
    if not within_float32(given, loader_rate):
        raise InvalidArgumentError(
            name, given, f"differs from the rate the data loader samples at "
            f"({_exact(loader_rate)}): the charge must be the probability each record is drawn; "
            "leave sample_rate out to use the loader's")
    return max(given, loader_rate)


def drawn_in_one_step(q: float, draws: int) -> float:
    """P(a record joins at least one of ``draws`` independent Poisson(q) batches): 1 − (1 − q)^d.

    Written −expm1(d·log1p(−q)) so that it stays exact for q ≪ 1.
    """
    return float(-math.expm1(draws * math.log1p(-q))) if q < 1 else 1.0


def _inner_poisson(batch_sampler: Any) -> Any:
    """The Poisson batch sampler a wrapper re-batches (accelerate's BatchSamplerShard holds
    it as ``batch_sampler``; other wrappers as ``sampler``), or None."""
    for attr in ("batch_sampler", "sampler"):
        inner = getattr(batch_sampler, attr, None)
        if type(inner).__name__ in ACCOUNTED:
            return inner
    return None


def _shards(batch_sampler: Any) -> int | None:
    """How many ranks a sharding wrapper deals batches to, where it says."""
    for attr in ("num_processes", "num_replicas", "world_size"):
        value = getattr(batch_sampler, attr, None)
        if isinstance(value, int) and value >= 1:
            return value
    return None


def wrapped_poisson(batch_sampler: Any) -> str | None:
    """What a sharding wrapper around a Poisson sampler does to q, with both numbers, or None.

    Each of the W ranks of such a wrapper (accelerate's ``BatchSamplerShard``
    with ``split_batches=False``) takes its own batch of the inner sampler,
    so one global step is W independent Poisson(q) batches: a record is in it
    with probability 1 − (1 − q)^W, and up to W times, not the q charged.
    (accelerate refuses ``split_batches=True`` on a batch sampler without a
    fixed batch size, as a Poisson one is.)
    """
    inner = _inner_poisson(batch_sampler)
    if inner is None:
        return None
    name, q = type(batch_sampler).__name__, getattr(inner, "sample_rate", None)
    shards = _shards(batch_sampler)
    if not isinstance(q, (int, float)) or not 0 < q <= 1 or shards is None:
        return (f"a {name} that re-batches a Poisson sampler ({type(inner).__name__}): what "
                "each record's draw probability becomes is unknown")
    if getattr(batch_sampler, "split_batches", False):
        return f"a {name} that splits each batch of a Poisson sampler (q = {_exact(q)}) across ranks"
    return (f"a {name} that deals {shards} ranks their own batches of a Poisson sampler: one "
            f"global step holds each record with probability "
            f"{_up(drawn_in_one_step(q, shards), '.4g')} (up to {shards} times), not the "
            f"charged q = {_exact(q)}")


def wrapped_allocation(batch_sampler: Any) -> str | None:
    """What a wrapper that re-batches a random-allocation sampler breaks, or None.

    accelerate's ``prepare`` (``BatchSamplerShard``) deals each rank every
    W-th batch of its own copy of the sampler: each rank runs only some of
    the t steps the epoch is charged for, from batches that are not the
    ranks' shares of one allocation. Return the loader un-prepared.
    """
    from privguard.integrations._allocation import RandomAllocationSampler

    for attr in ("batch_sampler", "sampler"):
        inner = getattr(batch_sampler, attr, None)
        if isinstance(inner, RandomAllocationSampler):
            return (f"a {type(batch_sampler).__name__} that re-batches a "
                    f"{type(inner).__name__} (t = {inner.steps_per_epoch}): the ranks no longer "
                    "run the t steps of one allocation that RandomAllocation(σ, t) charges. "
                    "Return the loader without accelerator.prepare (or any sharding wrapper); "
                    "under DDP give it DistributedRandomAllocationSampler, which shares each "
                    "step's batch among the ranks itself")
    return None


def distributed_mismatch(loader: Any, world_size: int) -> str | None:
    """Why a Poisson loader under DDP with ``world_size`` ranks is not drawn at q, or None.

    A non-distributed ``UniformWithReplacementSampler`` on every rank (a
    ``DPDataLoader`` built without ``distributed=True``) draws each rank's
    batch from all records: Opacus' distributed optimizer sums the W
    clipped batches and adds one noise draw, so each record is in a global
    step with probability 1 − (1 − q)^W and up to W times, where the charge
    assumes q. (``DistributedUniformWithReplacementSampler`` gives each rank
    its own share of the records, each drawn at q: that one is q.)
    """
    batch_sampler = getattr(loader, "batch_sampler", None)
    if world_size <= 1 or type(batch_sampler).__name__ != "UniformWithReplacementSampler":
        return None
    q = getattr(batch_sampler, "sample_rate", None)
    if not isinstance(q, (int, float)) or not 0 < q <= 1:
        return None
    return (f"is a non-distributed Poisson sampler under DDP with {world_size} ranks: every "
            f"rank draws its own batch from all {records(loader)} records at q = {_exact(q)}, so one "
            f"global step holds each record with probability "
            f"{_up(drawn_in_one_step(q, world_size), '.4g')} (up to {world_size} times), not "
            f"the charged q = {_exact(q)}; build the loader with DPDataLoader.from_data_loader(loader, "
            "distributed=True) (make_private does so for a DPDDP model)")
