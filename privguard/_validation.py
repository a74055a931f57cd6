"""Argument checks shared by every public entry point.

Each check raises :class:`InvalidArgumentError` naming the argument and the
offending value, before anything is computed or recorded. Numbers are taken
strictly: ``bool``, strings and other non-numbers are rejected, never
converted; Python and numpy integers and floats, and 0-d numpy arrays of
them, are accepted (an ``int`` or
``float`` subclass is read by its stored value, not by an overridden
``__int__``/``__float__``).
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from privguard._curves._orders import MAX_ORDER, MIN_ORDER
from privguard._errors import InvalidArgumentError

RDP_RTOL = 1e-9
"""Relative floating-point tolerance on RDP values (see :func:`rdp_tolerance`)."""

RDP_ATOL = 1e-9
"""Absolute floating-point tolerance on RDP values (see :func:`rdp_tolerance`)."""

MAX_NESTING = 32
"""How deeply mechanisms may contain mechanisms (Composed of Composed of ...)."""

MAX_STEPS = 2**53
"""The largest repetition count: every integer up to it is exact as a float."""

_short_repr = reprlib.Repr()
_short_repr.maxlevel = 3
_short_repr.maxdict = _short_repr.maxlist = _short_repr.maxtuple = 6
_short_repr.maxstring = _short_repr.maxother = 80


def short(value: Any) -> Any:
    """``value`` itself if it is a number or a short string, else a bounded repr.

    Used for values that may be huge or deeply nested (a JSON document), whose
    full repr in an error message would be unreadable or overflow the stack.
    """
    if value is None or isinstance(value, (bool, int, float)) or (
            isinstance(value, str) and len(value) <= 80):
        return value
    if type(value) in (list, tuple) and len(value) <= 6 and all(
            x is None or type(x) in (bool, int, float) or (type(x) is str and len(x) <= 20)
            for x in value):
        return value
    try:
        return _short_repr.repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        return f"<{type(value).__name__} object>"


def rdp_tolerance(value: float) -> float:
    """How far round-off may move an RDP value: ``RDP_RTOL·|value| + RDP_ATOL``."""
    return RDP_RTOL * abs(value) + RDP_ATOL


def _real(value: Any) -> float | None:
    """The float a real number stands for, or None if ``value`` is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):  # also numpy.float64; float.__float__ skips overrides
        return float.__float__(value)
    if isinstance(value, int):
        try:
            return float(int.__index__(value))
        except OverflowError:  # an integer beyond the float range
            return math.inf if value > 0 else -math.inf
    if isinstance(value, (np.integer, np.floating)):
        return float(value)
    if _zero_d(value, "iuf"):  # a 0-d array stands for its one number, as a numpy scalar does
        return float(value[()])
    if isinstance(value, numbers.Real):  # e.g. fractions.Fraction
        try:
            x = float(value)
        except Exception:
            return None
        return x if isinstance(x, float) else None
    return None


def _zero_d(value: Any, kinds: str) -> bool:
    """Whether ``value`` is a 0-d numpy array of one of the dtype ``kinds`` (``np.array(1e-5)``:
    what ``x.mean()`` of a tensor's numpy view or ``np.float64(x) * np.ones(())`` gives)."""
    return isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in kinds


def _as_float(name: str, value: Any) -> float:
    x = _real(value)
    if x is None:
        raise InvalidArgumentError(name, short(value), "must be a real number")
    return x


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(name, value, "must be an integer, not a bool")
    if isinstance(value, int):
        return int.__index__(value)  # the stored value, whatever a subclass' __int__ says
    if isinstance(value, np.integer):
        return int(value)
    if _zero_d(value, "iu"):
        return int(value[()])
    raise InvalidArgumentError(name, short(value), "must be an integer")


def generator(name: str, value: Any) -> np.random.Generator:
    """``value`` if it is a ``numpy.random.Generator`` (what every draw takes)."""
    if not isinstance(value, np.random.Generator):
        raise InvalidArgumentError(name, short(value), "must be a numpy.random.Generator")
    return value


