"""Which data loaders sample by Poisson sampling, and at what rate (private).

The ledger charges each DP-SGD step as a Poisson-subsampled Gaussian (every
record joins a batch independently with probability q). That bound does not
hold for shuffled fixed-size batches, so every integration that can see the
training loader checks it here, and one that cannot see it says so.
"""

from __future__ import annotations

import warnings
from typing import Any

from privguard import _validation as check
from privguard._accounting._results import exact
from privguard._errors import InvalidArgumentError
from privguard.integrations import _samplers

__all__ = ["NonPoissonSamplingError", "PoissonUnverifiedWarning", "check_loader",
           "check_poisson", "is_loader", "poisson_rate", "warn_unverified"]

# Opacus' Poisson batch samplers (opacus.utils.uniform_sampler); matched by name so
# that this module does not import torch.
_POISSON_SAMPLERS = ("UniformWithReplacementSampler", "DistributedUniformWithReplacementSampler")


class NonPoissonSamplingError(InvalidArgumentError):
    """The data loader does not sample by Poisson sampling, which the accounting assumes."""


class PoissonUnverifiedWarning(UserWarning):
    """The integration cannot see the data loader, so it cannot check Poisson sampling."""


LOADER_PARTS = ("batch_sampler", "sampler", "dataset")
"""What every data loader privguard reads has at least one of (torch's ``DataLoader`` and its
subclasses, Opacus' ``DPDataLoader``, accelerate's shards, a loader with a batch sampler)."""


def _has(obj: Any, attr: str) -> bool:
    """``hasattr``, False where the attribute's getter raises anything (not only AttributeError)."""
    try:
        return hasattr(obj, attr)
    except Exception:  # by design: a broken property means no such part, not a crash
        return False


