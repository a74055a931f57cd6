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
import contextvars
import dataclasses
import functools
from typing import Any, ClassVar

import numpy as np

from privguard import _validation as check
from privguard._curves import _legacy
from privguard._errors import InvalidArgumentError, PrivguardError, UnknownMechanismError

_REGISTRY: dict[str, type[Mechanism]] = {}
_DECODING_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("_DECODING_DEPTH", default=0)


class Mechanism(abc.ABC):
    """Base class of every mechanism (privacy cost) privguard can charge."""

    type_name: ClassVar[str]
    _nesting: int = 1  # how deeply mechanisms nest inside this one (1: holds none)

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
                or contains an order outside [1 + 10^-5, 10^6] (see
                ``privguard._curves._orders``) or a non-finite value; or the computed curve is not a valid RDP
                curve (NaN, negative, or decreasing in the order beyond
                round-off; see :class:`privguard.RDPCurve`).
        """
        grid = check.orders("orders", orders)
        return np.array(self._rdp_checked(grid))

    def _rdp_checked(self, grid: np.ndarray) -> np.ndarray:
        """The curve on an already validated grid, checked (read-only).

        Checked: one value per order, none NaN or negative, non-decreasing in
        the order up to round-off (``_validation.non_decreasing``); a curve
        that fails is a bug in its computation and is never charged.
        Cached process-wide per (mechanism, grid): mechanisms are immutable
        values, so equal parameters always give the same curve. Not cached while
        :func:`privguard._curves._legacy.pre_revision` is on (a load re-deriving an old
        fix entry): a pre-e08c1f5 curve never reaches the cache.
        """
        if _legacy.active():
            return _checked_curve(self, grid)
        try:
            hash(self)
        except TypeError:  # an unhashable parameter: compute without the cache
            return _checked_curve(self, grid)
        return _cached_curve(self, grid.tobytes())

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
        fields = dataclasses.fields(self)  # type: ignore[arg-type]  # subclasses are dataclasses
        return {f.name: _encode(getattr(self, f.name)) for f in fields}


@functools.lru_cache(maxsize=4096)
def _cached_curve(mechanism: Mechanism, grid_bytes: bytes) -> np.ndarray:
    return _checked_curve(mechanism, np.frombuffer(grid_bytes, dtype=np.float64))


def _checked_curve(mechanism: Mechanism, grid: np.ndarray) -> np.ndarray:
    name = f"rdp of {mechanism!r}"
    values = check.rdp_values(name, mechanism._rdp(grid), grid.size)
    check.non_decreasing(name, values, grid, values)
    return values


def _encode(value: Any) -> Any:
    if isinstance(value, Mechanism):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def mechanism_from_dict(data: Any) -> Mechanism:
    """Rebuild a mechanism from :meth:`Mechanism.to_dict` output.

    Any JSON-like input either gives a mechanism or raises a privguard error;
    nesting deeper than ``MAX_NESTING`` (32) levels is refused before it is
    decoded.

    Raises:
        UnknownMechanismError: the type name is not registered.
        InvalidArgumentError: the dict is malformed or its parameters invalid.

    Example:
        >>> from privguard import mechanism_from_dict
        >>> mechanism_from_dict({"type": "Gaussian", "params": {"noise_multiplier": 2.0}})
        Gaussian(noise_multiplier=2.0)
    """
    if not isinstance(data, dict) or set(data) != {"type", "params"}:
        raise InvalidArgumentError("data", check.short(data),
                                   "must be a dict with keys 'type' and 'params'")
    name = data["type"]
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise UnknownMechanismError(
            "mechanism type", check.short(name), f"is not one of the known types {sorted(_REGISTRY)}"
        )
    params = data["params"]
    if not isinstance(params, dict):
        raise InvalidArgumentError("params", check.short(params), "must be a dict")
    depth = _DECODING_DEPTH.get() + 1
    if depth > check.MAX_NESTING:
        raise InvalidArgumentError(
            "mechanism", check.short(data),
            f"nests more than {check.MAX_NESTING} mechanisms deep (the most privguard builds)")
    token = _DECODING_DEPTH.set(depth)
    try:
        return cls._from_params(params)
    except PrivguardError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError, IndexError, ArithmeticError) as exc:
        reason = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise InvalidArgumentError("params", check.short(params),
                                   f"do not fit {name}: {check.short(reason)}") from None
    finally:
        _DECODING_DEPTH.reset(token)


def take(params: dict[str, Any], name: str, required: tuple[str, ...],
         optional: tuple[str, ...] = ()) -> list[Any]:
    """The values of ``required`` then ``optional`` keys (None if absent); no other key allowed."""
    missing = [k for k in required if k not in params]
    extra = [k for k in params if k not in required and k not in optional]
    if missing or extra:
        raise InvalidArgumentError(
            "params", check.short(params),
            f"do not fit {name}: it takes {list(required + optional)}"
            + (f"; missing {missing}" if missing else "") + (f"; unexpected {extra}" if extra else ""))
    return [params[k] for k in required] + [params.get(k) for k in optional]

