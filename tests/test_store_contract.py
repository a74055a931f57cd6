"""One contract suite that every store passes (memory, SQLite, PostgreSQL as owner and as
a charging role).

A store keeps the journal as runs, replays it to exactly the spent curve the
writer had, refuses nothing it admitted and admits nothing it refused,
survives a reopen (or a state round trip in memory), and never lets a ledger
go backwards.
"""

from __future__ import annotations

import os
import uuid

import _pgserver
import numpy as np
import pytest
from opacus.accountants.analysis.rdp import compute_rdp

from privguard import DEFAULT_ORDERS, BudgetExhausted, Ledger, LedgerStateError, Plan
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)


class MemoryKind:
    name = "memory"

    def __init__(self, tmp_path):
        pass

    def make(self, *args, **kw):
        return Ledger(*args, **kw)

    def reopen(self, ledger):
        return Ledger.load_state_dict(ledger.state_dict())


class SQLiteKind:
    name = "sqlite"

    def __init__(self, tmp_path):
        self.dir, self.n = tmp_path, 0

    def make(self, *args, **kw):
        self.n += 1
        return Ledger(*args, path=self.dir / f"l{self.n}.db", **kw)

    def reopen(self, ledger):
        return Ledger.open(ledger.path)


class PostgresKind:
    """A ledger in PostgreSQL, created and charged by its owner."""

    name = "postgres"

    def __init__(self, tmp_path):
        self.db = _pgserver.initialised_database()
        self.srv = _pgserver.server()

    def make(self, *args, **kw):
        return Ledger(*args, path=self.srv.url(_pgserver.OWNER, self.db, _new_name()), **kw)

    def reopen(self, ledger):
        return Ledger.open(ledger.path)


class PostgresChargerKind(PostgresKind):
    """Created by the owner (as server-init does), then charged by the charging role."""

    name = "postgres-charger"

    def make(self, *args, **kw):
        name = _new_name()
        Ledger(*args, path=self.srv.url(_pgserver.OWNER, self.db, name), **kw).close()
        _pgserver.allow_charger(self.db, name)
        return Ledger(*args, path=self.srv.url(_pgserver.CHARGER, self.db, name), **kw)


def _new_name():
    return "c" + uuid.uuid4().hex[:12]


KINDS = {"memory": MemoryKind, "sqlite": SQLiteKind, "postgres": PostgresKind,
         "postgres-charger": PostgresChargerKind}


@pytest.fixture(params=list(KINDS), ids=list(KINDS))
def kind(request, tmp_path):
    if request.param.startswith("postgres"):
        request.getfixturevalue("pg_server")
    return KINDS[request.param](tmp_path)


def test_identical_consecutive_charges_form_one_run_and_replay_exactly(kind):
    ledger = kind.make(delta=1e-5, lease=1)  # one charge, one step (leases: below)
    for _ in range(500):
        ledger.charge(STEP, label="train")
    ledger.charge(M.Gaussian(10.0), label="eval")
    for _ in range(250):
        ledger.charge(STEP, label="train")
    runs = ledger.runs
    assert [(r.label, r.count, r.start) for r in runs] == [("train", 500, 0), ("eval", 1, 500),
                                                           ("train", 250, 501)]
    assert runs[0].pid == os.getpid() and runs[0].first_time <= runs[0].last_time
    again = kind.reopen(ledger)
    assert again.runs == runs
    np.testing.assert_array_equal(again.spent, ledger.spent)
    assert again.epsilon() == ledger.epsilon()


def test_t_identical_charges_equal_a_t_step_mechanism_bit_for_bit(kind):
    ledger = kind.make(delta=1e-5)
    for _ in range(1000):
        ledger.charge(STEP, label="a" if _ % 2 else "b")  # labels do not break exactness
    opacus = compute_rdp(q=0.01, noise_multiplier=1.0, steps=1000, orders=list(DEFAULT_ORDERS))
    expected = M.SubsampledGaussian(1.0, 0.01, steps=1000).rdp(DEFAULT_ORDERS)
    assert kind.reopen(ledger).spent.tolist() == expected.tolist()
    # Opacus' value except at fractional orders where its series is low and the curve is
    # raised (docs/theory.md §1.1; tests/test_mechanisms.py checks those against mpmath), and
    # T × one step rounded up, not to nearest (task sr, §6): at most an ulp above Opacus'
    integer = np.asarray(DEFAULT_ORDERS) == np.round(DEFAULT_ORDERS)
    opacus = np.asarray(opacus)
    assert np.all(expected[integer] <= np.nextafter(opacus[integer], np.inf))
    assert np.all(expected >= opacus) and np.all(expected <= opacus * (1 + 1e-7))