def _is_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a torch ``Dataset`` (a ``Subset`` has a ``dataset`` too), matched by
    name so that this module does not import torch."""
    return any(c.__name__ == "Dataset" and c.__module__.startswith("torch.utils.data")
               for c in type(obj).__mro__)


def is_loader(loader: Any) -> bool:
    """Whether ``loader`` is shaped like a data loader: not a string, a number, a builtin
    collection or a torch ``Dataset``, and with at least one of :data:`LOADER_PARTS`."""
    return not isinstance(loader, (str, bytes, bytearray, int, float, complex, list, tuple,
                                   dict, set, frozenset)) and not _is_dataset(loader) and \
        any(_has(loader, part) for part in LOADER_PARTS)


def check_loader(name: str, loader: Any) -> None:
    """Refuse, with :class:`InvalidArgumentError` naming ``name`` and the value, what is not a
    data loader: a string, a number, a list, a torch ``Dataset`` (a ``Subset`` has a ``dataset``;
    with ``check_poisson=False`` it was charged at 1/len, one record's share) or anything with
    none of :data:`LOADER_PARTS` (review rnw: ``attach(..., data_loader="x")`` was refused as "not Poisson sampling", and
    with ``check_poisson=False`` accepted, its ``len()`` setting the charged rate).

    Example:
        >>> try:
        ...     check_loader("data_loader", "x")
        ... except InvalidArgumentError as exc:
        ...     exc.argument, exc.value
        ('data_loader', 'x')
    """
    if not is_loader(loader):
        what = (f"{type(loader).__name__}, a torch Dataset, not the loader over it"
                if _is_dataset(loader) else
                f"{type(loader).__name__}, with none of {', '.join(LOADER_PARTS)}")
        raise InvalidArgumentError(
            name, check.short(loader),
            f"is not a data loader ({what}): pass the training loader (a torch DataLoader, "
            "such as the one make_private returned), or leave it out and pass sample_rate=")


def nominal_rate(name: str, loader: Any) -> float:
    """1/len(``loader``): the rate charged for a loader not checked as Poisson
    (``check_poisson=False``); InvalidArgumentError naming ``name`` if it has no length.

    Example:
        >>> nominal_rate("data_loader", [[1, 2], [3, 4]])
        0.5
    """
    try:
        return check.sample_rate(name, 1.0 / len(loader))
    except (TypeError, ZeroDivisionError) as exc:
        raise InvalidArgumentError(name, type(loader).__name__,
                                   "has no length to derive a sample rate from; pass "
                                   "sample_rate=") from exc


def poisson_rate(loader: Any) -> float | None:
    """The Poisson sampling rate of ``loader``, or None if it does not sample by Poisson.

    A loader samples by Poisson when its batch sampler is one of Opacus' Poisson
    samplers, as in Opacus' ``DPDataLoader`` (``make_private(...,
    poisson_sampling=True)``, the default). A wrapper that re-batches (e.g. a
    sharding wrapper of accelerate over several processes) has another batch
    sampler and is not Poisson.

    Example:
        >>> poisson_rate([1, 2, 3]) is None
        True
    """
    sampler = getattr(loader, "batch_sampler", None)
    if type(sampler).__name__ in _POISSON_SAMPLERS:
        rate = getattr(sampler, "sample_rate", None)
        if isinstance(rate, (int, float)) and 0 < rate <= 1:
            return float(rate)
    return None


def check_poisson(loader: Any, name: str = "data_loader") -> float:
    """The Poisson rate of ``loader``; raise :class:`NonPoissonSamplingError` if it has none.

    Example:
        >>> try:
        ...     check_poisson([1, 2, 3], "train_dataloader")
        ... except NonPoissonSamplingError as exc:
        ...     exc.argument
        'train_dataloader'
    """
    refuse_rand_on_empty(loader, name)
    rate = poisson_rate(loader)
    if rate is None or getattr(loader, "drop_last", False):  # issue 27: refused by name
        sampler = type(getattr(loader, "batch_sampler", None)).__name__
        raise NonPoissonSamplingError(
            name, f"{type(loader).__name__} (batch sampler {sampler})",
            "does not do Poisson sampling, which the subsampled-Gaussian accounting assumes: "
            + _samplers.refusal(loader))
    mismatch = _samplers.rate_mismatch(loader)
    if mismatch is not None:
        raise NonPoissonSamplingError(name, f"{type(loader).__name__} (q = {exact(rate)})", mismatch)
    return rate


def refuse_rand_on_empty(loader: Any, name: str = "data_loader") -> None:
    """Raise :class:`~privguard.InvalidArgumentError` naming ``name`` if ``loader``'s collate
    function is Opacus' ``CollateFnWithEmpty`` with ``rand_on_empty=True``
    (``make_private(..., rand_on_empty=True)``); otherwise return.

    Review radv4: such a loader replaces an empty batch by one made-up record of random
    0/1 values, whose clipped gradient (norm up to C) enters the noised sum. The batch
    function then has add/remove sensitivity 2C, not C, where the rest of the batch is
    empty: the step of a record x drawn alone releases clip(g_x) + N(0, σ²C²) against
    clip(g_fake) + N(0, σ²C²) without it, a shift of up to 2C, so the step is not the
    ``SubsampledGaussian(σ, q)`` it would be charged as (an under-count whose weight is the
    chance (1 − q)^(n−1) that the rest of the batch is empty: large for small data sets).
    Opacus' default (``rand_on_empty=False``, a batch of 0 rows) adds nothing and is sound.

    Example:
        >>> refuse_rand_on_empty([1, 2, 3])
    """
    collate = getattr(loader, "collate_fn", None)
    if getattr(collate, "rand_on_empty", False) is not True:
        return
    raise InvalidArgumentError(
        name, f"{type(loader).__name__} (rand_on_empty=True)",
        "makes up one random record for an empty batch, whose clipped gradient is added to "
        "the noised sum: a record drawn alone then moves the sum by up to 2·max_grad_norm, "
        "not max_grad_norm, so the step is not the SubsampledGaussian it would be charged "
        "as. Use make_private(..., rand_on_empty=False) (Opacus' default)")


def warn_unverified(stacklevel: int) -> None:
    """Warn (once per call site's call) that the loader could not be checked."""
    warnings.warn(
        "privguard cannot see the training data loader, so it cannot check that batches "
        "are Poisson-sampled, which the ledger's subsampled-Gaussian accounting assumes "
        "(make_private(..., poisson_sampling=False) or a shuffled DataLoader would make the "
        "reported ε invalid). Pass data_loader=<your loader> to attach() to have it checked, "
        "or check_poisson=False once you have checked it yourself",
        PoissonUnverifiedWarning, stacklevel=stacklevel + 1)