def flag(name: str, value: Any) -> bool:
    """``value`` if it is True or False (an assertion or a switch: nothing merely truthy)."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(name, value, "must be True or False")
    return value


def optional_flag(name: str, value: Any) -> bool | None:
    """``value`` if it is None (a default decided later), True or False."""
    if value is not None and not isinstance(value, bool):
        raise InvalidArgumentError(name, value, "must be None (the default), True or False")
    return value


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


MIN_DELTA = 1e-290
"""The smallest δ accepted (issue 24). Before a logarithm, δ is multiplied by a share of
at least 0.9/2⁵³ ≈ 10⁻¹⁶ (the mixture odometer's share per read of a plan of at most
2⁵³ steps, :func:`privguard._accounting._odometer.mixture_weights`; every δ-share rule's nonzero
weights are larger or give −∞, a share that admits nothing); 10⁻²⁹⁰·10⁻¹⁶ = 10⁻³⁰⁶ is
still a normal float (≥ 2.2·10⁻³⁰⁸), so every log(share·δ) is finite. 10⁻³²³ made every
charge raise ``ValueError: math domain error``."""


def delta(name: str, value: Any, minimum: float = MIN_DELTA) -> float:
    """A δ in [``minimum``, 1); ``minimum`` 0 only for a part of a δ already checked
    (a hybrid filter's δ_A and δ_B are fractions of the ledger's δ)."""
    x = _as_float(name, value)
    if not (0.0 < x < 1.0):  # also rejects NaN
        raise InvalidArgumentError(name, value, "must lie in the open interval (0, 1)")
    if x < minimum:
        raise InvalidArgumentError(name, value, f"must be at least {MIN_DELTA:g} (smaller δ "
                                   "underflow in privguard's log computations)")
    return x


def sample_rate(name: str, value: Any) -> float:
    """A Poisson sampling rate in (0, 1]."""
    x = _as_float(name, value)
    if not (0.0 < x <= 1.0):
        raise InvalidArgumentError(name, value, "must lie in (0, 1]")
    return x


def positive_int(name: str, value: Any, maximum: int | None = None) -> int:
    """An integer >= 1 (and <= ``maximum`` if given); bools and floats rejected."""
    n = _as_int(name, value)
    if n < 1:
        raise InvalidArgumentError(name, value, "must be an integer >= 1")
    if maximum is not None and n > maximum:
        raise InvalidArgumentError(name, short(value), f"must be an integer <= {maximum}")
    return n


def fraction(name: str, value: Any) -> float:
    """A real number in (0, 1]."""
    x = _as_float(name, value)
    if not (0.0 < x <= 1.0):
        raise InvalidArgumentError(name, value, "must lie in (0, 1]")
    return x


def _real_vector(name: str, value: Any) -> np.ndarray:
    """A new 1-D float64 array from a sequence of real numbers (strings, bools rejected)."""
    if not isinstance(value, np.ndarray) and hasattr(value, "__array__") and not isinstance(
            value, (str, bytes, Mapping)):
        try:
            value = np.asarray(value)
        except Exception:
            raise InvalidArgumentError(name, short(value), "must be a sequence of numbers") from None
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise InvalidArgumentError(name, short(value), "must be a non-empty 1-D sequence")
        if value.dtype.kind in "iuf":
            return np.array(value, dtype=np.float64)
        if value.dtype.kind != "O":
            raise InvalidArgumentError(name, short(value),
                                       f"must hold real numbers (got dtype {value.dtype})")
        value = value.tolist()
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Sequence):
        raise InvalidArgumentError(name, short(value),
                                   "must be a sequence of numbers (list, tuple or 1-D array)")
    out = np.empty(len(value), dtype=np.float64)
    for i, item in enumerate(value):
        x = _real(item)
        if x is None:
            what = ("a nested sequence" if isinstance(item, (Sequence, np.ndarray))
                    and not isinstance(item, str) else repr(short(item)))
            raise InvalidArgumentError(
                name, short(value), f"must be a 1-D sequence of real numbers (item {i} is {what})")
        out[i] = x
    return out


def orders(name: str, value: Any) -> np.ndarray:
    """A non-empty, strictly increasing 1-D grid of Rényi orders in [MIN_ORDER, MAX_ORDER].

    Returns a read-only float64 copy.
    """
    arr = _real_vector(name, value)
    if arr.size == 0:
        raise InvalidArgumentError(name, short(value), "must be a non-empty 1-D sequence")
    if not np.all(np.isfinite(arr)):
        raise InvalidArgumentError(name, short(value), "orders must be finite (no NaN/inf)")
    if np.any(arr <= 1.0):
        bad = arr[arr <= 1.0][0]
        raise InvalidArgumentError(name, short(value), f"every order must be > 1 (found {bad})")
    if np.any(arr < MIN_ORDER):
        bad = arr[arr < MIN_ORDER][0]
        raise InvalidArgumentError(
            name, short(value),
            f"every order must be >= {MIN_ORDER} (found {bad!r}); orders closer to 1 give no "
            f"useful (ε, δ) conversion and lose their digits to round-off (privguard._curves._orders)")
    if np.any(arr > MAX_ORDER):
        bad = arr[arr > MAX_ORDER][0]
        raise InvalidArgumentError(
            name, short(value),
            f"every order must be <= {MAX_ORDER:g} (found {bad:g}); larger orders change no "
            f"(ε, δ) conversion and make some curves slow to evaluate (privguard._curves._orders)")
    if np.any(np.diff(arr) <= 0):
        i = int(np.argmax(np.diff(arr) <= 0))
        raise InvalidArgumentError(
            name, short(value),
            f"orders must be strictly increasing without duplicates "
            f"(found {arr[i]} then {arr[i + 1]})",
        )
    arr.setflags(write=False)
    return arr


def rdp_values(name: str, value: Any, size: int) -> np.ndarray:
    """RDP values: non-negative, not NaN (``inf`` allowed), of length ``size``.

    Returns a read-only float64 copy.
    """
    arr = _real_vector(name, value)
    if arr.size != size:
        raise InvalidArgumentError(
            name, short(value), f"must be a 1-D sequence of length {size} (one per order)"
        )
    if np.any(np.isnan(arr)):
        raise InvalidArgumentError(name, short(value), "RDP values must not be NaN")
    if np.any(arr < 0):
        bad = arr[arr < 0][0]
        raise InvalidArgumentError(name, short(value), f"RDP values must be >= 0 (found {bad})")
    arr.setflags(write=False)
    return arr


def non_decreasing(name: str, value: Any, grid: np.ndarray, values: np.ndarray) -> None:
    """Reject an RDP curve that decreases in the order beyond round-off.

    Rényi divergence is non-decreasing in α, so a curve whose value at an
    order falls below its value at a smaller order by more than
    :func:`rdp_tolerance` of the latter (``RDP_RTOL`` = 1e-9 relative plus
    ``RDP_ATOL`` = 1e-9 absolute) is not an RDP curve: it signals an error in
    its computation. The comparison is against the running maximum, so many
    small decreases cannot add up.
    """
    if values.size < 2:
        return
    running = np.maximum.accumulate(values)
    with np.errstate(invalid="ignore"):
        floor = np.where(np.isinf(running), running, running - RDP_RTOL * running - RDP_ATOL)
    bad = values < floor
    if bad.any():
        j = int(np.argmax(bad))
        i = int(np.argmax(values[:j] == running[j]))
        raise InvalidArgumentError(
            name, short(value),
            f"an RDP curve must be non-decreasing in the order (Rényi divergence is), up to "
            f"round-off ({RDP_RTOL:g} relative + {RDP_ATOL:g} absolute); found "
            f"ε({grid[i]:g}) = {values[i]:.17g} > ε({grid[j]:g}) = {values[j]:.17g}")


def nesting(name: str, children: Sequence[Any]) -> int:
    """The nesting depth of a mechanism holding ``children`` (1 + theirs), at most MAX_NESTING."""
    depth = 1 + max((getattr(c, "_nesting", 1) for c in children), default=0)
    if depth > MAX_NESTING:
        raise InvalidArgumentError(
            name, short(children),
            f"mechanisms nest {depth} deep; at most {MAX_NESTING} levels are allowed "
            f"(compose flat: Composed((a, b, c, ...)))")
    return depth
