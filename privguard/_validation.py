"""Argument checks shared by every public entry point.

Each check raises :class:`InvalidArgumentError` naming the argument and the
offending value, before anything is computed or recorded.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from privguard._errors import InvalidArgumentError


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(name, value, "must be a real number")
    return float(value)


def positive_finite(name: str, value: Any) -> float:
    """A real number in (0, inf)."""
    x = _as_float(name, value)
    if not (math.isfinite(x) and x > 0):
        raise InvalidArgumentError(name, value, "must be finite and > 0")
    return x


def non_negative_finite(name: str, value: Any) -> float:
    """A real number in [0, inf)."""
    x = _as_float(name, value)
    if not (math.isfinite(x) and x >= 0):
        raise InvalidArgumentError(name, value, "must be finite and >= 0")
    return x


def delta(name: str, value: Any) -> float:
    """A δ in the open interval (0, 1)."""
    x = _as_float(name, value)
    if not (0.0 < x < 1.0):  # also rejects NaN
        raise InvalidArgumentError(name, value, "must lie in the open interval (0, 1)")
    return x


def sample_rate(name: str, value: Any) -> float:
    """A Poisson sampling rate in (0, 1]."""
    x = _as_float(name, value)
    if not (0.0 < x <= 1.0):
        raise InvalidArgumentError(name, value, "must lie in (0, 1]")
    return x


def positive_int(name: str, value: Any) -> int:
    """An integer >= 1 (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(name, value, "must be an integer >= 1")
    if value < 1:
        raise InvalidArgumentError(name, value, "must be an integer >= 1")
    return int(value)


def fraction(name: str, value: Any) -> float:
    """A real number in (0, 1]."""
    x = _as_float(name, value)
    if not (0.0 < x <= 1.0):
        raise InvalidArgumentError(name, value, "must lie in (0, 1]")
    return x


def orders(name: str, value: Any) -> np.ndarray:
    """A non-empty, strictly increasing 1-D grid of finite Rényi orders > 1.

    Returns a read-only float64 copy.
    """
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError(name, value, "must be a sequence of numbers") from None
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidArgumentError(name, value, "must be a non-empty 1-D sequence")
    if not np.all(np.isfinite(arr)):
        raise InvalidArgumentError(name, value, "orders must be finite (no NaN/inf)")
    if np.any(arr <= 1.0):
        bad = arr[arr <= 1.0][0]
        raise InvalidArgumentError(name, value, f"every order must be > 1 (found {bad})")
    if np.any(np.diff(arr) <= 0):
        i = int(np.argmax(np.diff(arr) <= 0))
        raise InvalidArgumentError(
            name, value,
            f"orders must be strictly increasing without duplicates "
            f"(found {arr[i]} then {arr[i + 1]})",
        )
    arr.setflags(write=False)
    return arr


def rdp_values(name: str, value: Any, size: int) -> np.ndarray:
    """RDP values: non-negative, not NaN (``inf`` allowed), of length ``size``.

    Returns a read-only float64 copy.
    """
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError(name, value, "must be a sequence of numbers") from None
    if arr.ndim != 1 or arr.size != size:
        raise InvalidArgumentError(
            name, value, f"must be a 1-D sequence of length {size} (one per order)"
        )
    if np.any(np.isnan(arr)):
        raise InvalidArgumentError(name, value, "RDP values must not be NaN")
    if np.any(arr < 0):
        bad = arr[arr < 0][0]
        raise InvalidArgumentError(name, value, f"RDP values must be >= 0 (found {bad})")
    arr.setflags(write=False)
    return arr
