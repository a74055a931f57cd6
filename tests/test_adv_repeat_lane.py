"""Adversarial review of Ledger.charge's repeat lane (issue 26; s26's 452be0d, 3f3da9a).

The lane (privguard/_ledger/_ledger.py ``charge``; ``Accounting.repeat``;
``Journal.repeat_current``) must take exactly the decisions and make exactly the records
of the ordinary path (``Ledger.repeat_lane = False``), and keep every promise of the
ledger: fail closed, a forked child never uses its parent's run or lease, concurrent
threads never lose or double-count a step, no built-in exception escapes a public call.

Each test states the promise it checks. Two were findings of the review, fixed since:
an array as ``times`` (the lane compared it before checking its type) and an unpickled
file ledger that kept its lease in a forked child (``LedgerState.__setstate__`` did not
register the ledger for the at-fork drop).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import threading
import warnings
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from privguard import (
    BudgetExhausted,
    InvalidArgumentError,
    Ledger,
    LedgerStateError,
    Plan,
    PlanDeviationWarning,
)
from privguard import mechanisms as M
from privguard._accounting import _config
from privguard._accounting._accounting import EVENT_KEYS, Accounting
from privguard._cli._report import report
from privguard._ledger import _ledger

STEP = M.SubsampledGaussian(1.0, 0.01)
ORDERS = [1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0]


def _memory() -> Ledger:
    return Ledger(3.0, 1e-5, orders=ORDERS)


# ------------------------------------------------------------------- bad input, no escape
def _bad_times() -> list:
    out = [np.array([1, 2]), np.array([1, 1, 1])]
    try:
        import torch

        out.append(torch.tensor([1, 2]))
    except ImportError:  # pragma: no cover - torch is a test dependency
        pass
    return out


@pytest.mark.parametrize("where", ["memory", "file"])
@pytest.mark.parametrize("lane", [True, False])
@pytest.mark.parametrize("bad", _bad_times(), ids=lambda b: type(b).__module__ + repr(list(b)))
def test_an_array_as_times_is_refused_naming_times(tmp_path, monkeypatch, where, lane, bad):
    # Promise (BRIEF_COMMON): bad input -> InvalidArgumentError naming the argument and
    # the value, nothing charged; no built-in exception escapes a public call. Before the
    # lane (8c1b732) check.positive_int refused it: "times='array([1, 2])' is invalid".
    monkeypatch.setattr(Ledger, "repeat_lane", lane)
    ledger = _memory() if where == "memory" else Ledger(3.0, 1e-5, path=tmp_path / "t.db")
    for _ in range(20):  # a current run (memory) and a lease (file): the lane's inputs
        ledger.charge(STEP)
    charges = ledger._acc.journal.charges
    try:
        with pytest.raises(InvalidArgumentError, match="times"):
            ledger.charge(STEP, times=bad)
    finally:
        assert ledger._acc.journal.charges == charges  # nothing charged either way
        ledger.close()


@pytest.mark.parametrize("where", ["memory", "file"])
def test_a_loose_eq_object_never_passes_the_lane_as_mechanism_or_label(tmp_path, where):
    # Promise: the lane skips re-validation only for a mechanism/label equal to the current
    # run's, of the validated type. unittest.mock.ANY equals everything: compared with ==
    # alone it would extend the run (a record whose mechanism was never checked).
    ledger = _memory() if where == "memory" else Ledger(3.0, 1e-5, path=tmp_path / "a.db")
    for _ in range(20):
        ledger.charge(STEP, label="s")
    charges = ledger._acc.journal.charges
    with pytest.raises(InvalidArgumentError, match="mechanism"):
        ledger.charge(mock.ANY, label="s")
    with pytest.raises(InvalidArgumentError, match="label"):
        ledger.charge(STEP, label=mock.ANY)
    with pytest.raises(InvalidArgumentError, match="label"):
        ledger.charge(STEP, label=7)
    assert ledger._acc.journal.charges == charges
    assert ledger.charge(STEP, label="s").index == 20  # still usable, the next step
    ledger.close()


# ------------------------------------------------------------------- lane on = lane off
BASE = M.SubsampledGaussian(1.5, 0.02)  # (ε=1, δ=1e-5) on ORDERS: 208 steps


def _variants():
    """Equal but distinct objects, and 0.1 + 0.2 style neighbours (not equal: a new run)."""
    return [BASE, M.SubsampledGaussian(1.5, 0.02), M.SubsampledGaussian(1.5, 0.02, steps=1),
            M.SubsampledGaussian(1.5, 0.1 * 0.2), M.SubsampledGaussian(0.5 + 1.0, 0.02),
            M.SubsampledGaussian(1.5, 0.01 + 0.01),
            M.SubsampledGaussian(float(np.nextafter(1.5, 2.0)), 0.02), M.Gaussian(8.0)]


CONFIGS = {
    "rdp": dict(epsilon=1.0, delta=1e-5),
    "strict": dict(rdp_budget=M.SubsampledGaussian(1.5, 0.02, steps=150)),
    "hybrid": dict(epsilon=1.0, delta=1e-5, plan=Plan(BASE), filter="hybrid"),
    "odometer only": dict(delta=1e-5),
}


def _script(seed: int) -> list:
    rng = np.random.default_rng(seed)
    n = len(_variants())
    out = []
    for _ in range(40):
        r = rng.random()
        if r < 0.55:
            out.append(("charge", int(rng.integers(n)), [None, "a", "b"][rng.integers(3)],
                        int(rng.choice([1, 1, 1, 2, 3])), int(rng.integers(1, 30))))
        elif r < 0.65:
            out.append(("pickle",))
        elif r < 0.75:
            out.append(("event",))
        elif r < 0.8:
            out.append(("raising listener", int(rng.integers(2, 7))))
        elif r < 0.85:
            out.append(("load in place",))
        elif r < 0.88:
            out.append(("retarget", float(rng.choice([0.8, 1.25]))))
        else:
            out.append(("quiet",))
    return out


def _trace(config: dict, script: list, lane: bool, mp) -> list:
    mp.setattr(Ledger, "repeat_lane", lane)
    # the script's neutral "note" event, a kind this privguard knows for the test only: a
    # stored event of an unknown kind never loads (review bd), and the script reloads
    mp.setitem(EVENT_KEYS, "note", (frozenset({"event", "n"}),))
    clock = iter(range(1, 10**7))
    mp.setattr(_ledger, "time", SimpleNamespace(time=lambda: float(next(clock))))
    out: list = []
    raise_every = [0]
    seen = [0]

    def listener(event):
        seen[0] += 1
        out.append(("event", event.kind, event.label, event.mechanism, event.record))
        if raise_every[0] and seen[0] % raise_every[0] == 0:
            raise RuntimeError(f"listener {seen[0]}")

    ledger = Ledger(orders=ORDERS, listeners=[listener], **config)
    variants = _variants()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for op in script:
            if op[0] == "charge":
                _, i, label, times, reps = op
                for _ in range(reps):
                    try:
                        out.append(("ok", ledger.charge(variants[i], label=label, times=times)))
                    except (BudgetExhausted, LedgerStateError) as exc:
                        out.append(("refused", type(exc).__name__, str(exc)))
                    except RuntimeError as exc:  # the listener's: the charge is recorded
                        out.append(("listener raised", str(exc), len(ledger.history)))
            elif op[0] == "pickle":
                ledger = pickle.loads(pickle.dumps(ledger))
                ledger.add_listener(listener)
            elif op[0] == "event":
                with ledger._lock:
                    ledger._acc.replay_event({"event": "note", "n": len(out)})
            elif op[0] == "raising listener":
                raise_every[0] = op[1]
            elif op[0] == "load in place":  # a checkpoint of this very journal: allowed
                ledger.load_state_dict(ledger.state_dict())
            elif op[0] == "retarget":  # as a file's retarget records it (tests/test_fastpath)
                old = ledger._acc.config
                if old.epsilon is not None:
                    new = dataclasses.replace(old, epsilon=old.epsilon * op[1])
                    with ledger._lock:
                        ledger._acc.replay_event({"event": "retarget", "old": old.to_dict(),
                                                  "new": _config.from_dict(
                                                      new.to_dict()).to_dict(),
                                                  "time": 0.0, "pid": 1, "reason": "test"})
            else:
                raise_every[0] = 0
            flt = ledger._acc.filter
            budget = ledger.budget()
            out.append((ledger.spent.tobytes(), list(ledger.history), ledger.runs,
                        ledger.events, ledger._acc.journal.last, getattr(flt, "a_count", None),
                        getattr(flt, "a_alive", None), None if budget is None else
                        (budget.spent, budget.remaining) if hasattr(budget, "remaining")
                        else repr(budget), ledger.delta and ledger.epsilon(), report(ledger)))
        out.append([(w.category.__name__, str(w.message)) for w in caught])
    out.append(ledger.state_dict())
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_lane_on_and_off_record_the_same(name, seed):
    # Promise (issue 26): bit for bit the same decisions, refusal messages, records,
    # listener events (listeners that raise included), spent curve, history, runs,
    # report, meter, odometer, warnings and state with the lane on and off, through
    # pickling round trips, events, label and mechanism switches and times=k.
    script = _script(seed)
    traces = []
    for lane in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            traces.append(_trace(CONFIGS[name], script, lane, mp))
    assert any(x[0] == "refused" for x in traces[0] if isinstance(x, tuple)) or \
        name == "odometer only"
    assert traces[0] == traces[1]


def test_the_lane_runs_in_the_differential():
    # The differential above compares something: the lane answers the streak (no decide()).
    ledger = _memory()
    ledger.charge(STEP, label="s")
    ledger.charge(STEP, label="s")  # the limit is searched here
    with mock.patch.object(Accounting, "decide", side_effect=AssertionError("ordinary")):
        for _ in range(50):
            ledger.charge(M.SubsampledGaussian(1.0, 0.01), label="s")  # equal, distinct
    assert len(ledger.runs) == 1 and len(ledger.history) == 52


def test_plan_deviation_warning_is_the_ordinary_paths(monkeypatch):
    # Promise: the hybrid filter's part A counts every step and warns once when it closes
    # (issue 25): through the lane (a streak of one mechanism) as without it.
    out = []
    for lane in (True, False):
        monkeypatch.setattr(Ledger, "repeat_lane", lane)
        monkeypatch.setattr(_ledger, "time", SimpleNamespace(time=lambda: 1.0))
        ledger = Ledger(3.0, 1e-5, orders=ORDERS, filter="hybrid", plan=Plan(STEP))
        flt = ledger._acc.filter
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trace = []
            for mechanism, reps in ((STEP, 50), (M.SubsampledGaussian(0.9, 0.01), 3),
                                    (STEP, 1200)):  # leaves the envelope: part A closes
                for _ in range(reps):
                    try:
                        trace.append(ledger.charge(mechanism))
                    except BudgetExhausted as exc:
                        trace.append(str(exc))
                    trace.append((flt.a_count, flt.a_alive))
        out.append((trace, ledger.spent.tobytes(),
                    [(w.category, str(w.message)) for w in caught]))
    assert out[0] == out[1]
    assert [c for c, _ in out[0][2]].count(PlanDeviationWarning) == 1
    assert any(isinstance(x, str) for x in out[0][0])  # refusals at the end included


@pytest.fixture
def fast_dir(tmp_path):
    """tmpfs when there is one (fsyncs cost nothing): for tests that take many leases."""
    import shutil
    import tempfile
    from pathlib import Path

    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    path = tempfile.mkdtemp(dir="/dev/shm", prefix="privguard-r26-")
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_leased_steps_through_the_lane_record_the_same(fast_dir, monkeypatch, name):
    # Promise: a file ledger's lane (a step of the lease) hands out exactly what the
    # ordinary path hands out, for every filter (hybrid part A counting and closing,
    # strict, odometer only): decisions, records, events, journal, spent curve, part A,
    # warnings and unused remainders, through pickling and label/mechanism switches.
    script = [op for op in _script(7) if op[0] in ("charge", "pickle")]
    traces = []
    for lane in (True, False):
        monkeypatch.setattr(Ledger, "repeat_lane", lane)
        monkeypatch.setattr(_ledger, "time", SimpleNamespace(time=lambda: 1.0))
        monkeypatch.setattr(os, "getpid", lambda: 4242)  # one pid for both files' records
        path = fast_dir / f"{name}-{lane}.db".replace(" ", "_")
        # journal indices compared exactly: prefetch off (with it, the lease boundaries
        # depend on when each background commit ran; review rpf: this failed at the pf head)
        ledger = Ledger(orders=ORDERS, path=path, prefetch=False, **CONFIGS[name])
        out: list = []
        variants = _variants()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for op in script:
                if op[0] == "pickle":
                    again = pickle.loads(pickle.dumps(ledger))
                    ledger.close()
                    ledger = again
                    continue
                _, i, label, times, reps = op
                for _ in range(reps):
                    try:
                        r = ledger.charge(variants[i], label=label, times=times)
                        out.append((r.index, r.label, r.mechanism, r.pid))
                    except BudgetExhausted as exc:
                        out.append(str(exc))
                flt = ledger._acc.filter
                out.append((ledger.spent.tobytes(), ledger.leased_unused,
                            getattr(flt, "a_count", None), getattr(flt, "a_alive", None)))
        out += [[(r.index, r.label, r.mechanism) for r in ledger.history],
                [{k: v for k, v in e.items() if k != "time"} for e in ledger.events],
                [(w.category.__name__, str(w.message)) for w in caught]]
        ledger.close()
        traces.append(out)
    assert any(isinstance(x, str) for x in traces[0]) or name == "odometer only"
    assert traces[0] == traces[1]


# ------------------------------------------------------------------- fail closed
def test_a_broken_or_held_memory_ledger_refuses_through_the_lane():
    ledger = _memory()
    for _ in range(10):
        ledger.charge(STEP)
    assert ledger._hold("a tuner")
    with pytest.raises(LedgerStateError, match="a tuner"):
        ledger.charge(STEP)
    ledger._unhold()
    ledger.charge(STEP)
    ledger._break("test")
    with pytest.raises(LedgerStateError, match="test"):
        ledger.charge(STEP)
    assert ledger._acc.journal.charges == 11


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_leased_step_through_the_lane_checks_the_file(tmp_path, how):
    # Promise: the file's identity is checked at every leased step (lane included):
    # deleted or replaced -> LedgerStateError, no step handed out, and the ledger stays
    # closed.
    path = tmp_path / "f.db"
    ledger = Ledger(3.0, 1e-5, path=path)
    for _ in range(40):
        ledger.charge(STEP)
    lease = ledger._lease
    assert lease is not None and lease.left > 1
    left = lease.left
    if how == "deleted":
        os.remove(path)
    else:
        other = tmp_path / "other.db"
        Ledger(3.0, 1e-5, path=other).close()
        os.replace(other, path)
    with pytest.raises(LedgerStateError):
        ledger.charge(STEP)
    assert lease.left == left  # nothing handed out
    with pytest.raises(LedgerStateError):
        ledger.charge(STEP)


def test_a_commit_under_a_leased_step_is_synced_and_verified(tmp_path, monkeypatch):
    # Promise (docs/reference.md "The ledger file", "What the file format detects"; rollback journal, where the header's
    # change counter moves at every commit): a file changed since the ledger's last
    # transaction is synced and verified before a leased step is released, through the
    # lane as on the ordinary path: another writer's charge is read in at that step, an
    # edited head -> LedgerStateError, nothing released.
    monkeypatch.setenv("PRIVGUARD_SQLITE_JOURNAL", "rollback")

    path = tmp_path / "e.db"
    ledger = Ledger(3.0, 1e-5, path=path)
    for _ in range(40):
        ledger.charge(STEP)
    lease = ledger._lease
    assert lease is not None and lease.left > 2
    charges = ledger._acc.journal.charges
    other = Ledger.open(path, lease=1)
    other.charge(M.Gaussian(50.0), label="other")
    other.close()
    assert ledger.charge(STEP).index == 40  # a leased step...
    assert ledger._acc.journal.charges == charges + 1  # ...after syncing the other's charge
    from _lease_edits import edit_head_and_expect_refusal

    edit_head_and_expect_refusal(ledger, path, STEP)


# ------------------------------------------------------------------- forks
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_run_in_memory():
    # Promise: a run is one process's; the lane compares the current run's pid, so a
    # forked child's charge starts a run of its own (as the ordinary path does).
    ledger = _memory()
    for _ in range(10):
        ledger.charge(STEP, label="s")
    pid = os.fork()
    if pid == 0:  # the child: report, never run pytest's teardown
        code = 5
        try:
            record = ledger.charge(STEP, label="s")
            runs = ledger.runs
            code = 0 if (record.pid == os.getpid() and len(runs) == 2
                         and runs[-1].pid == os.getpid() and runs[0].count == 10) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(ledger.runs) == 1 and len(ledger.history) == 10


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_an_unpickled_file_ledger_drops_its_lease_in_a_forked_child(tmp_path):
    # Promise (theory §13 Lemma 1; privguard/_accounting/_lease.py track): a lease lives in
    # one process: the at-fork hook drops every file ledger's lease in the child, since
    # comparing pids alone fails when a pid is reused. A ledger sent to a worker by pickle
    # (multiprocessing, Ray) is such a ledger.
    original = Ledger(3.0, 1e-5, path=tmp_path / "u.db")
    ledger = pickle.loads(pickle.dumps(original))
    for _ in range(40):
        ledger.charge(STEP)
    lease = ledger._lease
    assert lease is not None and lease.left > 0
    parent = os.getpid()
    pending = range(lease.next_index, lease.next_index + lease.left)  # the parent's to give
    pid = os.fork()
    if pid == 0:  # the child: report, never run pytest's teardown
        code = 5
        try:
            if ledger._lease is None:
                code = 0
            else:
                os.getpid = lambda: parent  # the pid the kernel may hand out again
                code = 3 if ledger.charge(STEP).index in pending else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    ledger.close()
    original.close()
    assert code == 0, {3: "the child released a step of its parent's lease",
                       4: "the child kept its parent's lease"}.get(code, code)


# ------------------------------------------------------------------- threads
def _hammer(ledger: Ledger, mechanism, threads: int, each: int) -> tuple[list, int]:
    records: list = []
    refused = [0]
    start = threading.Barrier(threads)

    def work():
        start.wait()
        for _ in range(each):
            try:
                records.append(ledger.charge(mechanism, label="t"))
            except BudgetExhausted:
                refused[0] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        pool = [threading.Thread(target=work) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return records, refused[0]


def test_threads_charging_in_memory_never_lose_or_double_count_a_step(monkeypatch):
    # Promise: the lane decides and applies under the ledger's lock: T threads charging
    # the same step are exactly T × n sequential charges (one run, unique indices, the
    # spent curve of one charge(times=T × n), bit for bit), and at the budget exactly
    # the steps a sequential ledger admits. The clock, read between the decision and the
    # journal's update, yields the GIL: without the lock another thread decides there.
    import time

    monkeypatch.setattr(_ledger, "time", SimpleNamespace(
        time=lambda: (time.sleep(1e-6), time.time())[1]))
    ledger = Ledger(delta=1e-5, orders=ORDERS)
    records, _ = _hammer(ledger, STEP, 8, 400)
    assert sorted(r.index for r in records) == list(range(3200))
    assert len(ledger.history) == 3200 and len(ledger.runs) == 1
    alone = Ledger(delta=1e-5, orders=ORDERS)
    alone.charge(STEP, label="t", times=3200)
    assert ledger.spent.tobytes() == alone.spent.tobytes()

    tight = BASE
    sequential = Ledger(1.0, 1e-5, orders=ORDERS)
    n = 0
    with pytest.raises(BudgetExhausted):
        while n < 10**4:
            sequential.charge(tight, label="t")
            n += 1
    ledger = Ledger(1.0, 1e-5, orders=ORDERS)
    records, refused = _hammer(ledger, tight, 8, n // 4)
    assert n > 100 and len(records) == n and refused == 8 * (n // 4) - n
    assert sorted(r.index for r in records) == list(range(n))
    assert ledger.spent.tobytes() == sequential.spent.tobytes()


def test_threads_charging_a_file_ledger_never_release_a_step_twice(tmp_path):
    # Promise: leased steps handed out through the lane by concurrent threads are each
    # released once (unique journal indices), all of them spent in the journal.
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "th.db")
    records, refused = _hammer(ledger, STEP, 6, 150)
    indices = [r.index for r in records]
    assert refused == 0 and len(set(indices)) == len(indices) == 900
    assert len(ledger.history) == 900 + ledger.leased_unused
    assert set(indices) <= set(range(len(ledger.history)))
    ledger.close()
