"""The O(1) repeated charge (privguard/_accounting/_fastpath.py) decides exactly as the grid arithmetic.

Every sequence is run twice, with the fast path on and off (``Accounting.fast``), and the
two runs must agree bit for bit: each decision, the spent curve, the running ε, the
hybrid filter's part A, the history and the state a checkpoint saves.
"""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privguard import BudgetExhausted, Ledger, LedgerStateError, Plan
from privguard import mechanisms as M
from privguard._accounting import _config
from privguard._accounting._accounting import EVENT_KEYS, Accounting
from privguard._cli._report import report
from privguard._ledger import _ledger

ORDERS = [1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0]
POOL = [M.SubsampledGaussian(2.0, 0.2), M.SubsampledGaussian(2.5, 0.1),
        M.SubsampledGaussian(1.5, 0.2), M.Gaussian(8.0)]
ENVELOPE = M.SubsampledGaussian(2.0, 0.2)
CONFIGS = {
    "rdp": dict(epsilon=2.0, delta=1e-5),
    "strict": dict(rdp_budget=M.SubsampledGaussian(2.0, 0.2, steps=40)),
    "hybrid": dict(epsilon=2.0, delta=1e-5, plan=Plan(ENVELOPE), filter="hybrid"),
    "odometer only": dict(delta=1e-5),
    "rdp, a budget the search caps": dict(epsilon=1e9, delta=1e-5),
}

# an op: ("charge", pool index, times, same object?) | ("afford", i) | ("eps",) | ("reload",)
ops = st.one_of(
    st.tuples(st.just("charge"), st.integers(0, len(POOL) - 1), st.integers(1, 4),
              st.booleans()),
    st.tuples(st.just("afford"), st.integers(0, len(POOL) - 1)),
    st.tuples(st.just("eps")),
    st.tuples(st.just("reload")),
)
# the repeat lane's (Ledger.charge in memory) ops besides: ("single", i, label, pid, same
# object?) charges one step at a time | ("event",) a journal event | ("retarget", factor)
# a logged change of ε | ("break",) / ("hold",) a broken or held ledger
lane_ops = st.one_of(
    ops,
    st.tuples(st.just("single"), st.integers(0, len(POOL) - 1), st.sampled_from([None, "a", "b"]),
              st.integers(0, 1), st.booleans()),
    st.tuples(st.just("event")),
    st.tuples(st.just("retarget"), st.sampled_from([0.5, 1.5])),
    st.tuples(st.just("break")),
    st.tuples(st.just("hold")),
)


def _copy(mechanism):  # an equal mechanism that is another object
    return type(mechanism)(**{k: v for k, v in vars(mechanism).items()})


def _trace(config: dict, seq: list, fast: bool, monkeypatch) -> list:
    monkeypatch.setattr(Accounting, "fast", fast)
    monkeypatch.setattr(_ledger, "time", SimpleNamespace(time=lambda: 1.0))  # same records
    ledger = Ledger(orders=ORDERS, **config)
    out: list = []
    for op in seq:
        if op[0] == "charge":
            _, i, times, same = op
            mech = POOL[i] if same else _copy(POOL[i])
            for _ in range(8):  # a streak, so that the fast path is used
                try:
                    ledger.charge(mech, label=f"m{i}", times=times)
                    out.append(("ok", i, times))
                except BudgetExhausted:
                    out.append(("refused", i, times))
        elif op[0] == "afford":
            out.append(("afford", ledger.can_afford(POOL[op[1]])))
        elif op[0] == "eps":
            out.append(("eps", ledger.epsilon()) if ledger.delta is not None else ("eps",))
        else:
            # a hybrid run that crosses T_A replays as one charge of `count` steps, to the
            # state single charges reach (issue 26: it used to be refused here)
            ledger = Ledger.load_state_dict(ledger.state_dict())
        flt = ledger._acc.filter
        out.append((ledger.spent.tobytes(), len(ledger.history),
                    getattr(flt, "a_count", None), getattr(flt, "a_alive", None)))
    out.append(ledger.state_dict())
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
@settings(max_examples=25, deadline=None)
@given(seq=st.lists(ops, min_size=1, max_size=25))
def test_fast_path_decides_and_spends_exactly_as_the_grid_arithmetic(name, seq):
    with pytest.MonkeyPatch.context() as mp:
        fast = _trace(CONFIGS[name], seq, True, mp)
        slow = _trace(CONFIGS[name], seq, False, mp)
    assert fast == slow


