"""A charge of another label made beside a live lease leaves the lease live (task sl).

docs/theory.md §13, "Charges beside a lease": a training loop that charges one noisy
evaluation (another label) between runs of identical steps used to end the training
lease at every evaluation, leaving its remainder spent and unused and starting the
streak's leases afresh. The evaluation is now charged alone (exactly its steps, in its
own durable transaction, on the journal's spent curve, which holds the whole lease),
and the lease goes on; the same charge twice in a row starts its own streak as before.
"""

from __future__ import annotations

import numpy as np
import pytest

from privguard import BudgetExhausted, InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)
EVAL = M.Gaussian(40.0)


def _unused_events(ledger):
    return [e for e in ledger.events if e.get("event") == "lease-unused"]


def _leased(path, epsilon=8.0):
    """A file ledger 40 training steps in, with its live lease."""
    ledger = Ledger(epsilon, 1e-5, path=path, prefetch=False)
    for _ in range(40):
        ledger.charge(STEP, label="train")
    assert ledger._lease is not None and ledger._lease.left > 0
    return ledger, ledger._lease


def _train_and_evaluate(path, epochs, steps=18, prefetch=False):
    ledger = Ledger(8.0, 1e-5, path=path, prefetch=prefetch)
    for _ in range(epochs):
        for _ in range(steps):
            ledger.charge(STEP, label="train")
        ledger.charge(EVAL, label="eval")
    return ledger


def test_an_evaluation_between_training_steps_leaves_the_lease_live(tmp_path):
    ledger, lease = _leased(tmp_path / "a.db")
    left = lease.left
    ledger.charge(EVAL, label="eval")
    assert ledger._lease is lease and lease.left == left  # live, untouched
    assert _unused_events(ledger) == []
    ledger.charge(STEP, label="train")  # from the same lease: no new admission
    assert ledger._lease is lease and lease.left == left - 1
    ledger.close()


def test_the_demo_pattern_leaves_one_remainder_not_one_an_epoch(tmp_path):
    # 18 training steps, then one evaluation, ten times: on the code before task sl every
    # evaluation ended the lease (ten lease-unused events, 30+ steps unused); now at most
    # the last lease's remainder is unused, recorded once, at close
    ledger = _train_and_evaluate(tmp_path / "d.db", 10)
    assert _unused_events(ledger) == []
    unused = ledger.leased_unused
    assert 0 <= unused < 16  # at most one lease of the streak (max(16, r/64) steps)
    released = [r for r in ledger.history if r.label == "train"]
    ledger.close()
    again = Ledger.open(tmp_path / "d.db")
    assert len([r for r in again.history if r.label == "train"]) == 180 + unused
    assert len(released) == 180 + unused  # the history holds the leased rows
    assert len(_unused_events(again)) == (1 if unused else 0)
    again.close()


def test_the_same_charge_twice_in_a_row_ends_the_lease_as_before(tmp_path):
    ledger, lease = _leased(tmp_path / "t.db")
    ledger.charge(EVAL, label="eval")
    assert ledger._lease is lease
    ledger.charge(EVAL, label="eval")  # a streak of evaluations: the training lease ends
    assert ledger._lease is not lease
    events = _unused_events(ledger)
    assert len(events) == 1 and events[0]["reason"] == "mechanism change"
    ledger.close()


def test_a_new_mechanism_under_the_same_label_still_ends_the_lease(tmp_path):
    ledger, lease = _leased(tmp_path / "m.db")
    ledger.charge(M.SubsampledGaussian(0.9, 0.01), label="train")
    assert ledger._lease is not lease and len(_unused_events(ledger)) == 1
    ledger.close()


def test_a_refused_evaluation_leaves_the_lease_and_records_nothing(tmp_path):
    ledger, lease = _leased(tmp_path / "r.db", 3.0)
    left, spent = lease.left, ledger.spent.copy()
    n = len(ledger.history)
    with pytest.raises(BudgetExhausted):
        ledger.charge(M.Gaussian(0.05), label="eval")
    assert ledger._lease is lease and lease.left == left
    assert len(ledger.history) == n and np.array_equal(ledger.spent, spent)
    ledger.charge(STEP, label="train")
    assert lease.left == left - 1
    ledger.close()


def test_the_beside_charge_is_admitted_on_the_spent_curve_that_holds_the_lease(tmp_path):
    # the evaluation's admission sees the whole lease as spent (Lemma 1 and the filter's
    # admission of the lease): the journal's curve after it is the lease's rows plus the
    # evaluation's, never the released steps alone
    ledger, lease = _leased(tmp_path / "s.db")
    left = lease.left
    ledger.charge(EVAL, label="eval")
    memory = Ledger(8.0, 1e-5)
    memory.charge(STEP, label="train", times=40 + left)
    memory.charge(EVAL, label="eval")
    assert np.allclose(ledger.spent, memory.spent, rtol=1e-12, atol=0)
    ledger.close()


def test_a_prefetched_lease_survives_an_evaluation(tmp_path):
    ledger = Ledger(8.0, 1e-5, path=tmp_path / "p.db", prefetch=True)
    for _ in range(200):
        ledger.charge(STEP, label="train")
    ledger.charge(EVAL, label="eval")  # waits for a prefetch in flight, keeps what it made
    assert _unused_events(ledger) == []
    for _ in range(200):
        ledger.charge(STEP, label="train")
    assert _unused_events(ledger) == []
    ledger.close()
    again = Ledger.open(tmp_path / "p.db")
    events = _unused_events(again)
    assert len([r for r in again.history if r.label == "train"]) == 400 + sum(
        e["steps"] for e in events)
    again.close()