def test_leases_replay_exactly_and_never_under_count(kind):
    # Leases (docs/theory.md §13): on by default for file and server stores, off in
    # memory. The journal holds every released step plus the leased-but-unused ones.
    ledger = kind.make(3.0, 1e-5)
    records = [ledger.charge(STEP, label="train") for _ in range(100)]
    assert [r.index for r in records] == list(range(100))
    # one evaluation is charged beside the live lease (task sl, docs/theory.md §13); the
    # second in a row ends the lease: its remainder is recorded
    ledger.charge(M.Gaussian(30.0), label="eval")
    ledger.charge(M.Gaussian(30.0), label="eval")
    unused = ledger.leased_unused
    # the PostgreSQL charging role appends charges only: its remainders stay spent, unlogged
    logged = not isinstance(kind, (MemoryKind, PostgresChargerKind))
    assert (unused > 0) == logged
    spent = ledger.spent
    again = kind.reopen(ledger)
    assert again.leased_unused == unused
    assert len(again.history) == 102 + unused if logged else len(again.history) >= 102
    np.testing.assert_array_equal(again.spent, spent)
    released = Ledger(3.0, 1e-5)
    released.charge(STEP, times=100)
    released.charge(M.Gaussian(30.0), times=2)
    assert (spent >= released.spent).all()


def test_an_evaluation_beside_a_lease_keeps_it_and_replays_exactly(kind):
    # task sl: one charge of another label between identical steps leaves the lease live;
    # the steps after it come from the same lease, and the journal replays exactly
    ledger = kind.make(3.0, 1e-5)
    for _ in range(100):
        ledger.charge(STEP, label="train")
    before = len(ledger.history)
    ledger.charge(M.Gaussian(30.0), label="eval")
    assert len(ledger.history) == before + 1  # the evaluation alone, no lease, nothing ended
    for _ in range(5):
        ledger.charge(STEP, label="train")
    spent = ledger.spent
    again = kind.reopen(ledger)
    np.testing.assert_array_equal(again.spent, spent)  # the live lease's rows included
    released = Ledger(3.0, 1e-5)
    released.charge(STEP, times=105)
    released.charge(M.Gaussian(30.0))
    assert (spent >= released.spent * (1 - 1e-12)).all()  # Lemma 1, to rounding


def test_history_expands_runs_with_their_first_and_last_times(kind):
    ledger = kind.make(delta=1e-5, lease=1)
    records = [ledger.charge(STEP, label="s") for _ in range(5)]
    history = kind.reopen(ledger).history
    assert len(history) == 5 and [r.index for r in history] == list(range(5))
    assert history[0].time == records[0].time and history[-1].time == records[-1].time
    assert all(r.time is None for r in history[1:4])
    assert history[2:4] == list(history)[2:4] and history[-1] == history[4]


def test_refusals_record_nothing_and_survive_reopening(kind):
    ledger = kind.make(1.0, 1e-5, plan=Plan(STEP, steps=100))
    n = 0
    while True:
        try:
            ledger.charge(STEP)
            n += 1
        except BudgetExhausted:
            break
    spent = ledger.spent
    again = kind.reopen(ledger)
    assert len(again.history) == n and not again.can_afford(STEP)
    np.testing.assert_array_equal(again.spent, spent)
    assert again.plan == Plan(STEP, steps=100)


def test_the_plan_fixed_by_the_first_charge_is_kept(kind):
    ledger = kind.make(2.0, 1e-5)
    assert ledger.plan is None
    ledger.charge(STEP)
    ledger.charge(M.Gaussian(3.0))
    assert ledger.plan == Plan(STEP)
    again = kind.reopen(ledger)
    assert again.plan == Plan(STEP)
    np.testing.assert_array_equal(again._acc.filter.weights, ledger._acc.filter.weights)


def test_state_round_trip_and_forward_only_loading(kind):
    ledger = kind.make(3.0, 1e-5)
    early = Ledger.load_state_dict(ledger.state_dict()) if kind.name == "memory" else None
    for _ in range(30):
        ledger.charge(STEP, label="x")
    state = ledger.state_dict()
    copy = Ledger.load_state_dict(state)
    assert copy.runs == ledger.runs and copy.epsilon() == ledger.epsilon()
    assert ledger.load_state_dict(state) is ledger
    if early is not None:
        assert early.load_state_dict(state) is early  # forward: allowed
        with pytest.raises(LedgerStateError, match="backwards"):
            ledger.load_state_dict(Ledger(3.0, 1e-5).state_dict())
        ledger.charge(STEP, label="x")  # a state that does not fit leaves the ledger usable