def test_fast_path_is_taken_and_stops_exactly_at_the_budget():
    """A long streak: after the first few charges no spent curve is computed per charge,
    and the last admitted charge and the first refusal are the ordinary path's."""
    step = M.SubsampledGaussian(1.5, 0.05)
    counts = []
    for fast in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Accounting, "fast", fast)
            ledger = Ledger(3.0, 1e-5, orders=ORDERS)
            n = 0
            with pytest.raises(BudgetExhausted):
                while True:
                    ledger.charge(step)
                    n += 1
                    if fast and n > 2:
                        assert ledger._acc.journal._spent_cache is None  # nothing computed
            counts.append((n, ledger.spent.tobytes()))
    assert counts[0] == counts[1]
    assert counts[0][0] > 10


def test_a_hybrid_run_crossing_t_a_reloads_and_reopens(tmp_path):
    # Issue 26: single charges across T_A raised part A's count to T_A, a replay of the
    # merged run row (one charge of `count` steps) left it at the row's start: reload and
    # reopen failed ("does not replay to the recorded filter state").
    cheap = M.SubsampledGaussian(4.0, 0.2)  # inside ENVELOPE; part B admits beyond T_A
    path = tmp_path / "b.db"
    singles = Ledger(orders=ORDERS, path=path, **CONFIGS["hybrid"])
    block = Ledger(orders=ORDERS, **CONFIGS["hybrid"])
    singles.charge(cheap)
    block.charge(cheap)
    t_a, n = singles._acc.filter.steps_a, 1
    with pytest.warns(Warning):  # leaving part A is announced
        while singles._acc.filter.a_alive:
            singles.charge(cheap)
            n += 1
        block.charge(cheap, times=n - 1)
    assert n == t_a + 1 and singles._acc.filter.a_count == t_a
    reloaded = Ledger.load_state_dict(singles.state_dict())
    singles.close()
    reopened = Ledger.open(path)
    for other in (reloaded, reopened, block):
        flt = other._acc.filter
        assert (flt.a_count, flt.a_alive) == (t_a, False)
        assert other.spent.tobytes() == reloaded.spent.tobytes()
    reopened._store.verify()
    reopened.close()


