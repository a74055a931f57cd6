"""Task wr2: two ``attach(..., witnesses=True)`` on one ledger (docs/theory.md §16.2).

Each witnessed attach charges a :class:`~privguard.mechanisms.DeltaReserve` of r·δ and, before
wr2, sized its witnesses' false-alarm total a ≤ r·δ/(1+e^ε) on its own: with two on one
ledger the charged run is (ε, (1−r)²δ)-DP and the alarms add (1+e^ε)(a₁+a₂) ≈ 2rδ, in all
δ(1 + r²) > δ. The k-th attach now sizes a_k ≤ r·δ·Π_{j<k}(1−r_j)/(1+e^ε), counting the
reserves in the journal and those sized by earlier attaches of the process (Proposition 16.4b).
Each test that sums the δ failed on fin25.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("opacus")

from test_witnesses import DELTA, EPSILON, pipeline, run

from privguard import Ledger, LedgerStateError
from privguard.integrations._witnesses import STATISTICAL, reserve_for
from privguard.integrations.opacus import attach
from privguard.mechanisms import DeltaReserve


def _total_delta(ledger: Ledger, handles: list) -> float:
    """Propositions 16.4 and 16.1 from the sized values: Π(1 − r_j)·δ for the run as charged
    (every reserve in the journal), plus (1+e^ε)·Σ_k a_k for the alarms of every handle."""
    shares = [run.mechanism.share for run in ledger._acc.journal.runs()
              for _ in range(run.count) if isinstance(run.mechanism, DeltaReserve)]
    assert len(shares) == len(handles)  # each witnessed attach charged its own reserve
    kept = math.prod(1.0 - r for r in shares)
    alarms = sum(STATISTICAL * h.witnesses.false_alarm for h in handles)
    return kept * DELTA + (1.0 + math.exp(EPSILON)) * alarms


def test_two_witnessed_trainings_on_one_ledger_add_to_at_most_delta():
    ledger = Ledger(epsilon=EPSILON, delta=DELTA)
    first = pipeline(seed=0)
    h1 = attach(first[1], ledger, data_loader=first[2], witnesses=True)
    run(*first, 2)
    second = pipeline(seed=1)
    h2 = attach(second[1], ledger, data_loader=second[2], witnesses=True)
    run(*second, 2)
    assert _total_delta(ledger, [h1, h2]) <= DELTA
    assert h2.witnesses.false_alarm < h1.witnesses.false_alarm


def test_two_attaches_before_either_step_add_to_at_most_delta():
    """The first attach's reserve is not in the journal yet when the second is sized."""
    ledger = Ledger(epsilon=EPSILON, delta=DELTA)
    first, second = pipeline(seed=0), pipeline(seed=1)
    h1 = attach(first[1], ledger, data_loader=first[2], witnesses=True)
    h2 = attach(second[1], ledger, data_loader=second[2], witnesses=True)
    run(*second, 1)  # the later attach charges its reserve first
    run(*first, 1)
    assert _total_delta(ledger, [h1, h2]) <= DELTA


def test_a_reopened_file_attached_again_adds_to_at_most_delta(tmp_path):
    path = str(tmp_path / "w.db")
    ledger = Ledger(epsilon=EPSILON, delta=DELTA, path=path)
    first = pipeline(seed=0)
    h1 = attach(first[1], ledger, data_loader=first[2], witnesses=True)
    run(*first, 2)
    h1.detach()
    ledger.close()
    ledger = Ledger(epsilon=EPSILON, delta=DELTA, path=path)
    second = pipeline(seed=1)
    h2 = attach(second[1], ledger, data_loader=second[2], witnesses=True)
    run(*second, 2)
    assert _total_delta(ledger, [h1, h2]) <= DELTA
    ledger.close()


@pytest.mark.parametrize("charged", [1, 2, 5])
def test_the_kth_reserve_sizes_its_alarms_at_its_share_of_what_is_left(charged):
    ledger = Ledger(epsilon=EPSILON, delta=DELTA)
    alpha, reserve = reserve_for(ledger)
    for _ in range(charged):
        ledger.charge(reserve, label="witnesses: δ set aside for false alarms")
    kth, _ = reserve_for(ledger)
    left = (1.0 - reserve.share) ** charged
    assert (1.0 + math.exp(EPSILON)) * STATISTICAL * kth <= reserve.share * DELTA * left
    assert kth < alpha


def test_an_unreadable_journal_refuses_the_attach(monkeypatch):
    """Fail closed: the reserves already set aside are unknown; nothing attached, and the
    ledger, whose journal failed inside its own read, refuses what follows (as any read)."""
    ledger = Ledger(epsilon=EPSILON, delta=DELTA)
    _model, opt, loader, _crit = pipeline()

    def unreadable():
        raise LedgerStateError("the journal holds 0 runs before its checkpoint, which says 3")

    monkeypatch.setattr(ledger._acc.journal, "runs", unreadable)
    with pytest.raises(LedgerStateError, match="cannot be read"):
        attach(opt, ledger, data_loader=loader, witnesses=True)
    assert "clip_and_accumulate" not in vars(opt)
    with pytest.raises(LedgerStateError):
        ledger.charge(DeltaReserve(share=1e-3, min_order=float(ledger.orders[0])))


def test_a_reserve_charged_while_the_journal_is_read_is_still_counted():
    """Review of task wr2: another thread's first step can charge its reserve while a second
    attach reads the journal. Read before that charge, the journal misses it; scanned after,
    the uncharged handles miss it too, and the second attach sized as first. The uncharged
    reserves are now read before the journal (a reserve charged in between counts twice)."""
    ledger = Ledger(epsilon=EPSILON, delta=DELTA)
    first = pipeline(seed=2)
    h1 = attach(first[1], ledger, data_loader=first[2], witnesses=True)
    read, calls = ledger._acc.journal.runs, []

    def runs_then_charge():  # what the other thread's first step does at this moment
        runs = read()
        calls.append(1)
        if len(calls) == 2 and h1.witness_reserve is not None:  # attach's sizing read (the
            h1._charge_reserve()  # first is its early check that the ledger has a target)
        return runs

    ledger._acc.journal.runs = runs_then_charge
    try:
        second = pipeline(seed=3)
        h2 = attach(second[1], ledger, data_loader=second[2], witnesses=True)
    finally:
        del ledger._acc.journal.runs
    assert len(calls) == 2 and h1.witness_reserve is None  # charged during the sizing read
    assert h2.witnesses.false_alarm < h1.witnesses.false_alarm
    run(*second, 1)
    assert _total_delta(ledger, [h1, h2]) <= DELTA
