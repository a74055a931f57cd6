"""The cost of a lease commit (issue 26, review lc): fewer statements, a cheaper meter cap,
and every decision the same, bit for bit.

The meter cap of a lease (``_lease.meter_room``) is compared with its code before lc,
frozen in ``tests/_old_meter_room.py``: directly, on filter states a varied charge sequence
reaches, and through whole runs of file ledgers (lease sizes, admissions, refusals, spent
curves, the journal). The SQLite store's per-transaction reads are one statement; the
checks they feed still fail closed.
"""

from __future__ import annotations

import random
import sqlite3

import numpy as np
import pytest
from _old_meter_room import old_meter_room, old_rdp_meter
from hypothesis import given, settings
from hypothesis import strategies as st

from privguard import BudgetExhausted, Ledger, LedgerStateError, Plan
from privguard import mechanisms as M
from privguard._accounting import _lease
from privguard._accounting._budget import rdp_meter

ENVELOPE = M.SubsampledGaussian(2.0, 0.2)
POOL = [M.SubsampledGaussian(2.0, 0.2), M.SubsampledGaussian(2.5, 0.1),
        M.SubsampledGaussian(1.5, 0.2), M.Gaussian(8.0), M.SubsampledGaussian(1.0, 0.01)]
FILTERS = {
    "rdp": dict(epsilon=8.0, delta=1e-5),
    "strict": dict(rdp_budget=M.SubsampledGaussian(1.0, 0.2, steps=400)),
    "hybrid": dict(epsilon=6.0, delta=1e-5, plan=Plan(ENVELOPE), filter="hybrid"),
}


def _ledger_at(name: str, charges: list[tuple[int, int]]) -> Ledger:
    """An in-memory ledger after ``charges`` ((pool index, times); refusals skipped)."""
    ledger = Ledger(**FILTERS[name])
    for i, times in charges:
        try:
            ledger.charge(POOL[i], times=times)
        except BudgetExhausted:
            pass
    return ledger


@pytest.mark.parametrize("name", list(FILTERS))
@settings(max_examples=60, deadline=None)
@given(charges=st.lists(st.tuples(st.integers(0, len(POOL) - 1), st.integers(1, 40)),
                        max_size=12),
       mech=st.integers(0, len(POOL) - 1), times=st.integers(1, 3),
       extra=st.integers(0, 3000), held=st.integers(0, 3))
def test_meter_room_is_the_old_bisection_bit_for_bit(name, charges, mech, times, extra, held):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a hybrid run leaving part A says so
        ledger = _ledger_at(name, charges)
    acc = ledger._acc
    flt, spent, curve = acc.filter, acc.spent() + held * acc.curve(POOL[mech]), \
        acc.curve(POOL[mech])
    n = times + extra
    assert _lease.meter_room(flt, spent, curve, times, n, held) == \
        old_meter_room(flt, spent, curve, times, n, held)
    dp = getattr(flt, "fallback", flt)
    if getattr(dp, "kind", None) == "dp" and dp.weights is not None:
        for m in (0, 1, times, n):
            assert rdp_meter(dp, spent + m * curve).hex() == \
                old_rdp_meter(dp, spent + m * curve).hex()


def test_rdp_meter_keeps_nan_and_empty_grids_as_before():
    ledger = _ledger_at("rdp", [(0, 5)])
    dp = ledger._acc.filter
    spent = ledger._acc.spent().copy()
    spent[1] = np.nan  # an order the meter skips
    assert rdp_meter(dp, spent).hex() == old_rdp_meter(dp, spent).hex()
    assert rdp_meter(dp, np.full_like(spent, np.nan)) == old_rdp_meter(
        dp, np.full_like(spent, np.nan)) == float("inf")


def _run(path, name: str, seed: int, cap: int) -> list:
    """A file ledger's whole run of a varied sequence: after each charge, admitted or
    refused, the lease held, the journal's length and the spent curve's bytes."""
    rng = random.Random(seed)
    ledger = Ledger(**FILTERS[name], path=path, lease=cap, prefetch=False)
    out: list = []
    refusals = 0
    while refusals < 6:
        mech = POOL[rng.choice([0, 0, 0, 1, 2, 3, 4])]
        label = rng.choice([None, None, "x"])
        for _ in range(rng.randint(1, 120)):
            times = rng.choice([1, 1, 1, 1, 2, 3])
            try:
                ledger.charge(mech, label=label, times=times)
                outcome = "ok"
            except BudgetExhausted:
                outcome, refusals = "refused", refusals + 1
            lease = ledger._lease
            out.append((outcome, None if lease is None else lease.left,
                         len(ledger.history), ledger.spent.tobytes()))
            if outcome == "refused":
                break
    out.append((ledger.leased_unused, [(r.mechanism, r.count) for r in ledger._store.runs()]))
    ledger.close()
    return out


