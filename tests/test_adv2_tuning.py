"""Adversarial pass over the tuners and their integrations (task adv2)."""

from __future__ import annotations

import pytest
from _tuning_holds import RUN, probes_refused, try_charge
from _tuning_holds import tuner as _tuner
from _tuning_holds import usable_after as _usable_after

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard.tuning import Poisson, ProposeTest, RandomSearch

# ---- 1. a second handle of the tuned ledger's file, opened inside a candidate

def test_a_candidate_reopening_the_tuned_file_cannot_charge_it(tmp_path):
    # The hold was a flag of the one Ledger object the tuner charged: a candidate that
    # opened the same file again (Ledger.open(path) in its training helper) charged the
    # journal once per candidate (['tuning', 'leak', 'leak', ...]: K in the journal).
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)
    refusals = []

    def objective(params, child):
        other = Ledger.open(path)
        try:
            other.charge(M.Gaussian(100.0), label="leak")
        except LedgerStateError as exc:
            refusals.append(str(exc))
            raise
        finally:
            other.close()
        return 1.0

    result = _tuner().run(objective, ledger)
    assert not result.selected  # every candidate was refused, hence ⊥
    assert [r.label for r in ledger.history] == ["tuning"]
    assert refusals and all("held by a privguard tuner" in text for text in refusals)
    _usable_after(Ledger.open(path))
    ledger.close()


def test_a_handle_opened_before_the_run_is_held_too(tmp_path):
    # Every handle of the same file in this process, by its identity: one opened before
    # the run (another thread's monitor, a closure's) too.
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)
    before = Ledger.open(path)
    probes_refused(ledger, lambda seen: try_charge(before, seen))
    _usable_after(before)  # the hold ended with the run
    ledger.close()


def test_propose_test_partitions_cannot_charge_a_second_handle(tmp_path):
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)

    def objective(params, indices):
        other = Ledger.open(path)
        try:
            other.charge(M.Gaussian(100.0), label="leak")
        finally:
            other.close()
        return 0.5

    tuner = ProposeTest([{"a": 1}, {"a": 2}], epsilon0=0.5, partitions=2, seed=0,
                        progress=False)
    result = tuner.run(objective, ledger, 10)
    assert {r.label for r in ledger.history} == {"propose-test round"}
    assert len(ledger.history) == result.rounds
    ledger.close()


def test_an_unrelated_file_stays_usable_while_a_tuner_holds_another(tmp_path):
    # The hold is the held ledger's file only: a separate ledger (its own budget, what the
    # refusal advises) is charged as before.
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=str(tmp_path / "a.db"))
    separate = Ledger(epsilon=50.0, delta=1e-5, path=str(tmp_path / "b.db"))

    def objective(params, child):
        separate.charge(M.Gaussian(100.0), label="own budget")
        return 1.0

    assert _tuner().run(objective, ledger).selected
    assert len(separate.history) >= 1
    separate.close()
    ledger.close()


@pytest.mark.parametrize("make", ["open", "init"])
def test_every_way_of_opening_the_file_is_held(tmp_path, make):
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)

    def probe(seen):
        other = (Ledger.open(path) if make == "open"
                 else Ledger(epsilon=50.0, delta=1e-5, path=path))
        try:
            other.epsilon()  # a read, refused as a charge is
            seen.append("read")
        except LedgerStateError:
            seen.append("refused")
        finally:
            other.close()

    probes_refused(ledger, probe)
    ledger.close()


# ---- 3. bad input to the Optuna trial's suggest_* and report

def _trial():
    pytest.importorskip("optuna")
    from privguard.integrations._optuna_trial import SEED_KEY, PrivateTrial

    return PrivateTrial({SEED_KEY: 7}, fixed=False, pruner=None)


@pytest.mark.parametrize("call", [
    # a built-in escaped (OverflowError at the draw, after Optuna's warning)
    lambda t: t.suggest_float("x", 0.0, 1.0, step=float("nan")),
    lambda t: t.suggest_float("x", 0.0, 1.0, step=float("inf")),
    lambda t: t.suggest_float("x", 0.0, 1.0, step="0.1"),
    # taken with another meaning: "no" is truthy (a log scale)
    lambda t: t.suggest_float("x", 1.0, 2.0, log="no"),
    lambda t: t.suggest_int("n", 1, 8, log=1),
    # suggest_int truncated a bound or a step that is not an integer
    lambda t: t.suggest_int("n", 0.5, 5),
    lambda t: t.suggest_int("n", 0, 5.5),
    lambda t: t.suggest_int("n", 0, 5, step=1.5),
    lambda t: t.suggest_int("n", 0, 5, step=True),
    # a string's characters became the choices
    lambda t: t.suggest_categorical("c", "adam"),
    # a string or a bool reported as a number
    lambda t: t.report("0.5", 0),
    lambda t: t.report(True, 0),
], ids=["step-nan", "step-inf", "step-str", "log-str", "int-log-1", "int-low-0.5",
        "int-high-5.5", "int-step-1.5", "int-step-bool", "choices-str", "report-str",
        "report-bool"])
