"""A ledger's accounting state and its one decision path. Pure: no I/O, no locks.

:class:`Accounting` holds the configuration, the choices fixed from the plan
before the first output (δ shares, mixture weights, the hybrid envelope), the
filter with its state, the odometer and the journal. ``decide`` checks a
charge without changing anything; ``apply`` commits a decision and returns
the journal changes a store must persist; ``replay_*`` re-applies changes a
store read back, verifying that each one is what this code would have
admitted. Deciding, applying and replaying share one code path, so a check,
a charge and a replay can never disagree.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from privguard._accounting import _fastpath, _lease
from privguard._accounting._config import Config
from privguard._accounting._filters import DPFilter, StrictFilter
from privguard._accounting._journal import ChargeRecord, Journal, Run
from privguard._accounting._odometer import MIXTURE, Odometer, _checked_weights, mixture_weights
from privguard._accounting._plan import Plan
from privguard._curves import _conversion as conv
from privguard._curves import _legacy
from privguard._errors import InvalidArgumentError, LedgerStateError, PrivguardError, _shown
from privguard._mechanisms._base import Mechanism
from privguard._mechanisms._poisson_revision import poisson_tuning_hint

_CACHE_LIMIT = 4096
_BY_ID_LIMIT = 256


class Verdict(NamedTuple):
    """The outcome of :meth:`Accounting.decide`: nothing has changed yet.

    (A named tuple: built on every charge and every replayed row.)
    """

    admitted: bool
    mechanism: Mechanism
    curve: np.ndarray
    times: int
    spent_after: np.ndarray | None  # None: the journal computes it lazily (fast path)
    filter_state: Any
    fix: dict[str, Any] | None  # the plan-derived choices this charge would fix
    filter: Any  # the filter that decided (a fresh one when ``fix`` is set)


def _admitted_at_weighted_deltas(verdict: Verdict) -> Verdict | None:
    """A re-read charge the (ε, δ) filter refuses, admitted if the rule before the exact δ split (lo3)
    admitted it (δ_α = w_α·δ, a few ulps more than :func:`_filters.delta_parts` gives where
    the products sum above δ); None otherwise.

    Review rlo3: a ledger whose last charge was admitted within ulps of its budget (a σ
    bisected to the boundary: Gaussian(4.454867753610349) then Gaussian(0.12954786543284091)
    at (ε, δ) = (66.96122643024195, 3.7064695780085415e-06)) no longer opened ("would be
    refused by the recorded budget"). The charge ran under the budget as it was then; new
    charges are decided by :meth:`DPFilter.admits` alone, so nothing more is admitted."""
    flt, spent = verdict.filter, verdict.spent_after
    if spent is None:
        return None
    from privguard._accounting._hybrid import HybridFilter

    if type(flt) is DPFilter:
        weights = flt.weights  # fixed: a run follows the fix
        if weights is not None and flt.admitted_at_weighted_deltas(spent, weights):
            return verdict._replace(admitted=True)
    elif type(flt) is HybridFilter and flt.fallback.weights is not None:
        admitted, state = flt.decide_with(
            flt.fallback.admitted_at_weighted_deltas(np.asarray(spent, dtype=float), flt.fallback.weights),
            verdict.mechanism, verdict.times)
        if admitted:
            return verdict._replace(admitted=True, filter_state=state)
    return None


def _curve_operations(mechanism: Any, seen: dict[int, tuple[Any, int]]) -> int:
    """The operations of a mechanism's curve that task sr rounds up where privguard before
    rounded to nearest: one (its k-step product), and for a :class:`Composed` one sum per
    part after the first, each part's own counted too (review rsr: a Composed of m parts is
    m − 1 sums, beyond the 3 per run counted before); mechanisms held by another counted
    as parts. ``seen``: (mechanism, count) by ``id``, the mechanism kept so that its id is
    not reused while ``seen`` lives; a mechanism repeated over runs is walked once."""
    key = id(mechanism)
    if key not in seen:
        parts = [v for f in dataclasses.fields(mechanism) if f.init
                 for v in _mechanisms_in(getattr(mechanism, f.name))] \
            if dataclasses.is_dataclass(mechanism) else []
        ops = 1 + max(len(parts) - 1, 0) + sum(_curve_operations(p, seen) for p in parts)
        seen[key] = (mechanism, ops)
    return seen[key][1]


def _mechanisms_in(value: Any) -> list[Any]:
    if isinstance(value, Mechanism):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, Mechanism)]
    return []


class _RereadOperations:
    """The operations behind the spent curve after a re-read charge of a mechanism: per
    run, its product and sum (2) and its curve's (:func:`_curve_operations`); 3 per run for
    the runs before a checkpoint, which are not held; 3 more for the margin (at least the
    3 × (runs + 2) counted before review rsr). The closed runs' part is kept and extended
    (a journal's closed runs are only appended to), so a replay that falls back at every
    charge walks each run once, not once per charge."""

    def __init__(self) -> None:
        self.journal: Any = None
        self.counted = self.total = 0
        self.seen: dict[int, tuple[Any, int]] = {}

    def __call__(self, journal: Any, mechanism: Any) -> int:
        closed = journal._closed
        if journal is not self.journal or self.counted > len(closed):
            self.journal, self.counted, self.total = journal, 0, 0
        seen = self.seen
        self.total += sum(2 + _curve_operations(run.mechanism, seen)
                          for run in closed[self.counted:])
        self.counted = len(closed)
        cur = journal.current_fields()
        held = len(closed) + (cur is not None)
        ops = (self.total + (0 if cur is None else 2 + _curve_operations(cur[4], seen))
               + 3 * max(journal.run_count - held, 0) + 6 + _curve_operations(mechanism, seen))
        return ops


def _admitted_at_nearest_sums(verdict: Verdict, ops: int) -> Verdict | None:
    """A re-read charge refused at the spent curve summed rounding up (task sr), admitted
    if the filter, or the rule of :func:`_admitted_at_weighted_deltas`, admits it at a
    curve nowhere above the round-to-nearest sums privguard computed before
    (:func:`_upward.below_nearest_sums`, ``ops`` operations counted: per run a product, a
    sum and its curve's own, :class:`_RereadOperations`); None otherwise. A journal main
    wrote whose last charge was admitted within ulps of its budget still opens; new charges
    are decided at the rounded-up curve alone (docs/theory.md §6, "Journals written
    before")."""
    flt, spent = verdict.filter, verdict.spent_after
    if spent is None or flt is None:
        return None
    from privguard._curves._upward import below_nearest_sums

    low = below_nearest_sums(spent, ops)
    admitted, state = flt.decide(low, verdict.mechanism, verdict.times)
    if admitted:
        return verdict._replace(admitted=True, filter_state=state)
    older = _admitted_at_weighted_deltas(verdict._replace(spent_after=low))
    return None if older is None else verdict._replace(admitted=True,
                                                       filter_state=older.filter_state)


@dataclasses.dataclass(frozen=True)
class Change:
    """One journal change for a store: ``kind`` is "fix", "run" or "event"."""

    kind: str
    run: Run | None = None
    extended: bool = False
    body: dict[str, Any] | None = None


def nonadaptive_epsilon(orders: np.ndarray, spent: np.ndarray, delta: float) -> float:
    """The improved conversion of a spent curve (Opacus' number rounded up; valid only for a
    sequence fixed in advance: formulas.md §1)."""
    return conv.best(orders, conv.epsilon_per_order(orders, spent, delta))[0]


def check_label(label: Any) -> str | None:
    """A label is None or a string that UTF-8 can encode, without NUL (every store can keep
    it: PostgreSQL's text refuses NUL, and a refused write breaks the ledger; review bx)."""
    if label is None or (type(label) is str and label.isascii() and "\x00" not in label):
        return label  # ASCII always encodes
    if not isinstance(label, str):
        raise InvalidArgumentError("label", label, "must be a string or None")
    if "\x00" in label:
        raise InvalidArgumentError("label", label, "must not contain NUL characters "
                                   "(PostgreSQL cannot store them)")
    try:
        label.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError("label", label, "must be encodable as UTF-8 (no lone "
                                   "surrogates), so that every store can keep it") from None
    return label


#: The keys of each event kind privguard writes, in every version that wrote it (review bi):
#: a retarget's, unchanged since 0.1 (176256f); the migrate event's three forms (a 0.1
#: state's; a 0.1 file's, before and after fb1c173 added "target_restated"); a lease
#: remainder's, unchanged since c58af4c. Any other set of keys for these kinds is an edit.
EVENT_KEYS: dict[str, tuple[frozenset[str], ...]] = {
    "retarget": (frozenset({"event", "time", "pid", "reason", "old", "new"}),),
    "migrate": (frozenset({"event", "from", "records"}),
                frozenset({"event", "time", "pid", "from", "rows", "final_digest", "retargets"}),
                frozenset({"event", "time", "pid", "from", "rows", "final_digest", "retargets",
                           "target_restated"})),
    _lease.UNUSED: (frozenset({"event", "steps", "mechanism", "label", "pid", "reason",
                               "time"}),),
}


def check_event_keys(body: dict[str, Any], where: str) -> None:
    """Refuse an event of a kind privguard writes whose keys are not the ones it wrote."""
    kind = body.get("event")
    if isinstance(kind, str) and kind in EVENT_KEYS and frozenset(body) not in EVENT_KEYS[kind]:
        raise LedgerStateError(f"{where}: a {kind} event with the keys "
                               f"{sorted(map(str, body))}, not the ones privguard writes")


def check_event_kind(body: dict[str, Any], where: str) -> None:
    """Refuse a stored event of a kind this version does not write (review bd): a newer
    version's event may carry an accounting effect (a charge, a retarget, a reset) that
    this one would skip, under-counting; loading fails closed instead."""
    kind = body.get("event")
    if not (isinstance(kind, str) and kind in EVENT_KEYS):
        raise LedgerStateError(f"{where}: an event of kind {_shown(kind)}, unknown to this "
                               f"privguard (it knows {sorted(EVENT_KEYS)}); a newer version's "
                               "event may change the accounting, so the journal is not "
                               "loaded: open it with the version that wrote it")


def _check_stored_event(body: dict[str, Any], where: str, charges: int,
                        unused_before: int) -> None:
    """A checkpoint's event as a journal row's is checked (``replay_event``, stored): its
    kind, its keys, and a lease-unused event's step count within the journal's charges,
    with ``unused_before``, the steps the events before it record as unused, all of them
    together (task bs: a checkpoint's events were checked for their kind only, so an edited
    remainder of -100 or 10**9 steps opened, and one of "x" steps raised ValueError)."""
    check_event_kind(body, where)
    check_event_keys(body, where)
    if body.get("event") == _lease.UNUSED:
        _lease.check_unused_event(body, charges, where, unused_before=unused_before)


def is_retarget(body: Any) -> bool:
    """Whether a journal event's body records a change of target (a retarget)."""
    return isinstance(body, dict) and body.get("event") == "retarget"


class Accounting:
    """Configuration, fixed choices, filter, odometer and journal of one ledger."""

    def __init__(self, config: Config, *, fix_now: bool = True) -> None:
        self.config = config
        self.orders = config.orders
        self.journal = Journal(self.orders.size)
        self.fixed: dict[str, Any] | None = None
        self.filter: Any = None
        self.events: list[dict[str, Any]] = []
        # ("fix" | "event", body) with the number of runs before it, in journal order.
        self.marks: list[tuple[int, list[Any]]] = []
        self._odometers: dict[float, Odometer] = {}
        self._curves: dict[Mechanism, np.ndarray] = {}
        self._by_id: dict[int, tuple[Mechanism, np.ndarray]] = {}
        self._plan_of_first_run = False  # set by replay_fix: check the next run's mechanism
        if fix_now and config.plan is not None:  # declared: fixed now, before any output
            flt = self._make_filter(config.plan)
            self.install_fixed(self.derive_fixed(config.plan, flt), flt)
            self.marks.append((0, ["fix", self.fixed]))

    # -- curves ----------------------------------------------------------------
    def _known_curve(self, mechanism: Any) -> np.ndarray | None:
        """The curve of this very object if it was looked up recently, else None.

        Keyed by identity, holding the object (so its id cannot be reused while
        remembered): a replay meets the same few mechanism objects, the store's,
        again and again, and this skips hashing their parameters. A training loop
        that builds a new mechanism object every step fills it with objects it
        will not see again, so it stays small (``_BY_ID_LIMIT``).
        """
        hit = self._by_id.get(id(mechanism))
        return hit[1] if hit is not None and hit[0] is mechanism else None

    def curve(self, mechanism: Mechanism) -> np.ndarray:
        curve = self._known_curve(mechanism)
        return self._lookup_curve(mechanism) if curve is None else curve

    def _lookup_curve(self, mechanism: Mechanism) -> np.ndarray:
        """The curve by value (computed once per distinct mechanism), then remembered by
        identity."""
        curve = self._curves.get(mechanism)
        if curve is None:
            curve = mechanism._rdp_checked(self.orders)
            if len(self._curves) >= _CACHE_LIMIT:
                self._curves.clear()
            self._curves[mechanism] = curve
        if len(self._by_id) >= _BY_ID_LIMIT:
            self._by_id.clear()
        self._by_id[id(mechanism)] = (mechanism, curve)
        return curve

    # -- choices fixed from the plan ---------------------------------------------
    def _make_filter(self, plan: Plan | None) -> Any:
        """The filter the configuration asks for, fixed from ``plan`` when given.

        ``filter="hybrid"`` needs a plan whose step has an envelope (a
        subsampled or plain Gaussian, or an accumulated step: §2b.1) and a
        positive T_A; otherwise — a choice made from the plan alone, before
        any output — it is the RDP filter at the full δ (docs/theory.md §2b).
        """
        cfg = self.config
        if cfg.filter is None:
            return None
        if cfg.filter == "strict":
            assert cfg.rdp_budget is not None
            return StrictFilter(cfg.rdp_budget, self.orders)
        assert cfg.epsilon is not None and cfg.delta is not None and cfg.shares is not None
        flt: Any = None
        if cfg.filter == "hybrid" and plan is not None and not self.retargeted:
            from privguard._accounting._hybrid import HybridFilter, envelope_of

            envelope = envelope_of(plan.step)
            if envelope is not None:
                flt = HybridFilter(cfg.epsilon, cfg.delta, envelope, self.orders, cfg.shares)
                flt = flt if flt.steps_a > 0 else None
        if flt is None:
            flt = DPFilter(cfg.epsilon, cfg.delta, cfg.shares, self.orders)
        if plan is not None:
            flt.fix(self.curve(plan.step))
        return flt

    def _filter_record(self, flt: Any) -> dict[str, Any] | None:
        if flt is None:
            return None
        if flt.kind == "hybrid":
            return {"kind": "hybrid", "config": flt.config(), "weights": flt.weights.tolist()}
        return {"kind": flt.kind, **flt.fixed()}

    def _filter_from_record(self, record: dict[str, Any]) -> Any:
        cfg = self.config
        kind = record.get("kind", "dp")
        if kind == "strict" or cfg.filter == "strict":
            assert cfg.rdp_budget is not None
            return StrictFilter(cfg.rdp_budget, self.orders)
        assert cfg.epsilon is not None and cfg.delta is not None and cfg.shares is not None
        if kind == "hybrid":
            from privguard._accounting._hybrid import Envelope, HybridFilter

            c = record["config"]
            if (c["epsilon"], c["delta"]) != (cfg.epsilon, cfg.delta):
                raise LedgerStateError("the recorded hybrid filter has another target")
            flt: Any = HybridFilter(c["epsilon"], c["delta"], Envelope.from_dict(c["envelope"]),
                                    self.orders, cfg.shares, delta_a=c["delta_a"],
                                    steps_a=c["steps_a"], certify=False)
            flt.load_state({"a_count": 0, "a_alive": True, "weights": record["weights"]})
            return flt
        assert cfg.epsilon is not None and cfg.delta is not None and cfg.shares is not None
        flt = DPFilter(cfg.epsilon, cfg.delta, cfg.shares, self.orders)
        flt.load_fixed(record)
        return flt

    def derive_fixed(self, plan: Plan, flt: Any = None) -> dict[str, Any]:
        """The record of what is fixed from ``plan`` (chosen before any output)."""
        flt = self._make_filter(plan) if flt is None else flt
        return {"plan": plan.to_dict(), "filter": self._filter_record(flt),
                "odometer": self._odometer_fixed(plan)}

    def derive_fixed_legacy(self, plan: Plan, context: Any = None) -> dict[str, Any]:
        """:meth:`derive_fixed` with the subsampled Gaussian's curves of privguard before
        e08c1f5 (:mod:`privguard._curves._legacy`), for checking an old fix entry on load;
        with ``context`` (a context manager such as ``_legacy.pre_flat``) in its place.

        Computed in a shallow copy whose curve caches start empty and are discarded, in this
        context only: this ledger's caches and the process-wide one keep today's curves. A
        hybrid filter's T_A is dp-accounting's PLD count (the older curve moves only the
        search's starting guess); ``check_fix`` derives today's record first, so T_A is
        then read from ``_hybrid._envelope_steps``' cache.
        """
        scratch = copy.copy(self)
        scratch._curves, scratch._by_id = {}, {}
        with (_legacy.pre_revision if context is None else context)():
            return scratch.derive_fixed(plan)

    def _odometer_fixed(self, plan: Plan) -> dict[str, Any] | None:
        """The mixture odometer's weights, from the plan and the ledger's δ (issue 15)."""
        if self.config.delta is None or self.config.odometer != MIXTURE:
            return None
        return {"weights": mixture_weights(self.orders, plan, self.config.delta).tolist()}

    def items(self) -> list[Any]:
        """The held journal in order: runs, and ["fix" | "event", body] entries."""
        out: list[Any] = []
        marks = iter(self.marks)
        mark = next(marks, None)
        for run in self.journal.held_runs():
            while mark is not None and mark[0] <= run.index:
                out.append(mark[1])
                mark = next(marks, None)
            out.append(run)
        while mark is not None:
            out.append(mark[1])
            mark = next(marks, None)
        return out

    def install_fixed(self, fixed: dict[str, Any], flt: Any = None) -> None:
        record = fixed.get("odometer")  # mixture weights, read whenever ε is: checked here
        if record is not None:
            if not isinstance(record, dict) or set(record) != {"weights"}:
                raise LedgerStateError(f"the fixed odometer record {record!r} is not "
                                       '{"weights": [...]}')
            _checked_weights(record["weights"], self.orders.size)
        if flt is None and self.config.filter is not None:
            flt = self._filter_from_record(fixed["filter"])
        self.fixed, self.filter = fixed, flt
        self._odometers.clear()

    @property
    def plan(self) -> Plan | None:
        """The plan in force: declared, or fixed from the first charge."""
        return None if self.fixed is None else Plan.from_dict(self.fixed["plan"])

    # -- the one decision path -----------------------------------------------------
    def decide(self, mechanism: Any, label: Any, pid: int, times: int = 1) -> Verdict:
        """Would ``times`` more charges of ``mechanism`` be admitted? Changes nothing."""
        curve = self._known_curve(mechanism)  # known: a mechanism checked before
        if curve is None:
            if not isinstance(mechanism, Mechanism):
                raise InvalidArgumentError("mechanism", mechanism, "must be a privguard mechanism")
            curve = self._lookup_curve(mechanism)
        check_label(label)
        if self.fixed is not None and self.fast:
            verdict = self._decide_repeated(mechanism, curve, times)
            if verdict is not None:
                return verdict
        spent_after = self.journal.spent_after(mechanism, curve, times)
        fix, flt = None, self.filter
        if self.fixed is None:  # the first charge fixes the plan-derived choices
            plan = self.config.plan or Plan(mechanism)
            flt = self._make_filter(plan)
            fix = self.derive_fixed(plan, flt)
        if flt is None:
            return Verdict(True, mechanism, curve, times, spent_after, None, fix, flt)
        admitted, state = flt.decide(spent_after, mechanism, times)
        return Verdict(bool(admitted), mechanism, curve, times, spent_after, state, fix, flt)

    fast = True  # the repeated-charge fast path (tests compare against False)

    def _decide_repeated(self, mechanism: Mechanism, curve: np.ndarray, times: int
                         ) -> Verdict | None:
        """:meth:`decide` in O(1) for another charge of the journal's current streak, when
        the filter's answer is known to be "admitted" (privguard/_accounting/_fastpath.py); None
        otherwise (the ordinary path then decides, refusals included).

        The verdict carries no spent curve: the journal materialises it lazily, as
        ``base + n × curve``, the floats the ordinary path computes.
        """
        journal = self.journal
        streak = journal._streak
        if streak is None or not (mechanism is streak or mechanism == streak):
            return None
        flt = self.filter
        if flt is None:
            return Verdict(True, mechanism, curve, times, None, None, None, None)
        n = journal._streak_count + times
        lim = self._limit
        if lim is None or not lim.holds(journal, flt, self.config) or (
                not lim.exact and journal._streak_count >= lim.limit):  # a capped search, used up
            # from the next count on, so the limit is the boundary whatever ``times`` is
            lim = self._limit = _fastpath.search(journal, flt, self.config,
                                                 journal._streak_count + 1)
            if lim is None:
                return None
        b_ok = n <= lim.limit
        if isinstance(flt, (DPFilter, StrictFilter)):
            return Verdict(True, mechanism, curve, times, None, None, None, flt) if b_ok else None
        if b_ok or flt.a_admits(mechanism, times):
            admitted, state = flt.decide_with(b_ok, mechanism, times)
            if admitted:
                return Verdict(True, mechanism, curve, times, None, state, None, flt)
        return None

    _limit: _fastpath.Limit | None = None

    _reread_memo: _RereadOperations | None = None

    def _reread_operations(self, journal: Journal, mechanism: Mechanism) -> int:
        """:class:`_RereadOperations` for this accounting (created on first use)."""
        memo = self._reread_memo
        if memo is None:
            memo = self._reread_memo = _RereadOperations()
        return memo(journal, mechanism)

    def repeat(self, mechanism: Any, label: Any, pid: int, clock: Callable[[], float]
               ) -> ChargeRecord | None:
        """One more charge of the current run (an equal mechanism, an equal label, the same
        process), decided and applied in O(1) when the fast path already knows the answer
        is "admitted": exactly what ``apply(decide(mechanism, label, pid), label, t, pid)``
        records at time ``clock()`` (read once admitted, as the ordinary path reads it), and
        its last :class:`ChargeRecord`. None (nothing changed) in every other
        case, which the ordinary path then decides: another key, a plan not yet fixed, the
        fast path off, a filter other than the RDP and strict ones (the hybrid filter's
        part A has state), a limit not known for this very streak, or a count past it.
        """
        journal = self.journal
        key = journal.repeat_key()  # the current run's, when it continues the streak
        if key is None or self.fixed is None or not self.fast:
            return None
        m, run_label, run_pid, streak_count = key
        if run_pid != pid:
            return None
        # the caller's mechanism: identical or equal and of the same type (a validated
        # mechanism's class)
        if not (mechanism is m or (type(mechanism) is type(m) and mechanism == m)):
            return None
        if not (label is run_label or (type(label) is str and label == run_label)):
            return None  # run_label: checked when its run began
        flt = self.filter
        if flt is not None:
            lim = self._limit  # _decide_repeated's test: admitted iff count ≤ limit
            if (type(flt) is not DPFilter and type(flt) is not StrictFilter) or lim is None \
                    or streak_count + 1 > lim.limit \
                    or not lim.holds(journal, flt, self.config):
                return None
            flt.apply(None)  # the RDP and strict filters keep no state (as apply())
        index = journal.repeat_current(clock())
        # the run's last time as kept (a clock stepped back is clamped to the previous
        # charge's: task lo7, the record carried the clock's time and history the kept one)
        return ChargeRecord(index, run_label, m, journal.current_last_time(), pid)

    def apply(self, verdict: Verdict, label: str | None, t: float, pid: int) -> list[Change]:
        """Commit an admitted verdict; returns the journal changes to persist."""
        assert verdict.admitted
        changes = []
        if verdict.fix is not None:
            self.install_fixed(verdict.fix, verdict.filter)
            self.marks.append((self.journal.run_count, ["fix", verdict.fix]))
            changes.append(Change("fix", body=verdict.fix))
        if self.filter is not None:
            self.filter.apply(verdict.filter_state)
        run, extended = self.journal.append(verdict.mechanism, label, pid, verdict.curve, t,
                                            verdict.times, spent_after=verdict.spent_after)
        changes.append(Change("run", run=run, extended=extended))
        return changes

    # -- replay -----------------------------------------------------------------------
    def replay_fix(self, fixed: dict[str, Any]) -> None:
        if self.fixed is not None:
            if self.fixed != fixed:
                raise LedgerStateError("the journal fixes the plan twice, differently")
            return
        try:
            plan = Plan.from_dict(fixed["plan"])
        except (PrivguardError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LedgerStateError(f"the journal's fixed plan is unreadable ({exc})") from exc
        # The plan is the declared one, else the first charge's mechanism (decide()); a plan
        # chosen after the charges, with weights derived from it, would lower ε (issue 24).
        declared = self.config.plan
        if declared is not None and plan != declared:
            raise LedgerStateError("the journal's fixed plan is not the ledger's declared plan")
        try:
            self.install_fixed(fixed)
        except (PrivguardError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LedgerStateError(f"the journal's fixed plan is unreadable ({exc})") from exc
        self._plan_of_first_run = declared is None
        self.marks.append((self.journal.run_count, ["fix", fixed]))

    def replay_run(self, run: Run, where: str) -> None:
        """Re-admit a run read back from a store (new, or the current one extended)."""
        journal = self.journal
        cur = journal.current_fields()
        if cur is not None and run.index == cur[0]:
            if ((run.mechanism, run.label, run.pid) != (cur[4], cur[3], cur[7])
                    or run.start != cur[1] or run.first_time != cur[5] or run.count < cur[2]):
                raise LedgerStateError(f"{where}: the current run changed behind this ledger")
            more = run.count - cur[2]
            if more:
                verdict = self._readmit(run, more, where)
                journal.extend_current(run.count, run.last_time, verdict.curve,
                                       verdict.spent_after)
            return
        # A run whose last time is before its first is not refused (review radv5): the
        # times are the wall clock's, which NTP can step back, and count for nothing in
        # the accounting; before task adv5 a journal wrote one at such a step (SQLite
        # files, pickles, 0.1 journals being upgraded), and refusing it lost those
        # ledgers for good. A run's rows still verify by their digests.
        if run.index != journal.run_count or run.start != journal.charges or run.count < 1:
            raise LedgerStateError(f"{where}: run {run.index} does not follow the journal")
        if self._plan_of_first_run:  # the first charge after a fix without a declared plan
            self._plan_of_first_run = False
            if self.fixed is not None and Plan(run.mechanism) != self.plan:
                raise LedgerStateError(f"{where}: the journal's fixed plan is not Plan(the "
                                       "first charge's mechanism), the one privguard fixes")
        verdict = self._readmit(run, run.count, where)
        journal.start_run(run, verdict.curve, verdict.spent_after)

    def _readmit(self, run: Run, times: int, where: str) -> Verdict:
        if self.fixed is None:
            raise LedgerStateError(f"{where}: a charge precedes the fixing of the plan")
        try:
            verdict = self.decide(run.mechanism, run.label, run.pid, times)
        except PrivguardError as exc:
            raise LedgerStateError(f"{where}: unreadable charge ({exc})") from exc
        if not verdict.admitted:
            verdict = (_admitted_at_weighted_deltas(verdict)
                       or _admitted_at_nearest_sums(verdict, self._reread_operations(
                           self.journal, run.mechanism))
                       or verdict)
        if not verdict.admitted:
            raise LedgerStateError(f"{where} ({run.label!r}, {times} × {run.mechanism!r}) "
                                   "would be refused by the recorded budget"
                                   + poisson_tuning_hint(run.mechanism))
        if self.filter is not None:
            self.filter.apply(verdict.filter_state)
        return verdict

    def replay_event(self, body: dict[str, Any], where: str | None = None) -> None:
        """An explicit, logged event; a retarget (:func:`is_retarget`) brings its new
        configuration, which this accounting adopts.

        A retarget goes from the configuration in force (its "old") to another one
        (its "new"): privguard never logs one that changes nothing, so such a record is
        forged (a retarget relaxes a hybrid filter into the RDP filter) and fails closed.
        """
        stored, where = where is not None, where or "an event"  # stored: read back from a journal
        config = None
        if is_retarget(body):
            from privguard._accounting import _config

            try:
                old, config = _config.from_dict(body["old"]), _config.from_dict(body["new"])
            except (PrivguardError, KeyError, TypeError, ValueError, AttributeError) as exc:
                raise LedgerStateError(f"{where}: an unreadable retarget ({exc})") from None
            if old != self.config:
                raise LedgerStateError(f"{where}: a retarget from a configuration not in force")
            if config == self.config:
                raise LedgerStateError(f"{where}: a retarget that changes nothing (privguard "
                                       "never logs one)")
        elif "retargets" in body:
            self._check_migrated_retargets(body, where)
        elif body.get("event") == _lease.UNUSED:
            journal = self.journal  # a stored event: checked against its key's charges
            _lease.check_unused_event(
                body, journal.charges, where,
                None if journal.runs_before or not stored else journal.held_runs(), self.events,
                unused_before=self._unused_so_far() if stored else None)
        if stored:  # after the checks above, whose messages say more; a fresh one is ours
            check_event_kind(body, where)
            check_event_keys(body, where)
        self.events.append(body)
        self.marks.append((self.journal.run_count, ["event", body]))
        self.journal.close_current()  # the journal's rows: an event ends the current run
        if config is not None:
            self.retarget(config)

    def _unused_so_far(self) -> int:
        """Steps the events so far record as leased and unused (:func:`_lease.unused_steps`),
        summed once: ``events`` only grows, so each call adds the events since the last."""
        seen, total = getattr(self, "_unused_seen", (0, 0))
        if seen > len(self.events):  # not this list's (never: events are only appended)
            seen, total = 0, 0
        total += _lease.unused_steps(self.events[seen:])
        self._unused_seen = (len(self.events), total)
        return total

    def _check_migrated_retargets(self, body: dict[str, Any], where: str) -> None:
        """A 0.1 file's retargets, listed in the migrate event ``privguard upgrade`` writes
        as a journal's first entry: they name the δ the ledger was created with, which
        ``guarantee()`` states after a retarget (docs/theory.md §4). Anywhere else, or
        not a chain of configurations ending in this one, such a list is forged: appended
        to a checkpoint it moved guarantee() to a δ of the forger's choosing (adv24)."""
        if self.marks or self.journal.charges or body.get("event") != "migrate":
            raise LedgerStateError(f"{where}: a list of retargets outside the migrate event "
                                   "that opens an upgraded journal (privguard writes none)")
        from privguard._accounting import _config

        chain = body["retargets"]
        try:
            if not isinstance(chain, list) or not all(
                    isinstance(e, dict) and is_retarget(e) for e in chain):
                raise TypeError("not a list of retarget events")
            for i, e in enumerate(chain):
                check_event_keys(e, f"{where}, migrated retarget {i}")
            configs = [(_config.from_dict(e["old"]), _config.from_dict(e["new"])) for e in chain]
        except (PrivguardError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LedgerStateError(f"{where}: unreadable migrated retargets ({exc})") from None
        # each retarget's new configuration is the next one's old, the last one's is this
        targets = [old for old, _ in configs[1:]] + [self.config]
        if any(new != target for (_, new), target in zip(configs, targets)):
            raise LedgerStateError(f"{where}: the migrated retargets do not chain to this "
                                   "ledger's configuration")

    def retarget(self, config: Config) -> None:
        """Adopt a new target (an explicit, logged decision). The fixed plan stays."""
        self.config = config
        if self.fixed is not None:
            plan = Plan.from_dict(self.fixed["plan"])
            flt = self._make_filter(plan)  # a retargeted hybrid is the RDP filter (fresh A: no)
            self.fixed = {**self.fixed, "filter": self._filter_record(flt)}
            self.filter = flt
        self._odometers.clear()

    @property
    def retargeted(self) -> bool:
        """Whether the target was changed after charges were made (then not fixed in advance)."""
        return any(is_retarget(e) or e.get("retargets") for e in self.events)

    # -- queries ------------------------------------------------------------------------
    def spent(self) -> np.ndarray:
        return self.journal.spent()

    def odometer(self, delta: float) -> Odometer:
        """The odometer to read at ``delta``.

        The mixture's weights are the ones fixed with the plan. A ledger
        without δ fixed none; it derives them at the queried δ from the plan
        recorded at the first charge — a function of that plan alone, hence
        also fixed before any output.
        """
        odo = self._odometers.get(delta)
        if odo is None:
            weights = None
            if self.config.odometer == MIXTURE and self.fixed is not None:
                record = self.fixed.get("odometer")
                weights = (record["weights"] if record is not None else
                           mixture_weights(self.orders, Plan.from_dict(self.fixed["plan"]), delta))
            odo = Odometer(self.orders, self.config.odometer, weights=weights)
            self._odometers[delta] = odo
        return odo

    def epsilon(self, delta: float) -> float:
        """The odometer's running ε at ``delta`` (0.0 before any charge)."""
        if self.journal.charges == 0:
            return 0.0
        return self.odometer(delta).epsilon(self.spent(), delta)

    def nonadaptive_epsilon(self, delta: float) -> float:
        """The improved conversion of the spent curve at ``delta`` (0.0 before any charge).

        Nothing released is (0, 0)-DP, and Opacus' RDP accountant says 0 for an empty
        history; the conversion of the zero curve is not 0 (about 0.0035 at δ = 10⁻⁵ on the
        default grid: its log(1/δ)/(α−1) term at the largest order), which ``privguard
        report`` printed as the naive ε of an empty ledger (task adv9)."""
        if self.journal.charges == 0:
            return 0.0
        return nonadaptive_epsilon(self.orders, self.spent(), delta)

    def repeats(self, mechanism: Mechanism, label: str | None, pid: int) -> float:
        """Largest k such that k more charges of ``mechanism`` would each be admitted."""
        if self.config.filter is None:
            return math.inf

        def fits(k: int) -> bool:
            return self.decide(mechanism, label, pid, times=k).admitted

        if not fits(1):
            return 0
        lo, hi = 1, 2
        while fits(hi):
            lo, hi = hi, hi * 2
            if hi > 2**62:
                return math.inf
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def headroom(self, mechanism: Mechanism | None) -> np.ndarray | None:
        flt = self.filter
        if flt is None and self.config.filter is not None and mechanism is not None:
            flt = self._make_filter(self.config.plan or Plan(mechanism))
        if flt is None:
            return None
        if isinstance(flt, StrictFilter):
            return flt.headroom(self.spent(), None)
        if isinstance(flt, DPFilter):
            return flt.headroom(self.spent(), flt.resolve_weights(None))
        return flt.headroom(self.spent())

    # -- checkpoints -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "fixed": self.fixed,
                "journal": self.journal.snapshot(),
                "filter_state": None if self.filter is None else self.filter.state(),
                "events": list(self.events)}

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any]) -> Accounting:
        from privguard._accounting import _config

        try:
            acc = cls(_config.from_dict(snap["config"]), fix_now=False)
            if snap["fixed"] is not None:
                acc.install_fixed(snap["fixed"])
            acc.journal = Journal.from_snapshot(acc.orders.size, snap["journal"], acc.curve)
            if acc.filter is not None:
                acc.filter.load_state(snap["filter_state"] or {})
            acc.events = list(snap["events"])
            unused = 0  # remainders are charges (theory §13): together at most the charges
            for i, body in enumerate(acc.events):  # the events before it (review bd)
                if not isinstance(body, dict):
                    raise LedgerStateError(f"checkpoint event {i} is not a dict")
                _check_stored_event(body, f"checkpoint event {i}", acc.journal.charges, unused)
                unused += _lease.unused_steps([body])  # checked above: an int in range
        except LedgerStateError:
            raise
        except (PrivguardError, KeyError, TypeError, ValueError, AttributeError, IndexError,
                OverflowError) as exc:
            raise LedgerStateError(f"checkpoint unreadable ({exc})") from exc
        return acc
