"""Leftovers of the last closing note (task lo5): each test fails on the code before."""

from __future__ import annotations

import numpy as np
import pytest

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M


def _history():
    ledger = Ledger(epsilon=8.0, delta=1e-5)
    for sigma in (2.0, 2.0, 3.0, 3.0, 3.0):  # two runs: records 0-1 and 2-4
        ledger.charge(M.Gaussian(sigma))
    return ledger.history


# -- 1. History: a list's indices, InvalidArgumentError for bad ones ----------------------
@pytest.mark.parametrize("index", [np.int64(2), np.int32(-3), np.uint8(2), np.array(2)])
def test_history_takes_numpy_integer_indices_as_a_list_does(index):
    # TypeError before (history indices must be integers, not int64)
    history = _history()
    assert history[index] == list(history)[int(index)]
    assert history[np.int64(1):np.int64(4)] == list(history)[1:4]


@pytest.mark.parametrize("index", [True, 1.0, "1", None, [1], np.array([1, 2]), np.float64(1)])
def test_history_refuses_a_non_integer_index_naming_it(index):
    with pytest.raises(InvalidArgumentError, match="index="):  # TypeError before
        _history()[index]


@pytest.mark.parametrize("index", [5, -6, 10**30, -(10**30), np.int64(5)])
def test_history_out_of_range_is_invalid_argument_and_index_error(index):
    # IndexError alone before; IndexError still, so the sequence protocol stops at it
    with pytest.raises(InvalidArgumentError, match=r"must lie in \[-5, 5\)") as info:
        _history()[index]
    assert isinstance(info.value, IndexError)


@pytest.mark.parametrize("part", [slice(None, None, 0), slice(1.5, None), slice(None, "a"),
                                  slice(None, None, np.array([1, 2]))])
def test_history_refuses_a_bad_slice_naming_it(part):
    with pytest.raises(InvalidArgumentError, match="index="):  # ValueError/TypeError before
        _history()[part]


@pytest.mark.parametrize("part", [slice(None, None, 10**30), slice(None, None, -(10**30)),
                                  slice(-(10**30), 10**30, 2), slice(None, None, -1)])
def test_history_slices_as_a_list_does(part):
    history = _history()
    assert history[part] == list(history)[part]


def test_history_index_count_and_in_never_compare_an_array():
    # index(array) and count(array) raised ValueError (an array's truth value); `in` too
    history = _history()
    other = np.array([1, 2])
    assert history.count(other) == 0 and other not in history
    with pytest.raises(InvalidArgumentError, match="value="):
        history.index(other)
    assert history == list(history) and history != [other] * len(history)


def test_history_index_and_count_as_a_lists():
    history = _history()
    records = list(history)
    for i, record in enumerate(records):
        assert history.index(record) == records.index(record) == i
        assert history.count(record) == records.count(record) == 1
        assert record in history
        assert history.index(record, i - 5, i + 1) == i  # negative start, as a list
    with pytest.raises(InvalidArgumentError, match="value=") as info:
        history.index(records[2], 3)  # not in [3, 5)
    assert isinstance(info.value, ValueError)  # as list.index's
    with pytest.raises(InvalidArgumentError, match="start="):
        history.index(records[2], 1.5)
    with pytest.raises(InvalidArgumentError, match="stop="):
        history.index(records[2], 0, "4")
    foreign = _history()[2]
    assert foreign not in history  # another ledger's record: another time
    assert list(reversed(history)) == records[::-1]


# -- 2. A child without δ says why its ε is refused ---------------------------------------
def test_a_child_without_delta_says_why_it_has_no_epsilon():
    parent = Ledger(epsilon=8.0, delta=1e-5)
    child = parent.child(M.Gaussian(2.0))
    child.charge(M.Gaussian(4.0))
    with pytest.raises(InvalidArgumentError) as info:
        child.epsilon()
    message = str(info.value)
    # before: "this ledger has no δ; pass delta=..." (nothing of why)
    assert "strict per-order" in message and "child(..., delta=" in message, message
    assert "parent's δ" in message, message
    assert child.epsilon(1e-5) > 0  # the remedy works
    assert parent.child(M.Gaussian(2.0), delta=1e-5).epsilon() == 0.0


