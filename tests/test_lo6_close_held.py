"""``Ledger.close()`` while a tuner holds the ledger (task lo6): refused, nothing changed.

A candidate that closed the ledger it captured (or another handle of its store opened
before the run) depending on its own score left a closed ledger, and a ``lease-unused``
event in its journal, after the run: about one bit about a candidate that may have lost.
"""

from __future__ import annotations

import threading

import pytest
from _tuning_holds import tuner as _tuner

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._accounting import _lease

STEP = M.SubsampledGaussian(1.0, 0.01)


def _unused(path) -> list:
    again = Ledger.open(path, read_only=True)
    try:
        return [e for e in again.events if e.get("event") == _lease.UNUSED]
    finally:
        again.close()


@pytest.mark.parametrize("which", ["captured", "opened before the run", "in memory"])
@pytest.mark.parametrize("where", ["candidate", "candidate's thread"])
def test_a_candidate_cannot_close_the_held_ledger(tmp_path, which, where):
    path = str(tmp_path / "budget.db")
    ledger = (Ledger(epsilon=50.0, delta=1e-5) if which == "in memory"
              else Ledger(epsilon=50.0, delta=1e-5, path=path, prefetch=False))
    if which != "in memory":
        for _ in range(3):  # a live lease: a close records its remainder
            ledger.charge(STEP, label="train")
    target = Ledger.open(path) if which == "opened before the run" else ledger
    refusals: list[str] = []

    def close_it() -> None:
        try:
            target.close()
        except LedgerStateError as exc:
            refusals.append(str(exc))

    def objective(params, child):
        if params["x"] == 2:  # depending on the candidate: its score, say
            if where == "candidate":
                close_it()
            else:
                thread = threading.Thread(target=close_it)
                thread.start()
                thread.join()
        return float(params["x"])

    _tuner().run(objective, ledger)
    assert refusals and all("refuses a close" in t and "held by a privguard tuner" in t
                            for t in refusals)
    spent = len(ledger.history)  # both open: the run left them as they were
    target.charge(M.Gaussian(100.0), label="after")
    assert len(ledger.history) == spent + 1
    if which != "in memory":
        assert _unused(path) == []  # no lease-unused event written by a candidate
        if target is not ledger:
            target.close()
    ledger.close()


def test_a_handle_opened_inside_the_candidate_closes_as_usual(tmp_path):
    # A candidate's own Ledger.open(path) (a training helper's `with`) is held, and closes:
    # nothing of it outlives the candidate.
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)
    closed: list[bool] = []

    def objective(params, child):
        with Ledger.open(path) as other:
            with pytest.raises(LedgerStateError, match="held by a privguard tuner"):
                other.epsilon()
        with pytest.raises(LedgerStateError, match="closed"):
            other.epsilon()
        closed.append(True)
        return 1.0

    assert _tuner().run(objective, ledger).selected
    assert closed
    assert [r.label for r in ledger.history] == ["tuning"]
    ledger.close()


def test_a_handle_opened_under_an_earlier_hold_cannot_close_under_a_later_one(tmp_path):
    # The exemption is the hold a handle was opened under, not any hold: one a candidate of
    # an earlier run kept (stored away) is an outside handle for the next run.
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)
    kept: list[Ledger] = []
    assert ledger._hold("first")
    kept.append(Ledger.open(path))
    ledger._unhold()
    assert ledger._hold("second")
    with pytest.raises(LedgerStateError, match="second"):
        kept[0].close()
    ledger._unhold()
    kept[0].close()
    with pytest.raises(LedgerStateError, match="closed"):
        kept[0].epsilon()
    ledger.close()