@pytest.mark.parametrize("cap", [16, 1000])
@pytest.mark.parametrize("name", list(FILTERS))
@pytest.mark.parametrize("seed", range(2))
def test_file_runs_decide_as_with_the_old_meter_room(tmp_path, monkeypatch, name, seed, cap):
    """Same lease sizes, admissions, refusals, spent curves and journal, with the meter
    cap before lc and now; near the end of the budget (the runs go on to six refusals),
    mechanism and label changes, several steps at once, the three filters."""
    import warnings

    runs = []
    for meter_room in (old_meter_room, _lease.meter_room):
        monkeypatch.setattr(_lease, "meter_room", meter_room)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs.append(_run(tmp_path / f"{meter_room.__name__}.db", name, seed, cap))
    assert runs[0] == runs[1]
    assert any(o[0] == "refused" for o in runs[0][:-1])
    sizes = [o[1] for o in runs[0][:-1] if o[1]]
    assert sizes and max(sizes) > 1  # leases were taken


def _trace(ledger) -> list[str]:
    seen: list[str] = []
    ledger._store._conn.set_trace_callback(seen.append)
    return seen


def test_a_lease_commit_runs_five_statements_and_a_leased_step_none(tmp_path):
    """BEGIN, one read (file_id, head, last row), the run's row, the head, COMMIT (review
    lc: the file_id, the head and the last row were three reads, 7 statements a lease)."""
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "s.db", prefetch=False)
    for _ in range(40):  # a streak: its leases extend one run row
        ledger.charge(step)
    seen = _trace(ledger)
    while ledger._lease is not None and ledger._lease.left:
        ledger.charge(step)
    assert seen == []  # steps from memory
    ledger.charge(step)  # the next lease
    ledger._store._conn.set_trace_callback(None)
    # the one read's schema cookie (review sq) is read by SQLite's pragma table, which the
    # trace shows as a nested "-- PRAGMA ..." line of that same statement
    assert [s for s in seen if s.startswith("--")] == ["-- PRAGMA schema_version"]
    assert [s.split()[0] for s in seen if not s.startswith("--")] == [
        "BEGIN", "SELECT", "UPDATE", "UPDATE", "COMMIT"]
    ledger.close()


def _edited(tmp_path, sql: str, params: tuple = ()) -> Ledger:
    path = tmp_path / "e.db"
    ledger = Ledger(3.0, 1e-5, path=path, lease=1)
    for _ in range(3):
        ledger.charge(M.SubsampledGaussian(1.0, 0.01))
    ledger.charge(M.Gaussian(9.0))
    other = sqlite3.connect(path, isolation_level=None)
    other.execute(sql, params)
    other.close()
    return ledger


@pytest.mark.parametrize("sql,says", [
    ("UPDATE meta SET value = 'x' WHERE key = 'file_id'", "identity changed"),
    ("DELETE FROM meta WHERE key = 'file_id'", "identity changed"),
    ("DELETE FROM head", "head is missing"),
    ("UPDATE head SET mac = 'x'", "fails its digest"),
    ("INSERT INTO entries (idx, kind, body, digest) SELECT max(idx) + 1, 'event', '{}', 'x' "
     "FROM entries", "followed by rows"),
    ("UPDATE entries SET count = count + 1 WHERE idx = (SELECT max(idx) FROM entries)",
     "journal row"),
    ("DELETE FROM entries WHERE idx = (SELECT max(idx) FROM entries)", "journal row"),
])
def test_the_one_read_fails_closed_as_the_three_did(tmp_path, sql, says):
    ledger = _edited(tmp_path, sql)
    with pytest.raises(LedgerStateError, match=says):
        ledger.charge(M.Gaussian(9.0))
    with pytest.raises(LedgerStateError):  # and stays refused
        ledger.charge(M.Gaussian(9.0))


def test_the_one_read_refuses_a_second_row_at_the_last_index(tmp_path):
    """Review rlc: another process rebuilds ``entries`` without its primary key and
    duplicates the last row. The three reads' ``idx >= entries − 1`` returned both rows
    (refused); lc's one read, which compared ``max(idx)`` with that index, handed the
    last-row check one of them and the charge went on (both rows then extended)."""
    ledger = _edited(tmp_path, "SELECT 1")
    other = sqlite3.connect(tmp_path / "e.db", isolation_level=None)
    other.executescript(
        "BEGIN; CREATE TABLE e2 AS SELECT * FROM entries ORDER BY idx; DROP TABLE entries; "
        "ALTER TABLE e2 RENAME TO entries; INSERT INTO entries SELECT * FROM entries "
        "WHERE idx = (SELECT max(idx) FROM entries); COMMIT;")
    other.close()
    # (review sq: the rebuilt table's schema is refused first, before the rows are read)
    with pytest.raises(LedgerStateError, match=r"followed by rows|schema is not the one"):
        ledger.charge(M.Gaussian(9.0))
    with pytest.raises(LedgerStateError):
        ledger.charge(M.Gaussian(9.0))
