"""Leases: a block of identical steps admitted and made durable in one transaction.

A durable charge costs one commit (an fsync, or a round trip to the server).
A DP-SGD run charges the same mechanism thousands of times in a row, so a file
or server ledger admits a block of ``n`` identical steps of the current
mechanism at once — through the very decision a ``charge(times=n)`` takes, the
filter admitting the whole block before its first step — writes it to the
journal as ``n`` charges (spent, visible to every process sharing the journal),
and then hands the steps out from memory: no I/O, no grid arithmetic.

The rules (docs/theory.md §13; README "Leases"):

* Nothing is ever refunded. A crash, a SIGKILL, a change of mechanism or label,
  or an early stop leaves the unused part of a lease spent (an over-count, never
  an under-count). A change of mechanism and a normal :meth:`Ledger.close`
  record the unused remainder as a ``lease-unused`` journal event.
* Sizes: the k-th lease of a streak of identical steps is at most the number of
  steps the streak has already released, r (so sizes grow geometrically: 1, 1, 2,
  4, …), at most max(C, r // :data:`RELATIVE`) for the cap C = ``lease=``
  (:data:`DEFAULT_CAP` steps by default; a long streak's leases grow to 1/64 of
  what it released, so a 10⁴-step run pays ~200 commits, not 600), its
  cost in the budget meter's currency (docs/theory.md §12, the RDP meter of the
  filter, or of the hybrid filter's part B) is at most :data:`FRACTION` of the
  meter's remaining budget, and it is shrunk to the largest count the filter
  admits. With the hybrid filter, while part A is alive, a lease never takes A
  past T_A (docs/theory.md §2b): at most FRACTION × (T_A − c) envelope steps. Under
  the strict filter, at most FRACTION of the budget left at every order it charges.
* Hence the unused remainder at any abandonment is fewer than
  ``min(max(C, r // RELATIVE), max(1, r))`` steps (r: steps the streak released
  before the lease), and its meter cost at most ``FRACTION`` × the remaining
  budget when it was taken.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._mechanisms._base import Mechanism

#: Largest lease, in steps, of a file or server ledger by default (``lease=None``).
#: Chosen for both numbers of issue 26: a ~1 ms commit amortised over 16 steps adds
#: ≤ 63 µs to a step, and the over-count of a run whose mechanism changes every
#: 1,000 steps is ≤ 16/1000 of its released spend (docs/theory.md §13).
DEFAULT_CAP = 16

#: A streak that released r steps may take leases of up to r // RELATIVE steps beyond
#: the cap (over-count ≤ 1/64 ≈ 1.6% of the streak's released steps).
RELATIVE = 64

#: Largest lease accepted by ``lease=`` (a cap in steps).
MAX_CAP = 2**20

#: A lease's cost in the budget meter's currency is at most this fraction of the
#: meter's remaining budget (ε − meter), so leases shrink near the end of the budget.
FRACTION = 0.1

#: The journal event that records a lease's unused remainder (still spent).
UNUSED = "lease-unused"


def check_cap(lease: Any, durable: bool) -> int:
    """The lease cap in steps: ``lease`` validated, or the default (``DEFAULT_CAP`` for a
    file or server ledger, 1 — no leases — in memory).

    Raises:
        InvalidArgumentError: ``lease`` is not None or an integer in [1, MAX_CAP].
    """
    if lease is None:
        return DEFAULT_CAP if durable else 1
    return check.positive_int("lease", lease, maximum=MAX_CAP)


@dataclasses.dataclass
class Lease:
    """Steps admitted and journaled (spent) but not yet handed out, for one key.

    Mutable and private to one ledger in one process (``pid``); never pickled.
    """

    mechanism: Mechanism
    label: str | None
    pid: int
    left: int  # prepaid steps not yet handed out
    next_index: int  # journal index of the next step to hand out
    streak: int  # steps of this key released since the streak began (sizes grow with it)

    def covers(self, mechanism: Any, label: Any, pid: int, times: int) -> bool:
        return self.left >= times and self.same_key(mechanism, label, pid)

    def same_key(self, mechanism: Any, label: Any, pid: int) -> bool:
        # The type first, exactly as the unleased path validates it: an object with a
        # loose __eq__ (unittest.mock.ANY) is no mechanism and must reach that check. The
        # lease's own mechanism's type implies it, without the ABC's isinstance (task qs).
        return ((type(mechanism) is type(self.mechanism) or isinstance(mechanism, Mechanism))
                and pid == self.pid and label == self.label
                and (mechanism is self.mechanism or mechanism == self.mechanism))

    def take(self, times: int) -> int:
        """Hand out ``times`` steps; returns the journal index of the last one."""
        self.left -= times
        self.next_index += times
        self.streak += times
        return self.next_index - 1


def target_size(cap: int, released: int, times: int) -> int:
    """The size a lease asks for before the filter's shrink: geometric growth with the
    streak (at most what it released), at most max(``cap``, released // RELATIVE), at
    least ``times``; ``times`` itself for ``cap`` = 1 (no leases)."""
    if cap <= 1:
        return times
    return max(times, bound(cap, released))


#: A prefetch (``Ledger(prefetch=True)``) of a streak's next lease starts once the current
#: lease has at most 1/PREFETCH_AT of the streak's bound left (at least 2 steps).
PREFETCH_AT = 4


def bound(cap: int, released: int) -> int:
    """min(max(``cap``, released // RELATIVE), max(1, released)): what a streak that
    released ``released`` steps may hold leased and unused, exclusive (Proposition 2 of
    docs/theory.md §13: every abandoned remainder is fewer steps than this)."""
    return min(max(cap, released // RELATIVE), max(1, released))


def prefetch_size(cap: int, released: int, left: int) -> int:
    """The size a prefetched next lease asks for (before the T_A rule, the meter and the
    filter shrink it) while the current lease of the streak has ``left`` steps: what keeps
    the current remainder plus the next lease fewer than :func:`bound` (so Proposition 2
    holds as written: one abandonment leaves fewer than the bound unused); 0 or less:
    no prefetch."""
    return bound(cap, released) - 1 - left


def prefetch_due(cap: int, released: int, left: int) -> bool:
    """Whether a streak whose current lease has ``left`` steps starts its prefetch now."""
    return 0 < left <= max(2, bound(cap, released) // PREFETCH_AT) \
        and prefetch_size(cap, released, left) > 0


def hybrid_room(flt: Any, mechanism: Mechanism, times: int, n: int, held: int = 0) -> int:
    """``n`` capped so that a lease never closes the hybrid filter's part A: while A is
    alive and the mechanism is inside its envelope (k envelope steps a charge), at most
    (T_A − c) // k steps (docs/theory.md §2b, §13); never below ``times`` (a charge of
    ``times`` closes A exactly as it would without leases). ``held``: steps of this key
    leased and unused (a prefetch, :func:`prefetch_size`): ``n`` and ``times`` count
    them, and c is taken without them (they are sized as one lease with the new one)."""
    if getattr(flt, "kind", None) != "hybrid" or not flt.a_alive:
        return n
    from privguard._accounting._hybrid import envelope_steps_in

    k = envelope_steps_in(mechanism, flt.envelope)
    if k is None or k <= 0:
        return n
    # Part A's meter is its count c of envelope steps: a lease takes at most FRACTION of
    # what is left, (T_A − c), so it never closes A and its unused part is bounded as the
    # RDP meter's is (docs/theory.md §13).
    return max(times, min(n, int(FRACTION * (flt.steps_a - flt.a_count + held * k)) // k))


def meter_room(flt: Any, spent: np.ndarray, curve: np.ndarray, times: int, n: int,
               held: int = 0) -> int:
    """``n`` capped so that the lease's cost in the RDP meter's currency (docs/theory.md
    §12: the filter's, or the hybrid's part B's once part A is closed) is ≤ FRACTION ×
    the meter's remaining budget; never below ``times``. The strict filter: ≤ FRACTION ×
    the remaining budget at every order. No filter, or part A alive (bounded by
    :func:`hybrid_room`): ``n``. ``held``: as for :func:`hybrid_room` (the spend is
    taken without those ``held`` steps of ``curve``)."""
    from privguard._accounting._budget import meter_from_terms
    from privguard._accounting._filters import DPFilter

    if held:  # past the float range (a huge curve; review rbd): +inf, or NaN where
        # inf − inf, which rdp_meter reads as +inf (a smaller lease, never a larger charge)
        with np.errstate(over="ignore", invalid="ignore"):
            spent = spent - held * curve

    if getattr(flt, "kind", None) == "hybrid" and flt.a_alive:
        return n  # part A's meter is a PLD count: the T_A rule (hybrid_room) bounds it
    if getattr(flt, "kind", None) == "strict" and n > times:
        # Strict per-order budget b: the lease's cost n·c(α) is at most FRACTION of what
        # is left, b(α) − S(α), at every order α that it charges (docs/theory.md §13). An
        # order where b(α) = +inf never binds; left in, inf − inf = NaN there turned the
        # cap off at every order (review rl).
        charged = (curve > 0) & np.isfinite(flt.budget)
        if not charged.any():
            return n
        with np.errstate(over="ignore"):  # a subnormal c(α) (q = 1e-310): +inf, no cap
            most = float(np.min(FRACTION * (flt.budget[charged] - spent[charged])
                                / curve[charged]))
        return n if not np.isfinite(most) else max(times, min(n, int(max(most, 0.0))))
    dp = flt if isinstance(flt, DPFilter) else getattr(flt, "fallback", None)
    if not isinstance(dp, DPFilter) or dp.weights is None or n <= times:
        return n
    # The filter's terms once, and one errstate for every evaluation: each is
    # rdp_meter(dp, spent + m * curve) bit for bit (meter_from_terms).
    terms = dp.terms(dp.resolve_weights(None))
    with np.errstate(invalid="ignore"):
        m0 = meter_from_terms(terms, spent)
        room = FRACTION * (dp.epsilon - m0)

        def excess(m: int) -> float:  # the meter's rise over m steps: non-decreasing in m
            with np.errstate(over="ignore"):  # +inf past the float range: refused (review rbd)
                probe = spent + m * curve  # (theory §12, Prop. 2)
            return meter_from_terms(terms, probe) - m0

        over = excess(n)
        if over <= room:
            return n
        return largest_fitting(lambda m: excess(m) <= room, times, n,
                               _secant_guess(n, room, over))


def _secant_guess(n: int, room: float, over: float) -> int:
    """Where the meter's rise over m steps, f(m), crosses ``room``, from f(n) = ``over`` >
    ``room`` (a guess only: :func:`largest_fitting` verifies it). Per order, the improved
    ε is affine in the spent RDP (:func:`privguard._curves._conversion.improved_upper`),
    hence in m; their minimum is concave in m, so where the meter at the spent curve is
    above its floor 0, f(m) ≥ (m / n) f(n): the crossing is at most n · room / f(n), and
    near it when f is nearly linear (one order binds). (Where the minimum is below 0 at
    the spent curve, the meter clamps it and the crossing may lie above the guess; the
    search only needs f non-decreasing: review rqs.) 0 where that is no finite number."""
    guess = n * room / over if 0.0 < room < over < math.inf else 0.0
    return int(guess) if math.isfinite(guess) else 0


def largest_fitting(fits: Any, lo: int, hi: int, guess: int) -> int:
    """The largest m in [``lo``, ``hi``) with ``fits(m)``, or ``lo`` if none above it,
    for a ``fits`` that is True up to some count and False after (monotone), False at
    ``hi``; ``lo`` itself is never probed (kept, as a bisection from [lo, hi] keeps it).
    The same answer as that bisection, with fewer probes near ``guess``: the first probe
    is ``guess`` (clamped into (lo, hi)), then steps of 1, 2, 4, … away from it toward
    the boundary, then a bisection of what is left (task qs: the lease sizing's
    meter cap bisected [1, 117] in 7 probes for a lease of 1 step, at each of the last
    ~60 leases of the README's quick start)."""
    if hi - lo <= 1:
        return lo
    g = min(max(guess, lo + 1), hi - 1)
    step = 1
    if fits(g):  # lo kept: gallop up from g
        lo = g
        while hi - lo > 1:
            probe = min(lo + step, hi - 1)
            if not fits(probe):
                hi = probe
                break
            lo, step = probe, step * 2
    else:  # hi refused: gallop down from g
        hi = g
        while hi - lo > 1:
            probe = max(hi - step, lo + 1)
            if fits(probe):
                lo = probe
                break
            hi, step = probe, step * 2
    while hi - lo > 1:  # bisection: lo kept, hi refused
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def unused_event(lease: Lease, reason: str, t: float) -> dict[str, Any]:
    """The journal event recording a lease's unused remainder (it stays spent)."""
    return {"event": UNUSED, "steps": lease.left, "mechanism": lease.mechanism.to_dict(),
            "label": lease.label, "pid": lease.pid, "reason": reason, "time": t}


def check_unused_event(body: dict[str, Any], charges: int, where: str,
                       runs: list[Any] | None = None, events: Any = (),
                       unused_before: int | None = None) -> None:
    """A recorded remainder is a positive step count within the journal's charges (it
    lowers nothing: the steps stay in the spent curve; checked so an edit shows). With
    ``runs`` (every run of the journal so far, i.e. not resumed from a checkpoint), the
    remainders recorded for one key (mechanism, label, pid), ``events`` earlier ones
    included, are at most that key's charges: a lease's unused steps are charges of its
    key, so an event naming a key never charged, or more steps than it charged, is
    inconsistent (it would make the released steps negative). Without ``runs`` (a journal
    resumed from a checkpoint), the remainders of every key together, ``unused_before``
    (those recorded before this one, given for a stored event) included, are at most the
    charges (review rbs: each
    event was checked alone there, so three of 10 steps each opened on 10 charges)."""
    from privguard._errors import LedgerStateError, PrivguardError
    from privguard._mechanisms._base import mechanism_from_dict

    steps = body.get("steps")
    if type(steps) is not int or not 0 < steps <= charges:
        raise LedgerStateError(f"{where}: a lease-unused event of {steps!r} steps, of "
                               f"{charges} charges in the journal")
    try:  # readable even where its key is not checked (task bs: a checkpoint's events)
        mechanism = mechanism_from_dict(body.get("mechanism"))
    except (PrivguardError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LedgerStateError(f"{where}: a lease-unused event of an unreadable mechanism "
                               f"({exc})") from None
    if runs is None:  # resumed from a checkpoint: `privguard verify` replays every run
        if unused_before is not None and steps + unused_before > charges:  # of any key
            raise LedgerStateError(f"{where}: lease-unused events of {steps + unused_before} "
                                   f"steps in all, of {charges} charges in the journal")
        return
    key = (body.get("label"), body.get("pid"))
    charged = sum(r.count for r in runs if (r.label, r.pid) == key and r.mechanism == mechanism)
    recorded = steps + sum(e["steps"] for e in events
                           if isinstance(e, dict) and e.get("event") == UNUSED
                           and (e.get("label"), e.get("pid")) == key
                           and e.get("mechanism") == body.get("mechanism"))
    if recorded > charged:
        raise LedgerStateError(f"{where}: lease-unused events of {recorded} steps for a key "
                               f"(mechanism, label {key[0]!r}, pid {key[1]!r}) charged "
                               f"{charged} times")


def unused_steps(events: Any) -> int:
    """Steps recorded as leased but unused in a journal's events."""
    return sum(int(e.get("steps", 0)) for e in events
               if isinstance(e, dict) and e.get("event") == UNUSED)


__all__ = ["DEFAULT_CAP", "FRACTION", "MAX_CAP", "PREFETCH_AT", "RELATIVE", "UNUSED", "Lease",
           "bound", "check_cap", "check_unused_event", "hybrid_room", "largest_fitting",
           "meter_room", "prefetch_due", "prefetch_size", "target_size", "unused_event",
           "unused_steps"]
