"""The background prefetch of a streak's next lease (``Ledger(prefetch=...)``, issue 26;
docs/theory.md §13 "Prefetch"): same decisions as without it, the bound of Proposition 2
unchanged, errors surfaced (fail closed), close / mechanism change / fork while a
prefetch is in flight."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from privguard import BudgetExhausted, InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._accounting import _lease
from privguard._ledger import _prefetch

STEP = M.SubsampledGaussian(1.0, 0.01)
OTHER = M.SubsampledGaussian(1.1, 0.01)


@pytest.fixture
def started(monkeypatch):
    """Counts the prefetches started (real background threads)."""
    count = []
    real = _prefetch.Prefetch.start

    def spy(self, lock, body):
        count.append(self)
        real(self, lock, body)

    monkeypatch.setattr(_prefetch.Prefetch, "start", spy)
    return count


@pytest.fixture
def deferred(monkeypatch):
    """Prefetches that start no thread: the test runs each one (in its own thread, so the
    ledger's lock is taken as the background thread takes it) when it chooses."""
    kept = []

    def keep(self, lock, body):
        kept.append((self, lock, body))

    monkeypatch.setattr(_prefetch.Prefetch, "start", keep)

    def run_next():
        pending, lock, body = kept.pop(0)
        t = threading.Thread(target=pending.run, args=(lock, body))
        t.start()
        t.join()
        return pending

    return kept, run_next


@pytest.fixture
def gate(monkeypatch):
    """Real prefetch threads that stop inside their transaction (the ledger's lock held)
    until ``go`` is set: a prefetch that is in flight, deterministically."""
    entered, go = threading.Event(), threading.Event()
    real = Ledger._prefetch_commit

    def held(self, pending):
        entered.set()
        assert go.wait(30)
        return real(self, pending)

    monkeypatch.setattr(Ledger, "_prefetch_commit", held)
    return entered, go


def _wait(ledger):
    pending = ledger._pending
    if pending is not None:
        assert pending.done.wait(30)


def _until_refused(ledger, mechanism, limit=100_000):
    for i in range(limit):
        try:
            ledger.charge(mechanism)
        except BudgetExhausted:
            return i
    raise AssertionError("never refused")


def test_bad_prefetch_is_refused_naming_it(tmp_path):
    with pytest.raises(InvalidArgumentError, match="prefetch"):
        Ledger(3.0, 1e-5, path=tmp_path / "b.db", prefetch="yes")
    Ledger(3.0, 1e-5, path=tmp_path / "b.db").close()
    with pytest.raises(InvalidArgumentError, match="prefetch"):
        Ledger.open(tmp_path / "b.db", prefetch=1)


def test_same_decisions_and_released_steps_as_without_prefetch(tmp_path, started):
    # One streak charged until refused: the same released steps and the refusal at the
    # same step with and without prefetch, and as lease=1 in memory (leases shrink to what
    # the filter admits; only their boundaries differ). The prefetch ran (it is not off).
    # With a mechanism change the remainders abandoned differ (both within the bound of
    # docs/theory.md §13), so the refusal may come at another step: not compared there.
    counts = {}
    for name, kw in (("off", {"prefetch": False}), ("on", {"prefetch": True}), ("mem", None)):
        ledger = Ledger(2.0, 1e-5) if kw is None else \
            Ledger(2.0, 1e-5, path=tmp_path / f"{name}.db", **kw)
        before = len(started)
        refused_at = _until_refused(ledger, STEP)
        with pytest.raises(BudgetExhausted):  # and again: a refusal charges nothing
            ledger.charge(STEP)
        if name == "off":
            assert len(started) == before  # prefetch=False starts nothing
        if name == "on":
            assert len(started) > before + 5
        if kw is not None:
            _wait(ledger)
            released = len(ledger.history) - ledger.leased_unused
            spent = ledger.spent
            ledger.close()
            reopened = Ledger.open(tmp_path / f"{name}.db")
            assert len(reopened.history) - reopened.leased_unused == released
            assert (reopened.spent == spent).all()
            reopened.close()
        else:
            released, spent = len(ledger.history), ledger.spent
        counts[name] = (refused_at, released, spent.tolist())
    assert counts["on"] == counts["off"] == counts["mem"]


def test_remainder_plus_prefetched_lease_stays_under_the_bound(tmp_path, started):
    # Proposition 2 unchanged: what the streak holds leased and unused (the current
    # remainder plus the prefetched lease) is always fewer than bound(C, r).
    ledger = Ledger(5.0, 1e-5, path=tmp_path / "b.db", prefetch=True)
    for _ in range(1500):
        ledger.charge(STEP)
        _wait(ledger)
        lease = ledger._lease
        held = ledger.leased_unused
        assert held < _lease.bound(_lease.DEFAULT_CAP, lease.streak)
    assert len(started) > 20
    ledger.close()


def test_a_refused_prefetch_falls_back_to_the_synchronous_path(tmp_path, deferred):
    kept, run_next = deferred
    path = tmp_path / "r.db"
    ledger = Ledger(1.5, 1e-5, path=path, prefetch=True)
    while not kept:
        ledger.charge(STEP)
    left = ledger._lease.left
    other = Ledger.open(path, lease=1)  # another process spends what is left
    _until_refused(other, STEP)
    spent = len(other.history)
    pending = run_next()
    assert pending.lease is None and pending.error is None  # refused: nothing committed
    for _ in range(left):  # the current lease's steps were spent before: handed out
        ledger.charge(STEP)
    with pytest.raises(BudgetExhausted):  # today's path refuses, as lease=1 would
        ledger.charge(STEP)
    assert len(Ledger.open(path, lease=1).history) == spent  # the prefetch wrote nothing


@pytest.mark.parametrize("error", [LedgerStateError("injected"), RuntimeError("injected")])
def test_a_failed_prefetch_surfaces_and_releases_nothing(tmp_path, deferred, monkeypatch,
                                                         error):
    kept, run_next = deferred
    path = tmp_path / "e.db"
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=True)
    while not kept:
        ledger.charge(STEP)
    charges = ledger._acc.journal.charges  # (a read would settle the prefetch)
    left = ledger._lease.left

    def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(Ledger, "_grown", boom)
    pending = run_next()
    assert pending.error is error and pending.lease is None
    monkeypatch.undo()
    if isinstance(error, LedgerStateError):  # broke the ledger: the next step refuses
        with pytest.raises(LedgerStateError, match="injected"):
            ledger.charge(STEP)
    else:  # the current lease's steps first, then the step that needs the prefetch
        for _ in range(left):
            ledger.charge(STEP)
        with pytest.raises(LedgerStateError, match="RuntimeError: injected"):
            ledger.charge(STEP)
    with pytest.raises(LedgerStateError):  # fail closed from now on
        ledger.charge(STEP)
    assert len(Ledger.open(path, lease=1).history) == charges  # nothing of the prefetch


