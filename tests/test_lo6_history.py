"""``History``'s lookups take a record whose ``index`` is a numpy integer, as a list does
(task lo6; task lo5 made indexing take numpy integers)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from privguard import Ledger
from privguard import mechanisms as M


def _history():
    ledger = Ledger(epsilon=5.0, delta=1e-5)
    for label in ("a", "b", "b", "c"):
        ledger.charge(M.Gaussian(20.0), label=label)
    return ledger.history


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint8, np.intp])
@pytest.mark.parametrize("at", [0, 2, 3])
def test_a_record_with_a_numpy_index_is_found_as_a_list_finds_it(kind, at):
    history = _history()
    as_list = list(history)
    record = dataclasses.replace(history[at], index=kind(at))
    expected = (record in as_list, as_list.count(record), as_list.index(record))
    assert expected == (True, 1, at)  # the list's answers
    assert (record in history, history.count(record), history.index(record)) == expected
    assert type(history.index(record)) is int
    same = [*as_list[:at], record, *as_list[at + 1:]]
    assert history == same and same == as_list


def test_a_numpy_index_of_another_record_or_out_of_range_is_not_held():
    history = _history()
    moved = dataclasses.replace(history[1], index=np.int64(2))  # "b" at 2 has another time
    far = dataclasses.replace(history[3], index=np.int64(7))
    for record in (far,) + ((moved,) if history[1].time != history[2].time else ()):
        assert record not in history and history.count(record) == 0
    for record in (dataclasses.replace(history[1], index=True),
                   dataclasses.replace(history[1], index=1.0)):
        assert record not in history  # a bool or a float stays refused
