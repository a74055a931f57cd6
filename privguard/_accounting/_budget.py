"""The budget meter: how much of its (ε, δ) target a ledger's filter has consumed.

One number in ε units, computed from the same quantities the filter decides
with (docs/theory.md §12), so that a charge is admitted exactly when the meter
after it stays ≤ the target, and the meter never decreases (between
retargets). It measures budget consumption; it is not a privacy statement
(the statement to report is :meth:`privguard.Ledger.guarantee`).

* RDP filter (docs/theory.md §2): with the weights w_α fixed at the first
  charge, meter = max(0, min_α [(spent(α) − a_α) + b_α + slack_α]), where
  a_α = (log(w_α·δ) + log α)/(α−1) and b_α = log((α−1)/α) are the improved
  conversion's terms (Canonne, Kamath & Steinke 2020, Prop. 12; formulas.md
  §1) and slack_α the bound on their rounding (task ul; ``conv.improved_upper``:
  the meter is never below the exact conversion), evaluated with the very arrays
  ``DPFilter.admits`` compares with ε.
* Hybrid filter (docs/theory.md §2b): min(meter_A, meter_B). meter_B is the
  above for part B at δ_B. meter_A, while A is alive, is the PLD ε at δ_A of
  the smallest count of a fixed grid at or above A's count (dp-accounting's
  pessimistic PLD, Doroshenko et al. 2022; the grid makes it cheap and never
  below the PLD ε of the count), capped at the target for counts A still
  admits; ∞ once A is closed, or for a count beyond T_A.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import Any

import numpy as np

from privguard._accounting._filters import DPFilter
from privguard._accounting._results import exact, lower, upper
from privguard._curves import _conversion as conv
from privguard._floats import float_below

#: The grid of part A's counts at which the PLD ε is evaluated: T_A, then repeatedly
#: min(⌈g / RATIO⌉, g − 1).
#: Consecutive grid counts differ by ≤ 2%, i.e. about 1% in ε (ε grows roughly
#: like √count); the meter reads the grid count at or above A's count.
GRID_RATIO = 1.02

PART_RDP = "RDP filter"
PART_A = "hybrid: PLD on plan"
PART_B = "hybrid: RDP fallback"


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much of its (ε, δ) target a ledger's filter has consumed.

    A measure of budget consumption in ε units, not a privacy statement: the
    statement to report is the filter's (``target``-(ε, δ)-DP, see
    :meth:`privguard.Ledger.guarantee`). A charge is admitted exactly when the
    meter after it stays ≤ ``epsilon``, and the meter never decreases (docs/
    theory.md §12). The running ("any-time") ε of :meth:`privguard.Ledger.epsilon`
    is another quantity and may exceed the target while this guarantee holds.

    Attributes:
        epsilon: the filter's target ε.
        delta: the filter's δ.
        spent: the meter, in ε units: 0.0 before any charge, at most ``epsilon``
            (above it only after a retarget to a smaller target, or in a journal
            written before task ul whose charges were admitted within the rounding
            slack of the target (docs/theory.md §2); every charge is then refused).
        part: which part decides: ``"RDP filter"``, ``"hybrid: PLD on plan"``
            (part A) or ``"hybrid: RDP fallback"`` (part B).

    Example:
        >>> from privguard import Ledger, mechanisms as M
        >>> ledger = Ledger(epsilon=3.0, delta=1e-5)
        >>> _ = ledger.charge(M.SubsampledGaussian(1.0, 0.01, steps=1000))
        >>> b = ledger.budget()
        >>> 0 < b.spent <= b.epsilon and 0 <= b.left < 1, b.part
        (True, 'RDP filter')
    """

    epsilon: float
    delta: float
    spent: float
    part: str

    @property
    def left(self) -> float:
        """The fraction of the target not yet consumed, 1 − spent/ε, in [0, 1], rounded
        down: never above the exact fraction of the float spent and ε (1 − spent/ε in
        floats rounds to nearest, up to an ulp above it; review rlo3)."""
        if not math.isfinite(self.spent):
            return 0.0
        left = float_below(1 - Fraction(self.spent) / Fraction(self.epsilon))
        return min(1.0, max(0.0, left))

    def __str__(self) -> str:
        # spent rounded up, what is left rounded down: neither overstates the budget left
        return (f"budget {upper(self.spent, '.4g')} of ε = {exact(self.epsilon)} spent "
                f"({self.part}) — {lower(100 * self.left, '.3g')}% left")


# ------------------------------------------------------------------ RDP filter
def rdp_meter(flt: DPFilter, spent: np.ndarray) -> float:
    """max(0, min_α improved_upper(spent, terms)(α)) with the terms ``flt.admits``
    compares.

    ``flt.admits(spent, w)`` is ``any(improved_upper(spent, terms) ≤ ε)``, so (ε > 0)
    ``rdp_meter(flt, spent) ≤ ε`` exactly when ``flt.admits(spent, w)``.
    """
    terms = flt.terms(flt.resolve_weights(None))  # the arrays DPFilter.admits compares with
    with np.errstate(invalid="ignore"):
        return meter_from_terms(terms, spent)


def meter_from_terms(terms: tuple[np.ndarray, np.ndarray, np.ndarray], spent: np.ndarray
                     ) -> float:
    """:func:`rdp_meter` from the filter's terms ``flt.terms(weights)``, for a
    caller that evaluates the meter at many spent curves (a lease's sizing,
    :func:`privguard._accounting._lease.meter_room`) under one
    ``np.errstate(invalid="ignore")``, which the caller holds. A NaN order is skipped
    (``fmin`` ignores it; all NaN: ∞); the rest is the minimum's exact selection."""
    eps = conv.improved_upper(spent, terms)  # DPFilter.admits' expression
    if eps.size == 0:
        return math.inf
    low = float(np.fmin.reduce(eps))
    return math.inf if low != low else max(0.0, low)