def _in_flight(path, gate, delay=None):
    """A file ledger charged until a prefetch starts and holds the lock (the gate), which
    opens after ``delay`` seconds if given: (ledger, steps released, go)."""
    entered, go = gate
    ledger = Ledger(3.0, 1e-5, path=path, prefetch=True)
    released = _until_in_flight(ledger, entered)
    if delay is not None:
        threading.Timer(delay, go.set).start()
    return ledger, released, go


def _until_in_flight(ledger, entered):
    released = 0
    while ledger._pending is None:
        ledger.charge(STEP)
        released += 1
    assert entered.wait(30)
    return released


def _journal_balances(path, released):
    """Every spent step is released or recorded unused (a normal close)."""
    reopened = Ledger.open(path, lease=1)
    assert len(reopened.history) == released + reopened.leased_unused
    events = [e for e in reopened.events if e["event"] == _lease.UNUSED]
    reopened.close()
    return events


def test_close_while_a_prefetch_is_in_flight(tmp_path, gate):
    path = tmp_path / "c.db"
    ledger, released, go = _in_flight(path, gate)
    closer = threading.Thread(target=ledger.close)
    closer.start()  # waits for the commit in flight (the lock)
    threading.Timer(0.05, go.set).start()
    closer.join(30)
    assert not closer.is_alive()
    events = _journal_balances(path, released)
    assert len(events) == 2 and {e["reason"] for e in events} == {"close"}  # both leases


