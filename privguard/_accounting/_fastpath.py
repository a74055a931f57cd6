"""The O(1) repeated charge: how many more identical steps the filter admits, known once.

A DP-SGD run charges the same mechanism thousands of times in a row. The journal
keeps the spent curve of such a streak as ``base + n × curve`` (n: the streak's
count), and every filter's RDP test is a function of that curve alone. So the
filter's answer for the n-th charge of the streak is a function of n, with
everything else (``base``, ``curve``, the filter and its fixed weights) fixed
while the streak lasts, and it is monotone in n:

* n ↦ base + n × curve(α), each operation rounded up (:func:`scaled_sum`, the
  exact value rounded toward +inf: docs/theory.md §6, "Rounding up"), is
  non-decreasing for a curve ≥ 0 (a checked RDP curve is), and so are the float
  additions and subtractions that follow (IEEE 754 rounds monotonically);
* the RDP filter admits iff SOME order's improved conversion stays ≤ ε
  (``DPFilter.admits``), the strict filter iff EVERY order stays within its
  budget: a union and an intersection of sets {n ≤ n_α}, both down-sets.

Hence the largest n the test admits, :class:`Limit`, found once by a galloping
search with the filter's own test on the filter's own spent curve
``base + n × curve`` (the very floats :meth:`Journal.spent_after` computes),
tells the answer for every later charge of the streak with an integer
comparison: n ≤ limit ⇔ admitted, bit for bit the decision the grid arithmetic
would take. The fast path only ever answers "admitted"; a charge past the limit
(a refusal, or a limit that the search capped) takes the ordinary path. The
spent curve is then not computed at all: :meth:`Journal.spent` materialises it
lazily as ``base + n × curve``, the same operations on the same operands as the
ordinary path, hence the same floats.

The hybrid filter's part A is a counter (docs/theory.md §2b): it is decided in
O(1) by :meth:`HybridFilter.decide_with`, with part B's answer from the limit.

A limit holds the objects its answer depends on (the journal, its base array
and streak, the filter and its weights, the configuration), compared by
identity (:meth:`Limit.holds`; holding them, their ids cannot be reused): any change to them (another mechanism, an event, a retarget, a
loaded state or checkpoint, rows replayed from a store that start a new
streak) makes the key miss, and the limit is searched again.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from privguard._accounting._filters import DPFilter, StrictFilter
from privguard._accounting._journal import scaled_sum

# The galloping search stops at this many steps beyond the current one; a later charge
# past it searches again (the limit is then not known to be the boundary).
_SEARCH_SPAN = 2**40


class Limit(NamedTuple):
    """The largest streak count the RDP test admits, and the objects the answer depends on."""

    limit: int  # the test admits every streak count n ≤ limit (-1: none known)
    exact: bool  # True: every count beyond ``limit`` is refused (no need to search again)
    journal: Any
    base: Any  # the journal's spent curve before the streak
    streak: Any  # the streak's mechanism
    curve: Any  # and its curve
    filter: Any
    weights: Any  # the filter's fixed δ-share weights (part B's for the hybrid)
    config: Any

    def holds(self, journal: Any, flt: Any, config: Any) -> bool:
        """Whether this limit was found for this very journal streak, filter and target."""
        return (self.journal is journal and self.base is journal._base
                and self.streak is journal._streak and self.curve is journal._streak_curve
                and self.filter is flt and self.weights is flt.weights
                and self.config is config)


def rdp_test(flt: Any) -> Any:
    """The filter's RDP test on a spent curve (``spent -> bool``), or None if it has none."""
    if isinstance(flt, (DPFilter, StrictFilter)):
        weights: Any = flt.resolve_weights(None)  # None for the strict filter
        return lambda spent: flt.admits(spent, weights)
    fallback = getattr(flt, "fallback", None)  # the hybrid filter's part B
    if not isinstance(fallback, DPFilter) or fallback.weights is None:
        return None
    b_weights = fallback.weights
    return lambda spent: fallback.admits(spent, b_weights)


def search(journal: Any, flt: Any, config: Any, n: int) -> Limit | None:
    """The limit for the journal's streak from streak count ``n`` on (None: the filter
    has no RDP test; a limit of -1: ``n`` is refused, and so is every later count).

    Galloping: n, n+1, n+3, n+7, … until the test refuses or the span is reached,
    then bisection; each probe is the filter's own test on ``base + m × curve``.
    """
    test = rdp_test(flt)
    if test is None:
        return None
    base, curve = journal._base, journal._streak_curve
    base_bound, curve_bound = journal._base_bound, journal._streak_bound

    def limit(value: int, exact: bool) -> Limit:
        return Limit(value, exact, journal, base, journal._streak, curve, flt, flt.weights,
                     config)

    def fits(m: int) -> bool:
        # Journal.spent_after's expression (the same floats; no warning past the float range)
        return bool(test(scaled_sum(base, base_bound, m, curve, curve_bound)))

    if not fits(n):  # refused from n on (monotone): nothing more is admitted
        return limit(-1, True)
    lo, step = n, 1
    while True:
        hi = n + step
        if step > _SEARCH_SPAN:
            return limit(lo, False)
        if not fits(hi):
            break
        lo, step = hi, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return limit(lo, True)


__all__ = ["Limit", "rdp_test", "search"]
