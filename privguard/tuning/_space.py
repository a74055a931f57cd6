"""Search spaces: named hyperparameters, each a finite choice or a distribution."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of finitely many values, uniformly."""

    values: tuple

    def __init__(self, values) -> None:
        if isinstance(values, (str, bytes)):
            raise InvalidArgumentError("values", values, "must be a list or tuple of values")
        try:
            vals = tuple(values)
        except Exception:  # by design: not iterable, or a caller's __iter__ that raises (adv24)
            raise InvalidArgumentError("values", values, "must be a list or tuple of values") from None
        if not vals:
            raise InvalidArgumentError("values", values, "a choice needs at least one value")
        object.__setattr__(self, "values", vals)

    def sample(self, rng: np.random.Generator) -> Any:
        return self.values[self.position(rng)]

    def position(self, rng: np.random.Generator) -> int:
        """The position of a uniformly drawn value (what :meth:`sample` draws)."""
        return int(check.generator("rng", rng).integers(len(self.values)))


@dataclasses.dataclass(frozen=True)
class UniformFloat:
    """A float uniform on [low, high]."""

    low: float
    high: float

    def __post_init__(self) -> None:
        low, high = check._as_float("low", self.low), check._as_float("high", self.high)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise InvalidArgumentError("low, high", (self.low, self.high), "need finite low < high")
        # numpy's uniform needs a finite width: (-1e308, 1e308) raised OverflowError at the
        # first draw, after a tuner charged its bound (TuningAborted; review bx)
        if not math.isfinite(high - low):
            raise InvalidArgumentError("low, high", (self.low, self.high),
                                       "need a finite width high − low")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    def sample(self, rng: np.random.Generator) -> float:
        return float(check.generator("rng", rng).uniform(self.low, self.high))


@dataclasses.dataclass(frozen=True)
class LogUniform:
    """A float whose logarithm is uniform on [log low, log high] (learning rates)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "low", check.positive_finite("low", self.low))
        object.__setattr__(self, "high", check.positive_finite("high", self.high))
        if not self.low < self.high:
            raise InvalidArgumentError("low, high", (self.low, self.high), "need low < high")

    def sample(self, rng: np.random.Generator) -> float:
        draw = check.generator("rng", rng).uniform(math.log(self.low), math.log(self.high))
        return float(math.exp(draw))


@dataclasses.dataclass(frozen=True)
class IntUniform:
    """An integer uniform on {low, ..., high}."""

    low: int
    high: int

    def __post_init__(self) -> None:
        try:  # Python or numpy integers (np.int64 was refused); never bools or floats
            low, high = check._as_int("low", self.low), check._as_int("high", self.high)
            ordered = low <= high
        except InvalidArgumentError:
            ordered = False
        if not ordered:
            raise InvalidArgumentError("low, high", (self.low, self.high), "need integers low <= high")
        # numpy draws int64: a bound beyond it raised ValueError at the first draw, after a
        # tuner charged its bound (TuningAborted; review bx)
        if low < -2**63 or high > 2**63 - 1:
            raise InvalidArgumentError("low, high", (self.low, self.high),
                                       "need integers within [-2**63, 2**63 - 1] (numpy's int64)")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    def sample(self, rng: np.random.Generator) -> int:
        return int(check.generator("rng", rng).integers(self.low, self.high + 1))


_DIMENSIONS = (Choice, UniformFloat, LogUniform, IntUniform)


class SearchSpace:
    """Named hyperparameters. Lists/tuples become :class:`Choice`; a scalar is fixed.

    Example:
        >>> import numpy as np
        >>> space = SearchSpace({"lr": [0.1, 0.3], "clip": 1.0})
        >>> space.is_finite, len(space.candidates())
        (True, 2)
        >>> sorted(space.sample(np.random.default_rng(0)))
        ['clip', 'lr']
    """

    def __init__(self, dimensions: Mapping[str, Any]) -> None:
        if not isinstance(dimensions, Mapping) or not dimensions:
            raise InvalidArgumentError("space", dimensions, "must be a non-empty {name: values} mapping")
        dims = {}
        for name, dim in dimensions.items():
            # a name is a key of every candidate's params, a string as Optuna's suggest_*
            # and this package's Optuna sampler take it; 1, None or ("lr",) were taken
            # (task lo6)
            if not isinstance(name, str):
                raise InvalidArgumentError("space", check.short(dimensions),
                                           f"has the name {name!r}: hyperparameter names "
                                           "are strings")
            if isinstance(dim, _DIMENSIONS):
                dims[name] = dim
            elif isinstance(dim, (list, tuple)):
                if not dim:  # name the hyperparameter, not Choice's internal argument
                    raise InvalidArgumentError(f"space[{name!r}]", dim,
                                               f"hyperparameter {name!r} needs at least one value")
                dims[name] = Choice(dim)
            else:
                dims[name] = Choice((dim,))
        self.dimensions = dims

    @property
    def is_finite(self) -> bool:
        return all(isinstance(d, Choice) for d in self.dimensions.values())

    def candidates(self) -> list[dict[str, Any]]:
        """Every point of a finite space (its Cartesian product)."""
        if not self.is_finite:
            raise InvalidArgumentError("space", self, "has continuous dimensions; it cannot be enumerated")
        names = list(self.dimensions)
        return [dict(zip(names, combo))
                for combo in itertools.product(*(self._choice(n).values for n in names))]

    def _choice(self, name: str) -> Choice:
        dim = self.dimensions[name]
        assert isinstance(dim, Choice)
        return dim

    def choices(self) -> dict[str, tuple]:
        """Every finite dimension's values, by name (the objects candidates are drawn from)."""
        return {name: dim.values for name, dim in self.dimensions.items()
                if isinstance(dim, Choice)}

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        return {name: dim.sample(rng) for name, dim in self.dimensions.items()}

    def draw(self, rng: np.random.Generator) -> tuple[int | None, dict[str, Any]]:
        """Like :meth:`sample` (the same draws from ``rng``), also returning the
        candidate's position in :meth:`candidates` when the space is finite."""
        if not self.is_finite:
            return None, self.sample(rng)
        index, params = 0, {}
        for name, dim in self.dimensions.items():
            assert isinstance(dim, Choice)
            pos = dim.position(rng)
            index = index * len(dim.values) + pos  # itertools.product order
            params[name] = dim.values[pos]
        return index, params

    def __repr__(self) -> str:
        return f"SearchSpace({self.dimensions})"
