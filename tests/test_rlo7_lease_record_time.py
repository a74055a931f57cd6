"""Review rlo7 (the lease-record time lo7 noted at ``Ledger._take``): a step handed out
from a lease returned a record carrying the clock's time at hand-out, which ``history``
never shows for it: the journal keeps a run's first and last time, the steps between carry
None (ChargeRecord's documented rule, which the ordinary path's records keep), and a step
handed out from the lease's tail showed the time the lease was admitted. A leased record
now carries what the journal holds for its index, as the repeat lane's does (task lo7,
item 4), so ``record == history[record.index]`` on every path."""

from __future__ import annotations

import pytest

from privguard import Ledger
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)
EVAL = M.Gaussian(50.0)


@pytest.mark.parametrize("times", [1, 3])
def test_a_leased_record_is_the_one_history_shows(tmp_path, times):
    ledger = Ledger(3.0, 1e-5, path=str(tmp_path / "l.db"), plan=STEP, lease=8,
                    prefetch=False)
    for i in range(20):
        record = ledger.charge(STEP, label="train", times=times)
        assert record == ledger.history[record.index], (i, record)
        if i % 4 == 3:  # an evaluation beside the lease, which stays live
            record = ledger.charge(EVAL, label="eval")
            assert record == ledger.history[record.index], (i, record)
    ledger.close()
