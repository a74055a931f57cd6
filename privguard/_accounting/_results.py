"""Values a ledger hands out: what is left, and what listeners receive."""

from __future__ import annotations

import dataclasses
import decimal
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from privguard._accounting._journal import ChargeRecord
from privguard._mechanisms._base import Mechanism

if TYPE_CHECKING:
    from privguard._accounting._budget import Budget
    from privguard._ledger._ledger import Ledger


def upper(x: float, spec: str) -> str:
    """``format(x, spec)`` rounded up instead of to nearest (``spec`` is ``".Ng"`` or
    ``".Nf"``): a bound printed with fewer digits must still be a bound (review aa: a
    statement "privacy loss ≤ 2.502" was printed for an ε of 2.50241).

    Example:
        >>> upper(2.50241, ".4g"), upper(2.50289, ".4g"), upper(0.20049, ".3f"), upper(3.0, ".4g")
        ('2.503', '2.503', '0.201', '3')
    """
    return _directed(x, spec, decimal.ROUND_CEILING)


def exact(x: float | None) -> str:
    """``x`` short (``:g``) when that reads back as ``x``, else in full (``repr``): a target
    or δ in a statement is the stated one, never rounded either way (review cli: ε = 1.2345649
    was stated as "(ε = 1.23456, ...)-DP", a smaller ε than the filter's).

    Example:
        >>> exact(4.0), exact(1e-5), exact(1.2345649)
        ('4', '1e-05', '1.2345649')
    """
    if x is None:
        return "None"
    return f"{x:g}" if float(f"{x:g}") == x else repr(x)


def lower(x: float, spec: str) -> str:
    """``format(x, spec)`` rounded down: a quantity the reader must not overstate (what
    is left of a budget) printed with fewer digits (review cli: "59.95% left" was printed
    as "60% left").

    Example:
        >>> lower(59.95, ".3g"), lower(0.20049, ".3f"), lower(3.0, ".4g")
        ('59.9', '0.200', '3')
    """
    return _directed(x, spec, decimal.ROUND_FLOOR)


def whole_count(x: float) -> str:
    """A count of repeats that fit, in full (never rounded up: ":g" printed 1234567 as
    1.23457e+06, more than fit; review cli), "unlimited" for +inf, or "an unknown number
    of" for NaN (a count that could not be computed; review rfp: it read "unlimited").

    Example:
        >>> whole_count(1234567.0), whole_count(math.inf), whole_count(math.nan)
        ('1234567', 'unlimited', 'an unknown number of')
    """
    if math.isnan(x):
        return "an unknown number of"
    if x == math.inf:
        return "unlimited"
    return f"{math.floor(x):d}" if math.isfinite(x) else "no"


def _directed(x: float, spec: str, rounding: str) -> str:
    """``format(x, spec)`` rounded towards +∞ (``ROUND_CEILING``) or −∞ (``ROUND_FLOOR``)."""
    text = format(x, spec)
    if not math.isfinite(x):
        return text
    shown, exact = decimal.Decimal(text), decimal.Decimal(x)  # the float's exact value
    if shown == exact or (shown > exact) == (rounding == decimal.ROUND_CEILING):
        return text
    places = int(spec[1:-1])
    step = (-places if spec.endswith("f")
            else exact.adjusted() - (places - 1))
    return format(exact.quantize(decimal.Decimal(1).scaleb(step), rounding=rounding), spec)


@dataclasses.dataclass(frozen=True)
class Remaining:
    """What is left of a ledger's budget, in forms a user can act on.

    Attributes:
        epsilon_target: the filter's ε (None without an (ε, δ) filter).
        delta: the ledger's δ (None if it has none).
        epsilon_spent: the running ε (the odometer's bound at ``delta``);
            None without δ.
        headroom: per-order RDP budget left of the RDP filter (negative where
            an order is exhausted); None without a filter.
        repeats: how many more times the queried mechanism would be admitted
            (``math.inf`` if the ledger has no filter); None if no mechanism
            was given.
        budget: the budget meter (:meth:`privguard.Ledger.budget`), or None
            without an (ε, δ) filter.
    """

    epsilon_target: float | None
    delta: float | None
    epsilon_spent: float | None
    headroom: np.ndarray | None
    repeats: float | None
    budget: Budget | None = None

    def __repr__(self) -> str:
        h = self.headroom
        head = "None" if h is None else f"<{h.size} orders, max {float(np.max(h)):.4g}>"
        return (f"Remaining(budget={self.budget!s}, epsilon_spent={self.epsilon_spent!r}, "
                f"delta={self.delta!r}, headroom={head}, repeats={self.repeats!r})")

    def __str__(self) -> str:
        parts = []
        if self.budget is not None:
            parts.append(str(self.budget))
        if self.epsilon_spent is not None:
            note = ("; another statement, not capped by the target"
                    if self.epsilon_target is not None else "")
            parts.append(f"any-time ε = {upper(self.epsilon_spent, '.4g')} at δ = "
                         f"{exact(self.delta)}{note}")
        if self.epsilon_target is not None and self.budget is None:
            parts.append(f"target ε = {exact(self.epsilon_target)}")
        if self.repeats is not None:
            parts.append(f"{whole_count(self.repeats)} more of the queried mechanism fit")
        return "; ".join(parts) or "no budget configured"