def test_pickling_round_trips(kind):
    import pickle

    ledger = kind.make(3.0, 1e-5)
    for _ in range(7):
        ledger.charge(STEP)
    again = pickle.loads(pickle.dumps(ledger))
    assert again.runs == ledger.runs and again.epsilon() == ledger.epsilon()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "memory"], indirect=True)
def test_a_read_only_ledger_stays_read_only_once_pickled(kind):
    """A copy of a ledger opened read_only=True reopened the file for writing (review at)."""
    import pickle

    ledger = kind.make(3.0, 1e-5)
    ledger.charge(STEP)
    ledger.close()
    reader = Ledger.open(ledger.path, read_only=True)
    again = pickle.loads(pickle.dumps(reader))
    assert again.runs == reader.runs
    with pytest.raises(LedgerStateError, match="read"):
        again.charge(STEP)
    assert Ledger.open(ledger.path, read_only=True).runs == reader.runs  # nothing written


def test_a_closed_ledger_stays_closed_once_pickled(kind):
    """A closed file or server ledger unpickled open and writable (review lo2); a closed
    in-memory one refuses to pickle (its state is not readable once closed)."""
    import pickle

    ledger = kind.make(3.0, 1e-5)
    ledger.charge(STEP)
    ledger.close()
    if kind.name == "memory":
        with pytest.raises(LedgerStateError, match="closed"):
            pickle.dumps(ledger)
        return
    again = pickle.loads(pickle.dumps(ledger))
    assert again.target == ledger.target and again.path == ledger.path
    with pytest.raises(LedgerStateError, match="closed"):
        again.charge(STEP)
    with pytest.raises(LedgerStateError, match="closed"):
        again.history
    assert len(kind.reopen(ledger).history) == 1  # nothing written


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "memory"], indirect=True)
def test_a_write_that_fails_breaks_the_ledger_and_records_nothing(kind, monkeypatch):
    ledger = kind.make(3.0, 1e-5, lease=1)  # every charge writes
    for _ in range(3):
        ledger.charge(STEP, label="x")
    store = type(ledger._store)
    real = store._write

    def interrupted(*args, **kwargs):  # the rows are written, then the commit never comes
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ledger.charge(STEP, label="x")
    monkeypatch.undo()
    with pytest.raises(LedgerStateError, match="unusable"):
        ledger.charge(STEP, label="x")
    again = kind.reopen(ledger)
    assert [(r.label, r.count) for r in again.runs] == [("x", 3)]
    again.charge(STEP, label="x")  # another ledger: a row of its own (review rr)
    assert [(r.label, r.count) for r in kind.reopen(again).runs] == [("x", 3), ("x", 1)]


def test_every_store_is_asked_about_a_label_before_the_decision(kind, monkeypatch):
    """Review rlo7 (task lo7's accepts): every store's transaction answers ``accepts``,
    asked on the charging path before anything is decided; its refusal charges nothing and
    the ledger goes on, and a non-ASCII label the store keeps comes back whole."""
    from privguard import InvalidArgumentError
    from privguard._accounting._accounting import Accounting
    from privguard._stores import _memory, _postgres, _sqlite

    asked = []
    decide = Accounting.decide
    for txn in (_memory._NoTransaction, _sqlite._Txn, _postgres._Txn):
        real = txn.accepts

        def accepts(self, label, real=real):
            asked.append(label)
            real(self, label)
            if label == "refused":
                raise InvalidArgumentError("label", label, "cannot be kept here")

        monkeypatch.setattr(txn, "accepts", accepts)

    def deciding(self, mechanism, label, *args, **kwargs):
        assert asked and asked[-1] == label  # asked first
        return decide(self, mechanism, label, *args, **kwargs)

    monkeypatch.setattr(Accounting, "decide", deciding)
    ledger = kind.make(3.0, 1e-5, lease=1)
    ledger.charge(STEP, label="日本¦")
    spent = ledger.epsilon()
    with pytest.raises(InvalidArgumentError, match=r"^label="):
        ledger.charge(STEP, label="refused")
    assert ledger.epsilon() == spent and len(ledger.history) == 1
    ledger.charge(STEP, label="日本¦")
    assert asked == ["日本¦", "refused", "日本¦"]
    monkeypatch.undo()
    assert [(r.label, r.count) for r in kind.reopen(ledger).runs] == [("日本¦", 2)]