def test_mechanism_change_while_a_prefetch_is_in_flight(tmp_path, gate):
    path = tmp_path / "m.db"
    ledger, released, _ = _in_flight(path, gate, 0.05)
    ledger.charge(OTHER)  # waits for the prefetch; its lease is recorded unused
    released += 1
    events = [e for e in ledger.events if e["event"] == _lease.UNUSED]
    assert [e["reason"] for e in events] == ["mechanism change", "mechanism change"]
    assert sum(e["steps"] for e in events) > 0
    ledger.close()
    _journal_balances(path, released)


def test_fork_while_a_prefetch_is_in_flight(tmp_path, gate):
    path = tmp_path / "f.db"
    ledger, released, _ = _in_flight(path, gate, 0.1)
    pid = os.fork()  # waits for the commit in flight (at-fork hook)
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            signal.alarm(30)
            # the parent's lease and prefetched lease are not the child's
            if ledger._lease is None and ledger._next is None and ledger._pending is None:
                before = len(ledger.history)
                ledger.charge(STEP)  # its own lease, through the journal
                code = 0 if len(ledger.history) > before else 3
            else:
                code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for _ in range(40):  # the parent goes on from its lease, then its prefetched one
        ledger.charge(STEP)
        released += 1
    ledger.close()
    reopened = Ledger.open(path, lease=1)
    child = sum(r.count for r in reopened.runs if r.pid == pid)
    mine = sum(r.count for r in reopened.runs if r.pid == os.getpid())
    unused = sum(e["steps"] for e in reopened.events
                 if e["event"] == _lease.UNUSED and e["pid"] == os.getpid())
    assert child >= 1 and mine == released + unused


def test_a_prefetched_lease_keeps_the_tenth_rule(tmp_path, deferred):
    # docs/reference.md "Leases", "Sizes": a lease costs at most 10% of the budget left when it is taken, and
    # (Proposition 2) the remainder it follows plus itself at most 10% of what was left
    # without that remainder. Strict budget of 400 steps: every count is in steps.
    import numpy as np

    from privguard._curves._upward import times_up

    kept, run_next = deferred
    orders = [2.0, 4.0, 8.0, 16.0, 32.0]
    curve = np.asarray(STEP.rdp(orders))
    budget = times_up(400, curve)  # 400 steps as a ledger sums them (rounded up: §6)
    ledger = Ledger(orders=orders, rdp_budget=budget, path=tmp_path / "s.db", prefetch=True)
    sizes = []
    with pytest.raises(BudgetExhausted):
        for _ in range(500):
            ledger.charge(STEP)
            while kept:
                spent = ledger._acc.journal.charges  # (a read would settle it)
                held = kept[0][0].left
                pending = run_next()
                if pending.lease is not None:
                    n = pending.lease.left
                    sizes.append(n)
                    assert n <= 0.1 * (400 - spent) + 1e-9, (n, spent)
                    assert held + n <= 0.1 * (400 - spent + held) + 1e-9, (held, n, spent)
    assert len(sizes) > 5 and len(ledger.history) == 400


def _dp_optimizer():
    torch = pytest.importorskip("torch")
    pytest.importorskip("opacus")
    from opacus.optimizers import DPOptimizer

    model = torch.nn.Linear(3, 1)
    return DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                       max_grad_norm=1.0, expected_batch_size=8)


@pytest.mark.parametrize("prefetch,on", [(None, True), (True, True), (False, False)])
def test_prefetch_is_on_for_a_training_hook_and_off_for_direct_charges_by_default(
        tmp_path, prefetch, on):
    # The default (None) prefetches only once attach charges the ledger: a loop of direct
    # charges has nothing for the commit to overlap (benchmarks/quickstart_cost.py), and
    # prefetch there only adds commits and lock waits. An explicit choice is kept.
    from privguard.integrations.opacus import attach

    ledger = Ledger(3.0, 1e-5, path=tmp_path / "a.db", prefetch=prefetch)
    assert ledger._prefetch is (prefetch is True)
    handle = attach(_dp_optimizer(), ledger, sample_rate=0.01)
    assert ledger._prefetch is on
    handle.detach()
    ledger.close()
    memory = Ledger(3.0, 1e-5, prefetch=prefetch)  # in memory: no leases, nothing to prefetch
    handle = attach(_dp_optimizer(), memory, sample_rate=0.01)
    assert memory._prefetch is False
    handle.detach()
