"""A state written before e08c1f5 (step 3b's fractional tolerance 1e-4 -> RDP_RTOL) whose fix
entry does not match today's derivation loads (review rw; was a fail-closed upgrade
regression, a strict xfail until the fx change).

``revised_up_only`` lets recorded curves lie up to 1e-4 below today's, and the fix entry's
choices (Concentrated's order, from budget/plan-curve ratios) are compared with what the
library derives from the plan (``_stores._rows.check_fix``, 1e-9): today's curves, or the
pre-e08c1f5 ones (``_curves._legacy``; docs/theory.md §1.1, "Fix entries derived before the
revision"). Where two orders' ratios are within the revision, 62cc4c8 put δ's 0.9 share on
another order than today's code. At σ = 0.7, q = 3e-5, ε = 4.181813076392221, δ = 1e-5:
order 5.9 then, 6.0 now. Reproduced here by running today's code with 62cc4c8's tolerance
(``FRACTIONAL_RTOL = 1e-4``, the only difference in the curve); checked against a state
written by 62cc4c8 itself (same ``fixed`` and ``spent``).
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import threading

import _pgserver
import numpy as np
import pytest

from privguard import Ledger, LedgerStateError
from privguard._curves import _legacy, _sgm
from privguard._curves._upward import times_up
from privguard._mechanisms._base import _cached_curve
from privguard._stores import _state
from privguard._stores._integrity import Integrity, canonical
from privguard.mechanisms import SubsampledGaussian

EPSILON, DELTA = 4.181813076392221, 1e-5
STEP = SubsampledGaussian(noise_multiplier=0.7, sample_rate=3e-5)


def _state_with(monkeypatch, tolerance, path=None):
    """A ledger's state derived with step 3b's ``tolerance``; 1e-4 is the derivation of
    before e08c1f5, computed inside ``_legacy.pre_revision()`` (task sgr: outside it today's
    curve is never below the rule of before task sg, so the patched constant alone no
    longer gives the older curve)."""
    monkeypatch.setattr(_sgm, "FRACTIONAL_RTOL", tolerance)
    _cached_curve.cache_clear()
    older = tolerance == _legacy.LEGACY_FRACTIONAL_RTOL
    try:
        with _legacy.pre_revision() if older else contextlib.nullcontext():
            ledger = Ledger(epsilon=EPSILON, delta=DELTA, path=path)
            ledger.charge(STEP, "x", times=100)
            state = ledger.state_dict()
            if path is not None:
                ledger.close()
        return state
    finally:
        monkeypatch.undo()
        _cached_curve.cache_clear()


def _rechecksummed(state):
    body = {k: v for k, v in state.items() if k != "checksum"}
    return {**body, "checksum": Integrity.from_environment().digest("state", body)}


def _today(grid):
    return np.array(_cached_curve(STEP, np.asarray(grid, dtype=np.float64).tobytes()))


def test_the_fix_entries_differ(monkeypatch):
    old, new = _state_with(monkeypatch, 1e-4), _state_with(monkeypatch, _sgm.RELIABLE_RTOL)
    assert old["fixed"]["filter"]["weights"] != new["fixed"]["filter"]["weights"]


def test_state_from_before_the_fractional_revision_loads(monkeypatch):
    state = _state_with(monkeypatch, 1e-4)
    ledger = Ledger.load_state_dict(state)
    assert ledger._acc.fixed == state["fixed"]  # the older derivation, kept for life
    ledger.charge(STEP, "y")
    # charged with today's curve: the ledger's own cache never held the older one
    assert np.array_equal(ledger._acc.spent(), times_up(101, _today(ledger.orders)))  # §6


def test_the_older_curve_is_only_used_inside_a_load(monkeypatch):
    old, new = _state_with(monkeypatch, 1e-4), _state_with(monkeypatch, _sgm.RELIABLE_RTOL)
    grid = Ledger(epsilon=EPSILON, delta=DELTA).orders
    today = STEP.rdp(grid)
    with _legacy.pre_revision():
        older = STEP.rdp(grid)
    assert not np.array_equal(older, today)  # the revision moves this curve
    Ledger.load_state_dict(old)
    assert np.array_equal(STEP.rdp(grid), today)
    assert np.array_equal(_today(grid), today)
    fresh = Ledger(epsilon=EPSILON, delta=DELTA)  # a ledger created now: today's entry
    fresh.charge(STEP, "x", times=100)
    assert fresh.state_dict()["fixed"] == new["fixed"] != old["fixed"]


def test_another_thread_gets_todays_curve_during_a_load(monkeypatch):
    """A thread that computes the curve while a load derives with the older one (made
    deterministic: the load's own curve computation starts the thread and waits for it)."""
    old = _state_with(monkeypatch, 1e-4)
    grid = Ledger(epsilon=EPSILON, delta=DELTA).orders
    today = STEP.rdp(grid)
    seen, original = [], _sgm.curve

    def curve(q, sigma, orders):
        if _legacy.active() and not seen:
            _cached_curve.cache_clear()  # the thread computes, not reads, the curve
            worker = threading.Thread(target=lambda: seen.append(
                (_legacy.active(), SubsampledGaussian(0.7, 3e-5).rdp(grid))))
            worker.start()
            worker.join()
        return original(q, sigma, orders)

    monkeypatch.setattr(_sgm, "curve", curve)
    Ledger.load_state_dict(old)
    assert seen and seen[0][0] is False
    assert np.array_equal(seen[0][1], today)
    assert np.array_equal(_today(grid), today)


def test_a_reloaded_ledger_keeps_its_older_entry(monkeypatch):
    """Its state_dict, pickle and re-saved state load again (the entry is fixed for life)."""
    ledger = Ledger.load_state_dict(_state_with(monkeypatch, 1e-4))
    ledger.charge(STEP, "y")
    again = Ledger.load_state_dict(ledger.state_dict())
    assert again._acc.fixed == ledger._acc.fixed
    assert pickle.loads(pickle.dumps(ledger))._acc.fixed == ledger._acc.fixed


def _opens_and_charges_today(monkeypatch, path):
    """Write a ledger at ``path`` with the older derivation, open it: it keeps its older
    entry and charges today's curve. Returns the older state."""
    old = _state_with(monkeypatch, 1e-4, path=path)
    ledger = Ledger.open(path)
    assert ledger._acc.fixed == old["fixed"]
    ledger.charge(STEP, "y")
    assert np.array_equal(ledger._acc.spent(), times_up(101, _today(ledger.orders)))  # §6
    ledger.close()
    return old


def test_a_sqlite_file_from_before_the_revision_opens(monkeypatch, tmp_path):
    path = str(tmp_path / "old.db")
    old = _opens_and_charges_today(monkeypatch, path)
    reopened = Ledger.open(path)
    assert reopened._acc.fixed == old["fixed"]
    assert reopened._store.verify()["charges"] == 101
    reopened.close()


def test_an_entry_matching_neither_derivation_is_refused(monkeypatch):
    """The older entry loads; the same entry with δ's share moved to a third order does not
    (today's check names the field)."""
    state = _state_with(monkeypatch, 1e-4)
    Ledger.load_state_dict(state)
    weights = state["fixed"]["filter"]["weights"]
    new = _state_with(monkeypatch, _sgm.RELIABLE_RTOL)["fixed"]["filter"]["weights"]
    top, today_top = int(np.argmax(weights)), int(np.argmax(new))
    third = next(i for i in range(len(weights)) if i not in (top, today_top))
    moved = list(weights)
    moved[top], moved[third] = moved[third], moved[top]
    fixed = {**state["fixed"], "filter": {**state["fixed"]["filter"], "weights": moved}}
    forged = {**state, "fixed": fixed,
              "journal": [["fix", fixed] if e[0] == "fix" else e for e in state["journal"]]}
    with pytest.raises(LedgerStateError, match=r"filter\.weights differs: a forged or foreign"):
        _state.load(_rechecksummed(forged))


def test_a_postgresql_ledger_from_before_the_revision_opens(monkeypatch, pg):
    srv, db, name = pg
    _opens_and_charges_today(monkeypatch, srv.url(_pgserver.OWNER, db, name))


def _v1(state, weights):
    """A privguard 0.1 state (format version 1) of one charge of STEP with these weights."""
    body = {"format": "privguard.Ledger", "version": 1, "config": {
        "orders": state["config"]["orders"], "delta": DELTA, "odometer": "tight", "plan": None,
        "filter": {"kind": "dp", "epsilon": EPSILON, "delta": DELTA,
                   "shares": {"type": "Concentrated", "params": {"share": 0.9, "order": None}}}},
        "records": [{"label": "a", "mechanism": STEP.to_dict(), "time": 1.0, "pid": 1}],
        "filter_state": {"weights": weights},
        "spent": _today(state["config"]["orders"]).tolist()}
    body["checksum"] = hashlib.sha256(canonical(body)).hexdigest()  # 0.1's checksum
    return body


def test_a_version_1_state_with_the_older_weights_loads(monkeypatch):
    old = _state_with(monkeypatch, 1e-4)["fixed"]["filter"]["weights"]
    ledger = Ledger.load_state_dict(_v1(Ledger(epsilon=EPSILON, delta=DELTA).state_dict(), old))
    assert ledger._acc.fixed["filter"]["weights"] == old
    moved = old[1:] + old[:1]  # a third order: refused as before
    with pytest.raises(LedgerStateError, match="version-1 state's filter weights"):
        Ledger.load_state_dict(_v1(Ledger(epsilon=EPSILON, delta=DELTA).state_dict(), moved))
