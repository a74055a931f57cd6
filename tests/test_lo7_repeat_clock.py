"""Task lo7, item 4: after a wall clock stepped back, a charge on the in-memory repeat lane
returned a record carrying the clock's (earlier) time, while ``history`` showed the run's
last time as kept, clamped to the previous charge's (a run's last time never goes back:
task adv5). Both now carry the clamped time, the time the ordinary path's record carries."""

from __future__ import annotations

import time
from unittest import mock

import pytest

from privguard import Ledger
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)


@pytest.mark.parametrize("lane", [True, False], ids=["repeat-lane", "ordinary"])
def test_a_record_after_a_clock_step_back_carries_the_time_history_shows(lane):
    ledger = Ledger(3.0, 1e-5, plan=STEP)
    ledger.repeat_lane = lane
    ledger.charge(STEP)
    ledger.charge(STEP)
    before = ledger.history[-1].time
    real = time.time
    with mock.patch("time.time", lambda: real() - 3600.0):  # NTP steps the clock back
        record = ledger.charge(STEP)
    shown = ledger.history[-1]
    assert shown.index == record.index == 2
    assert record.time == shown.time == before  # the clamped time, on both
    assert record == shown
