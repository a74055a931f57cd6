"""What sampler a loader has, and whether its q is the rate each record is drawn at (private).

privguard charges a step by the probability q with which each record of the
dataset being trained on joins it. A loader is accepted when its batch
sampler is one privguard can account (:data:`ACCOUNTED`, one line per kind:
a new kind is added there) *and* the sampler's own parameters give that q
for the records the loader actually reads; anything else is refused by name,
with what was found and the two honest alternatives (:func:`refusal`).
"""

from __future__ import annotations

from typing import Any

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


def check_hand_rate(name: str, given: float, loader_rate: float | None) -> None:
    """Refuse a q set by hand that differs from the Poisson loader's own."""
    if loader_rate is not None and abs(given - loader_rate) > 1e-12 * max(given, loader_rate):
        raise InvalidArgumentError(
            name, given, f"differs from the rate the data loader samples at "
            f"({loader_rate:g}): the charge must be the probability each record is drawn; "
            "leave sample_rate out to use the loader's")