@pytest.mark.parametrize("bad", [np.array([1.0, 2.0]), "x"])
def test_an_invalid_mechanism_after_a_beside_charge_is_refused_as_invalid(tmp_path, bad):
    # review rsl: the second-in-a-row test compared (label, mechanism) with the last beside
    # charge's by ==; an array's == is elementwise, and its truth value raised a built-in
    # ValueError out of charge() instead of InvalidArgumentError (the lease untouched)
    ledger, lease = _leased(tmp_path / "i.db")
    left = lease.left
    ledger.charge(EVAL, label="eval")
    with pytest.raises(InvalidArgumentError):
        ledger.charge(bad, label="eval")
    assert ledger._lease is lease and lease.left == left
    ledger.charge(STEP, label="train")
    assert lease.left == left - 1
    ledger.close()


def test_steps_from_the_lease_and_its_prefetch_end_a_run_of_beside_charges(tmp_path):
    # review rsl: a charge(times=k) handed out from the rest of the lease and then the
    # prefetched one (_from_both) is a leased step of the lease's key, which ends the run
    # of beside charges (theory §13); it left _side set, so the next evaluation ended the
    # lease as a second charge in a row ("mechanism change", its remainder unused)
    ledger = Ledger(8.0, 1e-5, path=tmp_path / "b.db", prefetch=True)
    for e in range(60):
        for _ in range(1 + e % 4):
            ledger.charge(STEP, label="train", times=1 + e % 3)
        ledger.charge(EVAL, label="eval")
        ledger.charge(STEP, label="train", times=5)
        ledger.charge(EVAL, label="eval")
    assert _unused_events(ledger) == []
    ledger.close()


def test_a_beside_charge_that_closes_part_a_keeps_the_lease_and_replays(tmp_path):
    # review rsl (theory §13, "Charges beside a lease"): an outside evaluation beside a
    # lease part A admitted closes A; the lease's tail is released after, from the journal
    # (spent unchanged), and a reopened ledger replays to the same hybrid state
    import warnings

    from privguard import Plan

    path = tmp_path / "h.db"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ledger = Ledger(3.0, 1e-5, path=path, plan=Plan(STEP, steps=3000), filter="hybrid",
                        prefetch=False)
        for _ in range(40):
            ledger.charge(STEP, label="train")
        lease = ledger._lease
        assert lease is not None and lease.left > 0 and ledger._acc.filter.state()["a_alive"]
        ledger.charge(EVAL, label="eval")
    state = ledger._acc.filter.state()
    assert not state["a_alive"] and ledger._lease is lease and lease.left > 0
    spent = ledger.spent.copy()
    for _ in range(lease.left):
        ledger.charge(STEP, label="train")
    np.testing.assert_array_equal(ledger.spent, spent)  # released from the lease
    ledger.close()
    again = Ledger.open(path)
    assert again._acc.filter.state() == state
    np.testing.assert_array_equal(again.spent, spent)
    again.close()


def test_an_interrupt_before_the_beside_charge_is_written_breaks_the_ledger(tmp_path):
    # review rsl: KeyboardInterrupt after the accounting applied the evaluation and before
    # the store's write: memory held a charge the store rolled back (history and spent read
    # it back, the lease went on handing out steps), and only the next write refused, as
    # "edited in place". Now the ledger breaks at once, as for an interrupt in the write
    ledger, _ = _leased(tmp_path / "k.db")
    apply = ledger._acc.apply

    def interrupted(*args, **kwargs):
        apply(*args, **kwargs)
        raise KeyboardInterrupt

    ledger._acc.apply = interrupted
    with pytest.raises(KeyboardInterrupt):
        ledger.charge(EVAL, label="eval")
    ledger._acc.apply = apply
    with pytest.raises(LedgerStateError, match="interrupted"):
        ledger.charge(STEP, label="train")
    again = Ledger.open(tmp_path / "k.db")
    assert [r.label for r in again.history].count("eval") == 0  # nothing was committed
    again.close()


@pytest.mark.parametrize("k", [2, 3])
def test_times_k_beside_a_lease_records_what_k_single_charges_record(leased_store, k):
    # Task lo: charge(EVAL, times=k) was one charge beside the lease, which stayed live,
    # while k single charges end it at the second (its remainder recorded unused), so
    # "exactly what k single charges would record" (charge's docstring) did not hold.
    # Review rlo: on PostgreSQL (owner and charging role) as on SQLite.
    def run(times):
        ledger = leased_store.make(8.0, 1e-5, prefetch=False)
        for _ in range(40):
            ledger.charge(STEP, label="train")
        assert ledger._lease is not None and ledger._lease.left > 0
        if times:
            ledger.charge(EVAL, label="eval", times=k)
        else:
            for _ in range(k):
                ledger.charge(EVAL, label="eval")
        for _ in range(5):
            ledger.charge(STEP, label="train")
        decisions = [ledger.can_afford(m) for m in (STEP, EVAL, M.Gaussian(0.5))]
        ledger.close()
        again = leased_store.reopen(ledger)
        try:
            return ([{key: v for key, v in e.items() if key not in ("time", "pid")}
                     for e in again.events],
                    [(r.index, r.label, r.mechanism) for r in again.history],
                    again.spent, decisions)
        finally:
            again.close()

    k_at_once, singles = run(True), run(False)
    assert k_at_once[0] == singles[0]  # the same lease-unused events (and nothing else)
    unused = [e["reason"] for e in singles[0] if e["event"] == "lease-unused"]
    # a charging role appends charges only: its remainders stay spent, unrecorded
    assert unused == ([] if leased_store.name == "postgres-charger" else ["mechanism change",
                                                                       "close"])
    assert k_at_once[1] == singles[1]  # the same spent steps, in the same places
    assert np.array_equal(k_at_once[2], singles[2]) and k_at_once[3] == singles[3]