@dataclasses.dataclass(frozen=True)
class Guarantee:
    """The privacy statement a ledger supports, in the form its theorem gives.

    Attributes:
        kind: ``"filter"`` — the whole interaction is (epsilon, delta)-DP, a
            hockey-stick bound fixed before any output (docs/theory.md §2);
            or ``"odometer"`` — P(privacy loss > epsilon) ≤ delta, a tail
            bound valid at any stopping time (docs/theory.md §3).
        epsilon, delta: the numbers, each holding at exactly this δ.
        statement: the sentence to put in a report.
    """

    kind: str
    epsilon: float
    delta: float
    statement: str

    def __str__(self) -> str:
        return self.statement


@dataclasses.dataclass(frozen=True)
class LedgerEvent:
    """What listeners receive: ``kind`` is ``"charge"``, ``"refused"`` or ``"deviation"``.

    ``"deviation"`` follows the ``"charge"`` event of the charge that closed a hybrid
    filter's part A (once per ledger; :class:`privguard.PlanDeviationWarning`).
    """

    kind: str
    ledger: Ledger
    mechanism: Mechanism
    label: str | None
    record: ChargeRecord | None

    def __repr__(self) -> str:
        return f"LedgerEvent({self.kind!r}, {self.mechanism!r}, label={self.label!r})"


def guarantee_of(acc: Any) -> Guarantee:
    """The statement a ledger supports, chosen by its configuration (docs/theory.md §4).

    After a retarget (a target changed after the ledger was created) it is the odometer's
    tail bound at the δ the ledger was created with, fixed before the first output: a δ
    chosen after seeing outputs is not covered (Ville's inequality needs the threshold
    fixed in advance, §3.4), and a statement at δ₀ also holds at every δ ≥ δ₀.
    """
    from privguard._errors import InvalidArgumentError

    cfg = acc.config
    if acc.retargeted:
        return _retargeted_guarantee(acc)
    if cfg.delta is None:
        raise InvalidArgumentError("delta", None, "this ledger has no δ to state a guarantee at")
    if cfg.epsilon is not None:
        return Guarantee("filter", cfg.epsilon, cfg.delta,
                         f"(ε = {exact(cfg.epsilon)}, δ = {exact(cfg.delta)})-DP for the whole "
                         "interaction (a privacy filter checked every charge before it ran)")
    eps = acc.epsilon(cfg.delta)
    return Guarantee("odometer", eps, cfg.delta,
                     f"privacy loss ≤ {upper(eps, '.4g')} with probability ≥ 1 − {exact(cfg.delta)}, valid "
                     "at the adaptively chosen stopping time (privacy odometer)" + witnessed_note(acc))


WITNESSED = ("; a witnessed run (this ledger holds the witnesses' δ reserve): the tail bound "
             "is proven for the run without the witnesses' refusals, and for the witnessed run "
             "only as (ε, δ)-DP for an ε fixed before the first output, at most the target ε "
             "the witnesses were sized for, where the run stops before the running ε passes "
             "it (docs/theory.md §16.5)")
"""What a statement of the odometer adds for a witnessed run (task radv9, docs/theory.md §16.5;
Proposition 16.6's conditions: ε fixed before the first output, ε ≤ the target ε the
witnesses' δ was sized for, task wst). Its δ is the statement's: ``reserve_for`` sizes the
witnesses at the smallest δ a statement of the ledger is made at."""


def witnessed_note(acc: Any) -> str:
    """:data:`WITNESSED` when the ledger holds a :class:`~privguard.mechanisms.DeltaReserve`
    charge (a run with ``attach(..., witnesses=True)``), else ``""``. The odometer's tail
    bound holds for that run without its witnesses' refusals (at (1 − r)·δ, the reserve being
    in its spent curve); the refusals condition the released steps, and what is proven for
    the witnessed run is Proposition 16.1's (ε, δ)-DP at an ε fixed in advance (§16.5). A
    journal whose runs before its checkpoint cannot be read gets the note too (fail closed).
    The note names that ε's bound first, as a number (:func:`_sized_for`, task wr)."""
    from privguard._errors import LedgerStateError
    from privguard._mechanisms._reserve import DeltaReserve

    try:
        runs = acc.journal.runs()
    except LedgerStateError:
        return _sized_for(acc) + WITNESSED
    if not any(isinstance(run.mechanism, DeltaReserve) for run in runs):
        return ""
    return _sized_for(acc) + WITNESSED