def _lane_trace(config: dict, seq: list, fast: bool, lane: bool, mp) -> list:
    """``seq`` on an in-memory ledger: every decision, every listener event, and after each
    op the spent curve, history, odometer, report and state (the repeat lane on or off)."""
    mp.setattr(Accounting, "fast", fast)
    mp.setattr(Ledger, "repeat_lane", lane)
    # the script's neutral "note" event, a kind this privguard knows for the test only: a
    # stored event of an unknown kind never loads (review bd), and the script reloads
    mp.setitem(EVENT_KEYS, "note", (frozenset({"event", "n"}),))
    clock = iter(range(1, 10**6))
    mp.setattr(_ledger, "time", SimpleNamespace(time=lambda: float(next(clock))))
    pid = [os.getpid()]
    mp.setattr(_ledger.os, "getpid", lambda: pid[0])
    out: list = []
    ledger = Ledger(orders=ORDERS, listeners=[lambda e: out.append(
        ("event", e.kind, e.label, e.mechanism, e.record))], **config)
    for op in seq:
        if op[0] in ("charge", "single"):
            if op[0] == "charge":
                _, i, times, same = op
                label, times_arg = f"m{i}", times
            else:
                _, i, label, p, same = op
                pid[0], times_arg = os.getpid() + p, 1
            mech = POOL[i] if same else _copy(POOL[i])
            for _ in range(6):  # a streak, so that the fast path and the lane are used
                try:
                    out.append(("ok", ledger.charge(mech, label=label, times=times_arg)))
                except (BudgetExhausted, LedgerStateError) as exc:
                    out.append(("refused", type(exc).__name__, str(exc)))
        elif op[0] == "afford":
            try:
                out.append(("afford", ledger.can_afford(POOL[op[1]])))
            except LedgerStateError as exc:
                out.append(("afford", str(exc)))
        elif op[0] == "eps":
            try:
                out.append(("eps", ledger.epsilon()) if ledger.delta is not None else ("eps",))
            except LedgerStateError as exc:
                out.append(("eps", str(exc)))
        elif op[0] == "event":
            with ledger._lock:
                ledger._acc.replay_event({"event": "note", "n": len(out)})
        elif op[0] == "retarget":
            old = ledger._acc.config
            if old.epsilon is not None:  # as a file's retarget records it (_stores/_sqlite)
                new = dataclasses.replace(old, epsilon=old.epsilon * op[1])
                with ledger._lock:
                    ledger._acc.replay_event({"event": "retarget", "old": old.to_dict(),
                                              "new": _config.from_dict(new.to_dict()).to_dict(),
                                              "time": 0.0, "pid": 1, "reason": "test"})
        elif op[0] == "break":
            ledger._break("broken by the test")
        elif op[0] == "hold":
            if ledger._hold("held by the test"):
                try:
                    ledger.charge(POOL[0])
                except LedgerStateError as exc:
                    out.append(("held", str(exc)))
                ledger._unhold()
        elif ledger._broken is None:
            ledger = Ledger.load_state_dict(ledger.state_dict())
            ledger.add_listener(lambda e: out.append(("event", e.kind, e.label, e.mechanism,
                                                      e.record)))
        if ledger._broken is not None:
            out.append(("broken",))
            continue
        flt = ledger._acc.filter
        out.append((ledger.spent.tobytes(), list(ledger.history), ledger.runs, ledger.events,
                    ledger._acc.journal.last, getattr(flt, "a_count", None),
                    getattr(flt, "a_alive", None), ledger.leased_unused))
        if ledger.delta is not None:
            out.append(ledger.epsilon())
        out.append(report(ledger))
    if ledger._broken is None:
        out.append(ledger.state_dict())
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
@settings(max_examples=20, deadline=None)
@given(seq=st.lists(lane_ops, min_size=1, max_size=20))
def test_repeat_lane_records_exactly_what_the_ordinary_path_records(name, seq):
    """Issue 26: Ledger.charge's in-memory repeat lane against the ordinary path (fast path
    on) and against the grid arithmetic (fast path off): the same decisions, refusal
    messages, listener events, records, spent curve bit for bit, history, runs, odometer,
    report and state."""
    traces = []
    for fast, lane in ((True, True), (True, False), (False, False)):
        with pytest.MonkeyPatch.context() as mp:
            traces.append(_lane_trace(CONFIGS[name], seq, fast, lane, mp))
    assert traces[0] == traces[1] == traces[2]


def test_the_repeat_lane_is_taken_and_refusals_take_the_ordinary_path(monkeypatch):
    """The lane answers a streak without the ordinary path (no decide()), stops exactly
    at the budget (the refusal is the ordinary path's), and a broken ledger refuses."""
    step = M.SubsampledGaussian(1.5, 0.05)
    ledger = Ledger(3.0, 1e-5, orders=ORDERS)
    decided = []
    real = Accounting.decide
    monkeypatch.setattr(Accounting, "decide",
                        lambda self, *a, **k: decided.append(1) or real(self, *a, **k))
    n = 0
    with pytest.raises(BudgetExhausted):
        while n < 10**5:  # bounded: a lane that never refuses fails here, not hangs
            ledger.charge(step, label="s")
            n += 1
    assert n > 10 and len(decided) < 6  # the first charges search the limit, then the lane
    assert ledger.history[-1].index == n - 1 and len(ledger.history) == n
    other = Ledger(3.0, 1e-5, orders=ORDERS)
    other.charge(step, label="s", times=n)
    assert other.spent.tobytes() == ledger.spent.tobytes()
    with pytest.raises(BudgetExhausted):
        other.charge(step, label="s")
    broken = Ledger(delta=1e-5, orders=ORDERS)
    broken.charge(step)
    broken.charge(step)
    broken._break("test")
    with pytest.raises(LedgerStateError):
        broken.charge(step)
    assert broken._acc.journal.charges == 2  # nothing charged
