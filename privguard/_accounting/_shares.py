"""How an (ε, δ)-DP filter splits δ over the orders of its grid.

The multi-order filter admits while at least one order stays within its
budget; that is (ε, Σ_α δ_α)-DP only when each order α gets a share
δ_α = w_α·δ fixed before any output is seen (formulas.md §2, correcting
seed 001 Cor. 1; proof in docs/theory.md §2). These value objects say how.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._curves import _conversion as conv
from privguard._errors import InvalidArgumentError


class DeltaShares:
    """Base class: a rule fixing the weights w_α (Σ w_α ≤ 1)."""

    #: True when the rule needs the planned run's curve to fix its weights.
    needs_plan: bool = False

    def weights(self, orders: np.ndarray, epsilon: float, delta: float,
                plan: np.ndarray | None) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__,
                "params": dataclasses.asdict(self)}  # type: ignore[call-overload]


@dataclasses.dataclass(frozen=True)
class Uniform(DeltaShares):
    """w_α = 1/|Λ|: sound and data-independent, but costs log|Λ| in the conversion.

    Example:
        >>> import numpy as np
        >>> Uniform().weights(np.array([2.0, 4.0]), 1.0, 1e-5, None).tolist()
        [0.5, 0.5]
    """

    def weights(self, orders, epsilon, delta, plan):
        return np.full(orders.size, 1.0 / orders.size)


@dataclasses.dataclass(frozen=True)
class Concentrated(DeltaShares):
    """Put ``share`` of δ on one order and spread the rest uniformly.

    The order is ``order`` if given; otherwise the order at which the planned
    run is cheapest relative to its budget, i.e. the α maximising
    b_α / plan(α) where b_α is the RDP level that converts to the target
    (ε, share·δ) — the order that lets the most repetitions of the plan
    through; among orders whose ratios are exactly equal (a plan of 0 at several
    orders, or an exact tie), the smallest order: the grid is strictly increasing
    and the first maximum is taken, so the choice depends on the grid's values
    alone, never on how the tie arose. The plan is the one declared on the ledger, or else the first
    charged mechanism (chosen before any output exists, so the weights stay
    data-independent). ``Concentrated(share=1.0, order=a)`` is the
    single-order filter of seed 001 Theorem 1.

    Example:
        >>> import numpy as np
        >>> w = Concentrated(share=0.9, order=4.0).weights(
        ...     np.array([2.0, 4.0]), 1.0, 1e-5, None)
        >>> [round(float(x), 12) for x in w]
        [0.05, 0.95]
    """

    share: float = 0.9
    order: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "share", check.fraction("share", self.share))
        if self.order is not None:
            object.__setattr__(self, "order", check.positive_finite("order", self.order))

    @property
    def needs_plan(self) -> bool:  # type: ignore[override]
        return self.order is None

    def weights(self, orders, epsilon, delta, plan):
        n = orders.size
        rest = (1.0 - self.share) / n
        w = np.full(n, rest)
        w[self._index(orders, epsilon, delta, plan)] += self.share
        return w

    def _index(self, orders, epsilon, delta, plan) -> int:
        if self.order is not None:
            hits = np.flatnonzero(orders == self.order)
            if hits.size == 0:
                raise InvalidArgumentError("order", self.order, "is not on the ledger's grid")
            return int(hits[0])
        if plan is None:  # pragma: no cover - the ledger always passes one
            raise InvalidArgumentError("plan", plan, "is needed to choose the order")
        w_top = self.share + (1.0 - self.share) / orders.size
        budget = conv.rdp_budget_per_order(orders, epsilon, w_top * delta)
        # over: a plan curve near 0 (PureDP(1e-300)) overflows budget/plan to inf, which is
        # the ratio meant, as for plan = 0; it warned (an exception under -W error; review bx)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = np.where(plan > 0, budget / plan, np.where(budget >= 0, np.inf, -np.inf))
        ratio = np.where(np.isnan(ratio), -np.inf, ratio)
        # exact ties: the smallest order (np.argmax takes the first maximum, and the grid is
        # strictly increasing: check.orders), as the class docstring states (task lo7)
        return int(np.argmax(ratio))


@dataclasses.dataclass(frozen=True)
class Explicit(DeltaShares):
    """Weights given per order, as a mapping ``{order: weight}``; Σ ≤ 1.

    Orders not mentioned get weight 0 (they can never admit a charge). A sum up to
    1 + 1e-12 (decimals typed by hand) is accepted; the filter converts at δ_α scaled
    so that Σ δ_α ≤ δ exactly (:func:`privguard._accounting._filters.delta_parts`).

    Example:
        >>> import numpy as np
        >>> Explicit({2.0: 0.25, 4.0: 0.75}).weights(np.array([2.0, 4.0]), 1.0, 1e-5, None).tolist()
        [0.25, 0.75]
    """

    shares: Mapping[float, float]

    def __post_init__(self) -> None:
        if not isinstance(self.shares, Mapping) or not self.shares:
            raise InvalidArgumentError("shares", self.shares, "must be a non-empty {order: weight} mapping")
        clean = {}
        for a, w in self.shares.items():
            a = check.positive_finite("shares order", a)
            w = check.non_negative_finite(f"shares[{a}]", w)
            clean[a] = w
        total = sum(clean.values())
        if not (0 < total <= 1 + 1e-12):
            raise InvalidArgumentError("shares", self.shares,
                                       f"weights must sum to a value in (0, 1] (sum={total})")
        object.__setattr__(self, "shares", tuple(sorted(clean.items())))

    def weights(self, orders, epsilon, delta, plan):
        w = np.zeros(orders.size)
        for a, x in self.shares:
            hits = np.flatnonzero(orders == a)
            if hits.size == 0:
                raise InvalidArgumentError("shares", a, "order is not on the ledger's grid")
            w[hits[0]] = x
        return w

    def to_dict(self) -> dict[str, Any]:
        return {"type": "Explicit",
                "params": {"shares": [list(p) for p in self.shares]}}  # type: ignore[call-overload]


def shares_from_dict(data: Any) -> DeltaShares:
    """Inverse of ``DeltaShares.to_dict``."""
    kinds = {"Uniform": Uniform, "Concentrated": Concentrated, "Explicit": Explicit}
    if not isinstance(data, dict) or data.get("type") not in kinds:
        raise InvalidArgumentError("shares", data, f"must name one of {sorted(kinds)}")
    if set(data) != {"type", "params"}:  # what to_dict writes; anything else is an edit
        raise InvalidArgumentError("shares", data, "must have exactly the keys type, params")
    params = dict(data.get("params") or {})
    if data["type"] == "Explicit":
        params["shares"] = {float(a): float(w) for a, w in params["shares"]}
    return kinds[data["type"]](**params)


def single_order(order: float) -> Concentrated:
    """All of δ on one order fixed in advance: the filter of seed 001 Theorem 1."""
    return Concentrated(share=1.0, order=order)
