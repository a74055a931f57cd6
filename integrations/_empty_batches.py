"""A DataLoader ``collate_fn`` for batches that may be empty (random allocation).

A :class:`~privguard.integrations.RandomAllocationSampler` batch is empty with
probability (1 − 1/t)^n for n examples and t steps (docs/theory.md §15): such a step
must still run and add its noise, as the accounting assumes. PyTorch's default
collate function cannot stack an empty batch (``IndexError``); Opacus'
``DPDataLoader`` wraps its collate for Poisson batches, but a loader built with a
batch sampler of one's own is not wrapped (``make_private(..., poisson_sampling=False)``
keeps the loader's collate). :class:`EmptyBatchCollate` collates an empty batch as
the dataset's first example collated alone, cut to zero rows: every tensor keeps its
dtype and its shape past the batch dimension, so the model's forward pass, Opacus'
per-example gradients (none) and the noise run as for any batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from privguard._errors import InvalidArgumentError

__all__ = ["EmptyBatchCollate"]


class EmptyBatchCollate:
    """A ``collate_fn`` that also collates an empty batch (a DataLoader's ``collate_fn``).

    Args:
        dataset: the loader's dataset (its first example gives the empty batch's
            shapes and dtypes; it is read only for an empty batch). An empty
            dataset is refused (``InvalidArgumentError``), here, or at the first
            empty batch where it has no ``len``.
        collate_fn: the collate function of non-empty batches (default: PyTorch's
            ``default_collate``).

    A non-empty batch is ``collate_fn(batch)``; an empty one is
    ``collate_fn([dataset[0]])`` with every tensor and array cut to its first zero
    rows (in tuples, lists and mappings; a list or tuple of plain values, e.g.
    strings, becomes empty). The batch dimension must be the first (a
    sequence-first collate, ``pad_sequence(batch_first=False)``, would give one
    example of length zero). It can be pickled with its dataset (loader workers).

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from privguard.integrations import EmptyBatchCollate, RandomAllocationSampler
        >>> data = TensorDataset(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
        >>> loader = DataLoader(data, collate_fn=EmptyBatchCollate(data),
        ...                     batch_sampler=RandomAllocationSampler(2, steps_per_epoch=4))
        >>> [tuple(x.shape) for x, _ in loader].count((0, 3)) >= 2  # 2 examples, 4 steps
        True
    """

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any] | None = None
                 ) -> None:
        if not hasattr(dataset, "__getitem__"):
            raise InvalidArgumentError("dataset", dataset,
                                       "must be indexable (the loader's dataset)")
        if _empty(dataset):  # no first example to take an empty batch's shapes from
            raise InvalidArgumentError("dataset", dataset, _NO_FIRST)
        if collate_fn is not None and not callable(collate_fn):
            raise InvalidArgumentError("collate_fn", collate_fn, "must be callable or None")
        self.dataset, self.collate_fn = dataset, collate_fn

    def __call__(self, batch: list[Any]) -> Any:
        collate = self.collate_fn
        if collate is None:
            from torch.utils.data import default_collate

            collate = default_collate
        if len(batch):
            return collate(batch)
        try:  # (task lo: an empty dataset raised IndexError here)
            first = self.dataset[0]
        except LookupError:  # IndexError, KeyError: emptied since, or not indexed from 0
            raise InvalidArgumentError("dataset", self.dataset, _NO_FIRST) from None
        return _no_rows(collate([first]))


_NO_FIRST = ("must have a first example, dataset[0] (an empty batch is collated from it: "
             "its shapes and dtypes)")


def _empty(dataset: Any) -> bool:
    """Whether ``dataset`` says it has no examples (one without a usable ``len`` is
    checked at its first empty batch instead)."""
    try:
        return len(dataset) == 0
    except Exception:  # by design: a dataset of the caller's whose __len__ fails or is absent
        return False


def _no_rows(value: Any) -> Any:
    """``value`` (a collated batch of one example) with zero rows."""
    if hasattr(value, "shape") and hasattr(value, "__getitem__"):  # a tensor, an array
        if not len(value.shape):  # (review rhl: a 0-d tensor raised IndexError)
            raise InvalidArgumentError("collate_fn", value, "collated the dataset's first "
                                       "example into a value with no batch dimension (0-d)")
        return value[:0]
    if isinstance(value, Mapping):
        rows = {key: _no_rows(item) for key, item in value.items()}
        if type(value) is dict:
            return rows
        # The mapping's type, as PyTorch's default collate keeps it, or a dict where it
        # cannot be built from one (review rhl: a defaultdict raised TypeError)
        try:
            return type(value)(rows)  # type: ignore[call-arg]
        except TypeError:
            return rows
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields") \
            and not any(_has_rows(item) for item in value):
        # one plain value per example (e.g. strings: PyTorch's default collate gives a
        # tuple of them for (text, label) examples, review rhl: it raised here)
        return type(value)()
    if isinstance(value, (list, tuple)):
        items = [_no_rows(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    raise InvalidArgumentError("collate_fn", value, "collated the dataset's first example "
                               "into a value with no rows to remove (expected tensors, "
                               "arrays, or tuples, lists and mappings of them)")


def _has_rows(value: Any) -> bool:
    return hasattr(value, "shape") or isinstance(value, (list, tuple, Mapping))
