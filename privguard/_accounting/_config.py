"""A ledger's configuration: what is fixed when the ledger is created.

The grid of orders, δ, the budget (an (ε, δ) filter of some kind, or a
strict per-order RDP budget), the odometer's mode and the declared plan.
It is validated once, compared for equality when a file is reopened,
serialised into the journal's genesis, and covered by its digests.
Choices derived from the plan later (δ shares, mixture weights, the hybrid
filter's envelope) are not configuration: the journal records them as a
``fix`` entry before the first charge.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._accounting._odometer import MIXTURE, NEW_MODES
from privguard._accounting._odometer import MODES as ODOMETER_MODES
from privguard._accounting._plan import Plan, as_plan
from privguard._accounting._results import exact
from privguard._accounting._shares import Concentrated, DeltaShares, shares_from_dict
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._errors import InvalidArgumentError, LedgerStateError
from privguard._mechanisms._base import Mechanism, mechanism_from_dict

FILTERS = ("rdp", "hybrid")
#: The odometer of new ledgers (docs/theory.md §3).
DEFAULT_ODOMETER = MIXTURE
#: Modes a new ledger may choose; "tight" is retired (files written with it still open).
NEW_ODOMETER_MODES = NEW_MODES


@dataclasses.dataclass(frozen=True, eq=False)
class Config:
    """A validated ledger configuration (internal; build with :func:`build`)."""

    orders: np.ndarray
    delta: float | None
    epsilon: float | None
    filter: str | None  # "rdp", "hybrid", "strict" or None
    shares: DeltaShares | None
    rdp_budget: np.ndarray | None
    odometer: str
    plan: Plan | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 2,
            "orders": self.orders.tolist(),
            "delta": self.delta,
            "epsilon": self.epsilon,
            "filter": self.filter,
            "shares": None if self.shares is None else self.shares.to_dict(),
            "rdp_budget": None if self.rdp_budget is None else self.rdp_budget.tolist(),
            "odometer": self.odometer,
            "plan": None if self.plan is None else self.plan.to_dict(),
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def differences(self, other: Config) -> list[str]:
        mine, theirs = self.to_dict(), other.to_dict()
        return sorted(k for k in mine if mine[k] != theirs.get(k))

    def mismatch(self, other: Config, mine: str = "stored", theirs: str = "requested") -> str:
        """Only the fields that differ, each with both values, abbreviated (one line).

        Example:
            >>> build(3.0, 1e-5).mismatch(build(4.0, 1e-5))
            'epsilon: stored 3, requested 4'
        """
        a, b = self.to_dict(), other.to_dict()
        return "; ".join(f"{k}: {mine} {_brief(a[k])}, {theirs} {_brief(b.get(k))}"
                         for k in self.differences(other))

    def describe(self) -> str:
        if self.filter == "strict":
            return "strict per-order RDP filter"
        if self.filter is not None:
            kind = "hybrid (PLD envelope + RDP) " if self.filter == "hybrid" else ""
            # the target as stated, never rounded (review lo2: ε = 1.2345649 read 1.23456)
            return f"(ε={exact(self.epsilon)}, δ={exact(self.delta)}) {kind}filter"
        return "no budget (report only)"


#: The fields a logged retarget may change; the others (grid, odometer) never change.
RETARGETABLE = frozenset({"epsilon", "delta", "filter", "shares", "plan"})


def retarget_remedy(differs: list[str], opener: str, owner: bool = False) -> str:
    """What to do about a stored configuration that differs from the requested one."""
    keep = f"Open it with {opener} to use the stored configuration"
    if set(differs) - RETARGETABLE:
        return keep + "; the grid and odometer of a ledger can never change."
    return (keep + f", or change it with {'an owner' + chr(39) + 's ' if owner else 'an '}"
            "explicit, logged Ledger(..., path=..., retarget='reason').")


def _brief(value: Any) -> str:
    """A configuration value in a few characters: a grid or budget as its size and ends."""
    from privguard._accounting._results import describe

    if isinstance(value, list) and len(value) > 4 and all(isinstance(v, float) for v in value):
        return f"{len(value)} values {value[0]:g}…{value[-1]:g}"
    if isinstance(value, dict) and set(value) == {"step", "steps", "every"}:
        return (f"Plan({describe(value['step'])}, steps={value['steps']}, "
                f"every={value['every']})")
    text = describe(value) if value is not None else "None"
    return text if len(text) <= 80 else text[:77] + "..."


def _check_hybrid_epsilon(epsilon: float) -> None:
    """Refuse a new hybrid target ε beyond ``MAX_EPSILON`` (docs/theory.md §2b, "The range
    of ε"), at once: its PLD search would take minutes."""
    from privguard._accounting._hybrid import MAX_EPSILON

    if epsilon > MAX_EPSILON:
        raise InvalidArgumentError(
            "epsilon", epsilon, f"must be <= {MAX_EPSILON:g} with filter='hybrid' (docs/"
            "theory.md §2b, 'The range of ε': beyond it e^ε protects nothing and part A's "
            "PLD search takes minutes); use filter='rdp' for such a target (a ledger file "
            "written with one before the bound opens with Ledger.open(path))")


def _check_hybrid_plan(step: Any) -> None:
    """Refuse ``filter="hybrid"`` for a plan step privguard has no certified PLD envelope for.

    Accumulated steps have one up to ``MAX_ENVELOPE_MICRO_BATCHES`` micro-batches
    and only when declared ``aligned=True`` (docs/theory.md §2b.1, C3′); random
    allocation has one for σ ≥ 0.5 and 2 ≤ t ≤ 10⁴ (§2b.3: a certified stochastically
    larger epoch loss), none outside that range.
    """
    from privguard._accounting._hybrid import MAX_ENVELOPE_MICRO_BATCHES

    k = getattr(step, "micro_batches", 1)
    if isinstance(k, int) and k > MAX_ENVELOPE_MICRO_BATCHES:
        raise InvalidArgumentError(
            "filter", "hybrid", f"has a PLD envelope for accumulated steps of at most "
            f"{MAX_ENVELOPE_MICRO_BATCHES} micro-batches (docs/theory.md §2b.1), not for the "
            f"plan's step {step!r}; use filter='rdp' (its RDP curve is a proven bound)")
    if isinstance(k, int) and k >= 2 and getattr(step, "aligned", True) is False:
        raise InvalidArgumentError(
            "filter", "hybrid", f"has a PLD envelope for accumulated steps only when each "
            f"example's clipped gradient is the same vector in every micro-batch "
            f"(aligned=True, docs/theory.md §2b.1 C3′); the plan's step {step!r} may have "
            f"per-draw randomness (dropout, augmentation), for which no PLD envelope is "
            f"proved (§14, Lemma 14.5); use filter='rdp' (its curve for that case is a proven "
            f"bound), or declare aligned=True if the forward pass and data have no per-draw "
            f"randomness (Plan.from_opacus(..., aligned_micro_batches=True), and attach or "
            f"the callbacks with aligned_micro_batches=True)")
    if type(step).__name__ == "RandomAllocation":
        from privguard._accounting import _allocation_envelope as alloc
        from privguard._accounting._hybrid import allocation_covered

        if not allocation_covered(step):
            raise InvalidArgumentError(
                "filter", "hybrid", f"has a certified PLD envelope for random allocation only "
                f"for noise_multiplier >= {alloc.MIN_SIGMA:g} and <= {alloc.MAX_SIGMA:g} (a plan "
                f"of {alloc.MAX_SIGMA:g} holds every larger one) and 2 <= steps <= "
                f"{alloc.MAX_STEPS} (docs/theory.md §2b.3), not for the plan's step {step!r}; "
                "use filter='rdp' (the default: RandomAllocation's RDP curve is a proven "
                "bound, §15)")


def build(epsilon: Any = None, delta: Any = None, *, orders: Any = None,
          shares: Any = None, plan: Any = None, rdp_budget: Any = None,
          odometer: Any = None, filter: Any = None) -> Config:
    """Validate the arguments of ``Ledger(...)`` into a :class:`Config`."""
    grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
    mode = DEFAULT_ODOMETER if odometer is None else odometer
    if not isinstance(mode, str) or mode not in NEW_ODOMETER_MODES:  # an array's `in` raised
        hint = ("is retired: the mixture odometer reports less and is never above it; files "
                "and states written with it still open" if isinstance(mode, str) and mode == "tight"
                else "")
        raise InvalidArgumentError("odometer", odometer, hint or f"must be one of "
                                   f"{NEW_ODOMETER_MODES}")
    d = None if delta is None else check.delta("delta", delta)
    the_plan = as_plan(plan)
    if shares is not None and not isinstance(shares, DeltaShares):
        raise InvalidArgumentError("shares", shares,
                                   "must be Uniform(), Concentrated(...) or Explicit(...)")
    if filter is not None and (not isinstance(filter, str) or filter not in FILTERS):
        raise InvalidArgumentError("filter", filter, f"must be one of {FILTERS}")
    if filter == "hybrid" and the_plan is not None:
        _check_hybrid_plan(the_plan.step)
    if epsilon is not None and rdp_budget is not None:
        raise InvalidArgumentError("rdp_budget", rdp_budget,
                                   "give either (epsilon, delta) or rdp_budget, not both")
    if epsilon is not None:
        eps = check.positive_finite("epsilon", epsilon)
        if filter == "hybrid":
            _check_hybrid_epsilon(eps)
        if d is None:
            raise InvalidArgumentError("delta", delta, "an (ε, δ) budget needs delta in (0, 1)")
        if shares is not None and not shares.needs_plan:
            shares.weights(grid, eps, d, None)  # shares fixed in advance: checked now
        return Config(grid, d, eps, filter or "rdp", shares or Concentrated(), None, mode,
                      the_plan)
    if filter is not None:
        raise InvalidArgumentError("filter", filter, "needs an (epsilon, delta) budget")
    if shares is not None:
        raise InvalidArgumentError("shares", shares, "only applies to an (epsilon, delta) budget")
    budget = None
    if rdp_budget is not None:
        if isinstance(rdp_budget, Mechanism):
            budget = rdp_budget._rdp_checked(grid)
        else:
            budget = check.rdp_values("rdp_budget", rdp_budget, grid.size)
    return Config(grid, d, None, None if budget is None else "strict", None, budget, mode,
                  the_plan)


def from_dict(data: Any) -> Config:
    """Inverse of :meth:`Config.to_dict`; also reads privguard 0.1's format.

    Raises:
        LedgerStateError: the configuration is malformed or invalid.
    """
    try:
        if not isinstance(data, dict):
            raise LedgerStateError(f"configuration must be a dict, got {data!r}")
        if data.get("version") == 2:
            return _from_v2(data)
        if "version" not in data and set(data) == {"orders", "delta", "odometer", "filter", "plan"}:
            return _from_v1(data)
        raise LedgerStateError(f"unknown configuration format: {sorted(data)}")
    except (InvalidArgumentError, KeyError, TypeError, ValueError) as exc:
        raise LedgerStateError(f"stored configuration is invalid: {exc}") from exc


def _common(data: dict[str, Any]) -> tuple[np.ndarray, float | None, str]:
    grid = check.orders("orders", data["orders"])
    delta = None if data["delta"] is None else check.delta("delta", data["delta"])
    if data["odometer"] not in ODOMETER_MODES:
        raise LedgerStateError(f"unknown odometer mode {data['odometer']!r}")
    return grid, delta, data["odometer"]


_V2_KEYS = frozenset({"version", "orders", "delta", "epsilon", "filter", "shares", "rdp_budget",
                      "odometer", "plan"})  # Config.to_dict's, unchanged since it was written


def _from_v2(data: dict[str, Any]) -> Config:
    if set(data) != _V2_KEYS:  # an unknown key is an edit (review bx), a missing one too
        raise LedgerStateError(f"configuration keys {sorted(map(str, data))} are not "
                               f"{sorted(_V2_KEYS)}")
    grid, delta, mode = _common(data)
    kind = data["filter"]
    if kind not in (*FILTERS, "strict", None):
        raise LedgerStateError(f"unknown filter kind {kind!r}")
    eps = None if data["epsilon"] is None else check.positive_finite("epsilon", data["epsilon"])
    shares = None if data["shares"] is None else shares_from_dict(data["shares"])
    budget = (None if data["rdp_budget"] is None
              else check.rdp_values("rdp_budget", data["rdp_budget"], grid.size))
    plan = None if data["plan"] is None else Plan.from_dict(data["plan"])
    if (kind in FILTERS) != (eps is not None and delta is not None and shares is not None) \
            or (kind == "strict") != (budget is not None):
        raise LedgerStateError(f"inconsistent budget configuration {data!r}")
    return Config(grid, delta, eps, kind, shares, budget, mode, plan)


#: privguard 0.1's filter configurations, by kind: DPFilter.config() and
#: StrictFilter.config(), unchanged from cab3dc9 to the last 0.1 commit (580131f).
_V1_FILTER_KEYS = {"dp": frozenset({"kind", "epsilon", "delta", "shares"}),
                   "strict": frozenset({"kind", "budget"})}
_V1_FILTER_KEYS_TEXT = "; ".join(f"{k}: {sorted(v)}" for k, v in _V1_FILTER_KEYS.items())


def _from_v1(data: dict[str, Any]) -> Config:
    """privguard 0.1: ``filter`` was a dict or None, ``plan`` a bare mechanism."""
    grid, delta, mode = _common(data)
    plan = None if data["plan"] is None else Plan(mechanism_from_dict(data["plan"]))
    budget = data["filter"]
    if budget is None:
        return Config(grid, delta, None, None, None, None, mode, plan)
    kind = budget.get("kind") if isinstance(budget, dict) else None
    if not isinstance(kind, str) or set(budget) != _V1_FILTER_KEYS.get(kind):
        # an extra or missing key is an edit (review bi), as in the version-2 format
        raise LedgerStateError(f"privguard 0.1's filter configuration is None or a dict with "
                               f"the keys of one of {_V1_FILTER_KEYS_TEXT}, got "
                               f"{check.short(budget)}")
    if budget.get("kind") == "dp" and budget.get("delta") == delta:
        return Config(grid, delta, check.positive_finite("epsilon", budget["epsilon"]), "rdp",
                      shares_from_dict(budget["shares"]), None, mode, plan)
    if budget.get("kind") == "strict":
        return Config(grid, delta, None, "strict", None,
                      check.rdp_values("rdp_budget", budget["budget"], grid.size), mode, plan)
    raise LedgerStateError(f"unknown budget configuration {budget!r}")
