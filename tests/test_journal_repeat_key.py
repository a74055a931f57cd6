"""``Journal.repeat_key`` and ``Journal.repeat_current``: what ``Accounting.repeat`` reads
from the journal, through an accessor instead of the journal's private fields."""

from __future__ import annotations

import numpy as np

from privguard import mechanisms as M
from privguard._accounting._journal import Journal

STEP = M.SubsampledGaussian(1.0, 0.01)
OTHER = M.Gaussian(4.0)
CURVE = np.ones(3)


def test_repeat_key_is_the_current_runs_key_and_the_streaks_count():
    journal = Journal(3)
    assert journal.repeat_key() is None  # no current run
    journal.append(OTHER, "warm-up", 7, CURVE, 0.5)
    journal.append(STEP, "step", 7, CURVE, 1.0, times=2)
    assert journal.repeat_key() == (STEP, "step", 7, 2)
    journal.append(STEP, "other label", 7, CURVE, 1.5)  # a new run, the same streak
    assert journal.repeat_key() == (STEP, "other label", 7, 3)
    journal.close_current()  # an event ends the run
    assert journal.repeat_key() is None


def test_repeat_current_returns_the_index_of_the_charge_it_records():
    journal = Journal(3)
    journal.append(OTHER, None, 7, CURVE, 0.5, times=4)
    journal.append(STEP, "step", 7, CURVE, 1.0, times=2)
    for expected in (6, 7, 8):
        assert journal.repeat_current(2.0 + expected) == expected
        run = journal.last
        assert run.record(run.count - 1).index == expected
    assert journal.repeat_key() == (STEP, "step", 7, 5)
    assert journal.charges == 9 and np.array_equal(journal.spent(), 4 * CURVE + 5 * CURVE)


def test_a_resumed_journal_numbers_the_next_charge_after_the_checkpoint():
    journal = Journal(3)
    journal.append(OTHER, None, 7, CURVE, 0.5, times=4)
    journal.append(STEP, "step", 7, CURVE, 1.0, times=2)
    resumed = Journal.from_snapshot(3, journal.snapshot(), lambda m: CURVE)
    assert resumed.repeat_key() == (STEP, "step", 7, 2)
    assert resumed.repeat_current(3.0) == journal.repeat_current(3.0) == 6