# -- 3. The Poisson refusal hint names both changes of the curve --------------------------
def test_a_refused_poisson_tuning_state_names_both_curve_changes(monkeypatch):
    """A state written where the Poisson tuner's curve was lower (a stand-in for a privguard
    before lo4's rounded-up δ̂ at a μ whose rise passes the revision tolerance: the curve
    1e-3 lower) does not load, and the refusal names that cause, not only K = 0."""
    from privguard import LedgerStateError
    from privguard._mechanisms import _base
    from privguard._mechanisms import _repeat_select as R
    from privguard.tuning import Poisson

    tuner = M.RepeatAndSelect(M.SubsampledGaussian(1.0, 0.01, steps=100), Poisson(5.0))
    today = R.RepeatAndSelect._rdp
    with monkeypatch.context() as patch:
        patch.setattr(R.RepeatAndSelect, "_rdp", lambda self, orders: today(self, orders) * (1 - 1e-3))
        _base._cached_curve.cache_clear()
        ledger = Ledger(epsilon=1e6, delta=1e-5)
        ledger.charge(tuner, label="tune")
        state = ledger.state_dict()
    _base._cached_curve.cache_clear()
    with pytest.raises(LedgerStateError) as info:
        Ledger.load_state_dict(state)
    message = str(info.value)
    assert 'docs/theory.md §7 "K = 0 (Poisson)"' in message, message
    assert "Rounding of δ̂" in message and "(2)" in message, message  # only K = 0 before


# -- 6. EngineView.load_state_dict: all or nothing ---------------------------------------
def test_an_engine_checkpoint_whose_ledger_refuses_leaves_opacus_record_as_it_was():
    """The entry is well formed (check_entry passes) but restore() refuses it: its ledger
    state is another journal than the attached ledger's. Before, Opacus' accountant had
    already taken the checkpoint's history (a later checkpoint paired them)."""
    import copy

    from test_adv_fs_forged_state import _engine_attached

    from privguard import LedgerStateError
    from privguard.integrations._checkpoint import ledger_entry

    other = Ledger(epsilon=8.0, delta=1e-5)
    for _ in range(5):
        other.charge(M.Gaussian(3.0))
    engine, ledger = _engine_attached()
    state = copy.deepcopy(engine.accountant.state_dict())
    state["history"] = [(2.0, 0.25, 3)]
    state["privguard"] = ledger_entry(other, [(2.0, 0.25, 3)])
    record, spent = copy.deepcopy(engine.accountant.history), ledger.spent
    with pytest.raises(LedgerStateError):
        engine.accountant.load_state_dict(state)
    assert engine.accountant.history == record != [(2.0, 0.25, 3)]
    assert engine.accountant.wrapped.history == record
    assert np.array_equal(ledger.spent, spent) and len(ledger.history) == 4


# -- 5. A relative path= is resolved once, at construction --------------------------------
def test_a_relative_path_stays_the_same_file_after_chdir(tmp_path, monkeypatch):
    # Before: after os.chdir every charge and read refused ("the ledger file is gone"), and a
    # file of that name in the new directory was taken for a replacement
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    ledger = Ledger(epsilon=8.0, delta=1e-5, path="rel.db")
    ledger.charge(M.Gaussian(5.0))
    monkeypatch.chdir(tmp_path / "b")
    Ledger(epsilon=8.0, delta=1e-5, path="rel.db").close()  # another file of that name
    ledger.charge(M.Gaussian(5.0))
    assert len(ledger.history) == 2 and ledger.epsilon() > 0
    ledger.close()
    assert len(Ledger.open(tmp_path / "a" / "rel.db", read_only=True).history) == 2
    assert len(Ledger.open(tmp_path / "b" / "rel.db", read_only=True).history) == 0