# ---------------------------------------------------------------- hybrid part A
@functools.lru_cache(maxsize=4096)
def _pld_epsilon(envelope: Any, delta_a: float, count: int) -> float:
    """PLD ε at δ_A of ``count`` envelope steps (dp-accounting, pessimistic, both directions)."""
    if count == 0:
        return 0.0
    from privguard._accounting._hybrid import TAIL_MASS, _one_step_pld

    composed = _one_step_pld(envelope).self_compose(count, tail_mass_truncation=TAIL_MASS)
    return max(0.0, float(composed.get_epsilon_for_delta(delta_a)))


def grid_count(count: int, steps_a: int) -> int:
    """The smallest count of part A's grid (T_A, then min(⌈g/GRID_RATIO⌉, g − 1)) ≥ ``count``.

    Example:
        >>> grid_count(0, 100), grid_count(100, 100), grid_count(99, 100), grid_count(97, 100)
        (0, 100, 99, 97)
        >>> grid_count(2900, 3000), grid_count(2943, 3000)
        (2942, 3000)
    """
    if count <= 0:
        return 0
    g = steps_a
    while True:
        nxt = min(math.ceil(g / GRID_RATIO), g - 1)  # every count below ~1/(RATIO − 1)
        if nxt < count:
            return g
        g = nxt


def part_a_meter(flt: Any, count: int, alive: bool) -> float:
    """meter_A: the PLD ε at δ_A of part A's count (on the grid, capped at ε); ∞ when closed.

    ∞ also for a count beyond T_A (A refuses it). For 0 ≤ count ≤ T_A the
    value is ≤ ε: the grid count g satisfies count ≤ g ≤ T_A, and T_A envelope
    steps are certified (ε, δ_A(1 − MARGIN))-DP (docs/theory.md §2b), so the
    PLD ε at δ_A of g ≤ T_A steps is ≤ ε; the cap only absorbs the last bits
    of the FFT's rounding.
    """
    if not alive or count > flt.steps_a:
        return math.inf
    g = grid_count(count, flt.steps_a)
    return min(flt.epsilon, _pld_epsilon(flt.envelope, flt.delta_a, g))


# ----------------------------------------------------------------------- meters
def meter(flt: Any, spent: np.ndarray) -> tuple[float, str]:
    """The meter of filter ``flt`` (RDP or hybrid, weights fixed) at the spent curve."""
    if flt.kind == "hybrid":
        return _hybrid(flt, spent, flt.a_count, flt.a_alive)
    return rdp_meter(flt, spent), PART_RDP


def meter_after(flt: Any, spent_after: np.ndarray, mechanism: Any, times: int
                ) -> tuple[float, str]:
    """The meter a charge would leave, admitted or not (the decision's own quantities).

    For the hybrid filter: part A's count after an A-admissible charge
    (alive, inside, c + k ≤ T_A), else A closed (∞); part B at ``spent_after``.
    ``flt.decide(spent_after, mechanism, times)`` admits exactly when this is ≤ ε
    (docs/theory.md §12, Proposition 1).
    """
    if flt.kind != "hybrid":
        return meter(flt, spent_after)
    from privguard._accounting._hybrid import envelope_steps_in

    k = envelope_steps_in(mechanism, flt.envelope)
    count = flt.a_count + k * times if k is not None else flt.steps_a + 1
    return _hybrid(flt, spent_after, count, flt.a_alive)


def _hybrid(flt: Any, spent: np.ndarray, count: int, alive: bool) -> tuple[float, str]:
    m_b = rdp_meter(flt.fallback, spent)
    m_a = part_a_meter(flt, count, alive)
    return (m_a, PART_A) if m_a <= m_b else (m_b, PART_B)


def budget_of(acc: Any) -> Budget | None:
    """The :class:`Budget` of an accounting, or None without an (ε, δ) filter."""
    return budget_from(budget_inputs(acc))


def budget_inputs(acc: Any) -> tuple[Any, ...] | None:
    """What the meter needs, read from the accounting (cheap: call it under the ledger's
    lock, then :func:`budget_from` outside it, since part A's PLD may take a while)."""
    cfg = acc.config
    if cfg.epsilon is None or cfg.delta is None or cfg.filter == "strict":
        return None
    flt = acc.filter
    if flt is None or acc.journal.charges == 0:  # nothing charged: nothing consumed
        return cfg.epsilon, cfg.delta, flt, None, 0, True
    hybrid = flt.kind == "hybrid"
    return (cfg.epsilon, cfg.delta, flt, np.array(acc.spent()),
            flt.a_count if hybrid else 0, flt.a_alive if hybrid else True)


def budget_from(inputs: tuple[Any, ...] | None) -> Budget | None:
    """The :class:`Budget` from :func:`budget_inputs` (None stays None)."""
    if inputs is None:
        return None
    epsilon, delta, flt, spent, count, alive = inputs
    if spent is None:
        part = PART_A if flt is not None and flt.kind == "hybrid" else PART_RDP
        return Budget(epsilon, delta, 0.0, part)
    if flt.kind == "hybrid":
        value, part = _hybrid(flt, spent, count, alive)
    else:
        value, part = rdp_meter(flt, spent), PART_RDP
    return Budget(epsilon, delta, value, part)