def _smallest_target_epsilon(acc: Any) -> float | None:
    """The smallest target ε a ledger has had: its own, the ones it was created with and
    retargeted to (a 0.1 file's retargets listed in its migrate event too); None if none.

    The witnesses' false alarms are sized at the target in force at ``attach`` (``reserve_for``,
    docs/theory.md §16.2), one of these, and a retarget does not resize them: Proposition
    16.6's ε ≤ ε_T holds for every witnessed run of the ledger below this one (task wr)."""
    chain: list[dict[str, Any]] = []
    for event in acc.events:
        for retarget in ([event] if event.get("event") == "retarget"
                         else list(event.get("retargets") or ())):
            chain += [retarget["old"], retarget["new"]]
    targets = [c.get("epsilon") for c in chain] + [acc.config.epsilon]
    return min((e for e in targets if e is not None), default=None)


def _sized_for(acc: Any) -> str:
    """Proposition 16.6's bound on ε as a number (task wr): after a retarget to a larger ε
    the sentence's "target ε the witnesses were sized for" read as the new target, which the
    witnesses' δ does not cover ((1+e^ε)·a > r·δ above the ε they were sized at)."""
    epsilon = _smallest_target_epsilon(acc)
    if epsilon is None:  # never: witnesses need an (ε, δ) target (reserve_for)
        return ""
    return (f"; for the witnessed run take ε ≤ {exact(epsilon)}, the smallest target ε this "
            "ledger has had (the witnesses were sized at the target in force at attach, and "
            "a retarget does not resize them)")


def created_delta(acc: Any) -> float | None:
    """The δ of the configuration a ledger was created with: the "old" one of its first
    retarget (a 0.1 file's retargets are listed in its migrate event), else its own."""
    for event in acc.events:
        first = event if event.get("event") == "retarget" else next(
            iter(event.get("retargets") or ()), None)
        if isinstance(first, dict):
            return first["old"].get("delta")
    return acc.config.delta


def stated_delta(acc: Any) -> float | None:
    """The δ at which a running ε is stated by default: the ledger's own, or after a
    retarget the δ it was created with, fixed before the first output (docs/theory.md §4,
    as :meth:`Ledger.guarantee`): an odometer read at a δ chosen after outputs is not valid
    under adaptivity (adv24). None when no δ was fixed before the first output."""
    return created_delta(acc) if acc.retargeted else acc.config.delta


def _retargeted_guarantee(acc: Any) -> Guarantee:
    from privguard._errors import InvalidArgumentError

    now, delta = acc.config.delta, created_delta(acc)
    if delta is None:
        raise InvalidArgumentError(
            "delta", now, "was set by a retarget of a ledger created without δ; no δ was "
                          "fixed before the first output, and one chosen after it is not "
                          "covered (docs/theory.md §4), so there is no guarantee to state")
    eps = acc.epsilon(delta)
    statement = (f"privacy loss ≤ {upper(eps, '.4g')} with probability ≥ 1 − {exact(delta)}, valid at the "
                 "adaptively chosen stopping time (privacy odometer), at the δ fixed before "
                 "the first output (the target was changed afterwards")
    if now is not None and now > delta:
        statement += f"; the statement also holds at the retargeted δ = {exact(now)})"
    elif now is not None and now < delta:
        statement += (f"; the retargeted δ = {exact(now)} is smaller, was chosen after outputs and "
                      "is not covered)")
    else:
        statement += ")"
    return Guarantee("odometer", eps, delta, statement + witnessed_note(acc))


def describe(value: Any) -> str:
    """A one-line description of a serialised mechanism (curves abbreviated)."""
    if isinstance(value, dict) and set(value) == {"type", "params"}:
        if value["type"] == "RDPCurve":
            return f"RDPCurve({len(value['params']['orders'])} orders)"
        inner = ", ".join(f"{k}={describe(v)}" for k, v in value["params"].items())
        return f"{value['type']}({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(describe(v) for v in value[:4]) + (", ...]" if len(value) > 4
                                                                  else "]")
    # a parameter as stored, never rounded either way (review lo2: q = 0.1234564 read 0.123456)
    return exact(value) if isinstance(value, float) else str(value)
