"""The mechanism protocol and the registry that makes journal entries replayable.

A mechanism is a frozen value object describing one private computation. It
knows its RDP curve on any grid of orders and serialises to a plain dict
(``{"type": ..., "params": ...}``) from which :func:`mechanism_from_dict`
rebuilds an equal object. Stability contract (as dp_accounting's events): the
meaning of a registered type name and of its parameters never changes; a new
analysis gets a new name.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, ClassVar

import numpy as np

from privguard import _validation as check
from privguard._errors import InvalidArgumentError, UnknownMechanismError

_REGISTRY: dict[str, type[Mechanism]] = {}


class Mechanism(abc.ABC):
    """Base class of every mechanism (privacy cost) privguard can charge."""

    type_name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "__abstractmethods__", None):
            name = cls.__dict__.get("type_name", cls.__name__)
            cls.type_name = name
            _REGISTRY[name] = cls

    def rdp(self, orders) -> np.ndarray:
        """The RDP curve ε(α) at each order of ``orders`` (a new numpy array).

        Raises:
            InvalidArgumentError: ``orders`` is empty, unsorted, duplicated,
                or contains an order <= 1 or a non-finite value.
        """
        grid = check.orders("orders", orders)
        return np.array(self._rdp_checked(grid))

    def _rdp_checked(self, grid: np.ndarray) -> np.ndarray:
        """The curve on an already validated grid, checked for NaN/negatives (read-only).

        Cached process-wide per (mechanism, grid): mechanisms are immutable
        values, so equal parameters always give the same curve.
        """
        try:
            return _cached_curve(self, grid.tobytes())
        except TypeError:  # an unhashable parameter: compute without the cache
            return check.rdp_values(f"rdp of {self!r}", self._rdp(grid), grid.size)

    @abc.abstractmethod
    def _rdp(self, orders: np.ndarray) -> np.ndarray:
        """The curve on a validated grid (subclasses implement this)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description that :func:`mechanism_from_dict` inverts."""
        return {"type": self.type_name, "params": self._params()}

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> Mechanism:
        return cls(**params)

    def _params(self) -> dict[str, Any]:
        return {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)}


@functools.lru_cache(maxsize=4096)
def _cached_curve(mechanism: Mechanism, grid_bytes: bytes) -> np.ndarray:
    grid = np.frombuffer(grid_bytes, dtype=np.float64)
    return check.rdp_values(f"rdp of {mechanism!r}", mechanism._rdp(grid), grid.size)


def _encode(value: Any) -> Any:
    if isinstance(value, Mechanism):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def mechanism_from_dict(data: Any) -> Mechanism:
    """Rebuild a mechanism from :meth:`Mechanism.to_dict` output.

    Raises:
        UnknownMechanismError: the type name is not registered.
        InvalidArgumentError: the dict is malformed or its parameters invalid.
    """
    if not isinstance(data, dict) or set(data) != {"type", "params"}:
        raise InvalidArgumentError("mechanism", data, "must be a dict with keys 'type' and 'params'")
    name = data["type"]
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise UnknownMechanismError(
            "mechanism type", name, f"is not one of the known types {sorted(_REGISTRY)}"
        )
    params = data["params"]
    if not isinstance(params, dict):
        raise InvalidArgumentError("params", params, "must be a dict")
    try:
        return cls._from_params(params)
    except TypeError as exc:
        raise InvalidArgumentError("params", params, f"do not fit {name}: {exc}") from None

