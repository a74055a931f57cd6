"""Which loader a DPDataLoader was built from, and a warning when its q is not what was meant (private).

Opacus' ``DPDataLoader.from_data_loader`` (which ``make_private`` and
``make_private_with_epsilon`` call) samples every record of the dataset at
q = 1/len(loader), the number of batches of the loader it replaces, and
keeps nothing else of it. For a loader over the whole dataset that q is
at most batch_size/len(dataset) (len(loader) = ⌈N/B⌉ ≥ N/B), so the
expected batch q·N is at most the loader's batch size B. When the replaced
sampler drew fewer records per epoch than the dataset holds — a
``WeightedRandomSampler(weights, num_samples=M)`` with M ≪ N (Opacus #813),
a ``RandomSampler(num_samples=M)``, a ``DistributedSampler`` on one process
— len(loader) = ⌈M/B⌉ and q·N ≈ B·N/M, orders of magnitude above the batch
the user wrote. The charge at that q is honest (each record really is drawn
at q), so privguard does not refuse it; it warns at attach with both numbers
and what the run will cost (:class:`SampleRateWarning`).

The replaced loader is gone by attach time, so this module records, for
each ``DPDataLoader`` built by ``from_data_loader`` after privguard's Opacus
integration was imported, the replaced loader's batch size and records per
epoch (:func:`install`, a transparent wrapper of the class method: it
returns what Opacus returns). A loader built before that import, or by hand,
has no record and gets no warning.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any

_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MARK = "_privguard_records_source"


class SampleRateWarning(UserWarning):
    """The loader's q is honest but far above the batch the user's own loader had (Opacus #813)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """What the loader a ``DPDataLoader`` replaced sampled.

    Attributes:
        sampler: the replaced loader's sampler class name.
        batch_size: its batch size B (None if it had a custom batch sampler).
        batches: its number of batches per epoch (Opacus' q is 1/batches).
        drawn: records its sampler drew per epoch (len(sampler)), or None.
        records: len(dataset).
    """

    sampler: str
    batch_size: int | None
    batches: int
    drawn: int | None
    records: int

    @classmethod
    def of(cls, loader: Any) -> Source | None:
        """Read a DataLoader before Opacus replaces it (None where it cannot be read)."""
        try:
            batches, records = len(loader), len(loader.dataset)
        except (TypeError, AttributeError):
            return None
        sampler = getattr(loader, "sampler", None)
        try:
            drawn: int | None = len(sampler)  # type: ignore[arg-type]
        except TypeError:
            drawn = None
        size = getattr(loader, "batch_size", None)
        if size is None:
            size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        return cls(type(sampler).__name__, size if isinstance(size, int) else None, batches,
                   drawn, records)


def install() -> None:
    """Wrap ``DPDataLoader.from_data_loader`` to record each new loader's :class:`Source` (once)."""
    from opacus.data_loader import DPDataLoader

    bound = DPDataLoader.__dict__.get("from_data_loader")
    func = getattr(bound, "__func__", None)
    if func is None or getattr(func, _MARK, False):
        return

    @functools.wraps(func)
    def from_data_loader(cls: Any, data_loader: Any, *args: Any, **kwargs: Any) -> Any:
        made = func(cls, data_loader, *args, **kwargs)
        source = Source.of(data_loader)
        if source is not None:
            try:
                _SOURCES[made] = source
            except TypeError:  # not weak-referenceable: no record, no warning
                pass
        return made

    setattr(from_data_loader, _MARK, True)
    DPDataLoader.from_data_loader = classmethod(from_data_loader)


def source_of(loader: Any) -> Source | None:
    """The recorded :class:`Source` of ``loader``, or None."""
    try:
        return _SOURCES.get(loader)
    except TypeError:
        return None


def unintended_rate(loader: Any, q: float) -> tuple[int, float] | None:
    """(B, B/N) when the Poisson rate ``q`` of ``loader`` is far above what its source meant.

    For a source over the whole dataset q·N ≤ B (q = 1/⌈N/B⌉), so q·N > B
    means the source drew fewer records per epoch than the dataset holds:
    the expected batch q·N is then above every batch the user's loader
    ever made. A source with ``drop_last=True`` (q·N can exceed B by less
    than one batch) is refused elsewhere and not judged here. Under DDP
    (Opacus' distributed Poisson sampler over W ranks) the source is
    usually a ``DistributedSampler`` with B records per rank's batch:
    q·N ≤ W·B then, and W·B is the batch compared.
    """
    source = source_of(loader)
    if source is None or source.batch_size is None or source.records <= 0:
        return None
    b = source.batch_size
    batch_sampler = getattr(loader, "batch_sampler", None)
    ranks = getattr(batch_sampler, "num_replicas", 1)  # DDP: B per rank, W·B per global step
    if type(batch_sampler).__name__ == "DistributedUniformWithReplacementSampler" and \
            isinstance(ranks, int) and ranks > 1:
        b *= ranks
    if q * source.records <= b * (1 + 1e-9) or getattr(loader, "drop_last", False):
        return None
    return b, min(1.0, b / source.records)


def warning_text(loader: Any, q: float, b: int, meant: float, sigma: float, ledger: Any) -> str:
    """The text of the :class:`SampleRateWarning`: both numbers and what the run will cost."""
    from privguard import mechanisms as M
    from privguard._accounting._results import exact, upper, whole_count
    from privguard._errors import PrivguardError
    from privguard._mechanisms._curve import RDPCurve

    source = source_of(loader)
    assert source is not None
    n, steps = source.records, max(1, round(1 / q))
    drew = "" if source.drawn is None else f" drew {source.drawn} of the {n} records per epoch and"
    text = (f"data_loader samples every one of the {n} records at q = 1/len(loader) = {exact(q)} "
            f"(expected batch {q * n:.6g}), {q / meant:.3g}× the rate of your loader's batch "
            f"size {b} (batch_size/len(dataset) = {meant:.4g}): its {source.sampler}{drew} "
            f"made {source.batches} batches, and Opacus' DPDataLoader replaced it by Poisson "
            f"sampling at 1/{source.batches} over the whole dataset (Opacus #813). The charge "
            "is honest for what runs, but likely not what you meant")
    if sigma > 0 and ledger.delta is not None:
        try:  # the cost is information: a failure to compute it must not fail the attach
            epoch = M.SubsampledGaussian(sigma, q, steps=steps)
            eps = RDPCurve._trusted(ledger.orders, epoch.rdp(ledger.orders)).epsilon(ledger.delta)
            text += (f": one pass over this loader ({steps} steps at σ = {exact(sigma)}) costs "
                     f"ε = {upper(eps, '.4g')} at δ = {exact(ledger.delta)} on its own (rounded "
                     "up)")
            if ledger.target is not None:
                allowed = ledger.remaining(M.SubsampledGaussian(sigma, q)).repeats
                text += f", and the budget admits {whole_count(allowed)} more steps"
        except PrivguardError:
            pass
    return (text + ". To sample at batch_size/len(dataset), build the DPDataLoader from a "
            "loader over the whole dataset (DataLoader(dataset, batch_size=B)); to keep "
            "weighted sampling, no Poisson accounting covers it")