def test_trial_refuses_bad_input_naming_it(call):
    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        call(_trial())


def test_trial_still_takes_what_optuna_takes():
    import numpy as np

    t = _trial()
    assert 0.0 <= t.suggest_float("x", 0, 1, step=0.25) <= 1.0
    assert 1 <= t.suggest_int("n", np.int64(1), 9, step=2, log=False) <= 9
    assert t.suggest_categorical("c", ("adam", "sgd")) in ("adam", "sgd")
    t.report(np.float32(0.5), 0)
    t.report(float("nan"), 1)


def test_a_second_handle_in_another_thread_waits_for_the_run_as_the_same_handle_does(tmp_path):
    # Two handles of one file in one process: while a tuner's candidates run on one, the
    # other refuses (as the same handle in another thread did), and after the run both work.
    import threading

    path = str(tmp_path / "budget.db")
    a, b = Ledger(epsilon=50.0, delta=1e-5, path=path), Ledger.open(path)
    running, done, refused = threading.Event(), threading.Event(), []

    def objective(params, child):
        running.set()
        done.wait(60)
        return 1.0

    def other():
        running.wait(60)
        try:
            _tuner().run(lambda p, c: 1.0, b)
        except LedgerStateError as exc:
            refused.append(str(exc))
        finally:
            done.set()

    thread = threading.Thread(target=other)
    thread.start()
    assert RandomSearch({"x": [1]}, Poisson(2.0), cost=RUN, seed=0, progress=False).run(
        objective, a).selected
    thread.join()
    assert len(refused) == 1 and "another handle of the same ledger" in refused[0]
    assert [r.label for r in b.history] == ["tuning"]
    _tuner().run(lambda p, c: 1.0, b)  # after the run: b's own tuning is admitted
    assert [r.label for r in a.history] == ["tuning", "tuning"]
    a.close()
    b.close()


def test_holds_of_two_handles_end_each_with_its_own_release(tmp_path):
    # (Ledger._hold, as tuning._base.held uses it.) A handle held only through another may
    # still be held by its own tuner, and that hold outlasts the other's release; the
    # first holder's release leaves it refusing through the second's.
    path = str(tmp_path / "budget.db")
    a, b, c = Ledger(delta=1e-5, path=path), Ledger.open(path), Ledger.open(path)
    assert a._hold("A's tuner") and b._hold("B's tuner")
    a._unhold()
    for handle in (a, b, c):
        with pytest.raises(LedgerStateError, match="B's tuner"):
            handle.epsilon()
    b._unhold()
    for handle in (a, b, c):
        handle.epsilon()
        handle.close()


@pytest.mark.parametrize("reopen", ["pickle", "deepcopy"])
def test_a_copy_of_the_held_file_ledger_is_held(tmp_path, reopen):
    # A file ledger pickles (and deep-copies) as a reference that reopens its file: while
    # held, the copy a candidate made of the ledger it captured (pickled for a worker of
    # its own, or deep-copied with its config) charged the journal once per candidate.
    import copy
    import pickle

    ledger = Ledger(epsilon=50.0, delta=1e-5, path=str(tmp_path / "budget.db"))

    def probe(seen):
        other = (pickle.loads(pickle.dumps(ledger)) if reopen == "pickle"
                 else copy.deepcopy(ledger))
        try_charge(other, seen)
        other.close()

    probes_refused(ledger, probe)
    ledger.close()


def test_a_candidate_closing_the_held_ledger_does_not_leave_its_file_held(tmp_path):
    # A hold is released by the key its handle registered, not by the (closed) store; a
    # candidate's close of the held ledger is refused (task lo6), and the file is usable
    # after the run through it and through a new handle alike.
    path = str(tmp_path / "budget.db")
    ledger = Ledger(epsilon=50.0, delta=1e-5, path=path)

    def objective(params, child):
        ledger.close()
        return 1.0

    assert not _tuner().run(objective, ledger).selected  # every close refused: ⊥
    _usable_after(Ledger.open(path))
    ledger.close()


# ---- 3. bad input to the framework callbacks, refused when they are made

@pytest.mark.parametrize("framework", ["lightning", "huggingface"])
@pytest.mark.parametrize("label", ["step\x00", "step\ud800"], ids=["nul", "lone-surrogate"])
def test_callbacks_refuse_a_label_no_store_can_keep_when_made(framework, label):
    # check_callback_arguments took any str; the ledger refused it only when training began
    from privguard import InvalidArgumentError

    if framework == "lightning":
        pytest.importorskip("lightning")
        from privguard.integrations.lightning import LedgerCallback as Callback
    else:
        pytest.importorskip("transformers")
        from privguard.integrations.huggingface import LedgerTrainerCallback as Callback
    with pytest.raises(InvalidArgumentError, match="label"):
        Callback(Ledger(epsilon=1.0, delta=1e-5), label=label)
