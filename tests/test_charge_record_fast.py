"""Issue 26, task hm: the repeat lane's records are the ordinary path's.

(Task hm built the lane's ChargeRecord without the dataclass' __init__; review rhm
reverted that: in place, ``benchmarks/attach_hook_parts.py``, it saved under a
microsecond of ``Accounting.repeat`` and nothing the step hook's median showed.)
"""

from __future__ import annotations

from privguard import ChargeRecord, Ledger
from privguard.mechanisms import SubsampledGaussian


def test_the_repeat_lanes_records_are_the_ordinary_paths():
    m = SubsampledGaussian(1.0, 0.01)
    records = {}
    for lane in (True, False):
        ledger = Ledger(delta=1e-5)
        ledger.repeat_lane = lane  # type: ignore[misc]
        records[lane] = [ledger.charge(m, label="step") for _ in range(5)]
    fast, slow = records[True], records[False]
    assert [(r.index, r.label, r.mechanism, r.pid) for r in fast] == \
        [(r.index, r.label, r.mechanism, r.pid) for r in slow]
    assert all(type(r) is ChargeRecord for r in fast)
