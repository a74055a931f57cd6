"""Issue 26, task hm: the repeat lane's ChargeRecord, built without the dataclass' __init__.

``charge_record`` fills the frozen dataclass' fields directly (the lane runs at every
step); the record must be the one ``ChargeRecord(...)`` makes in every respect a caller
can see, and the lane's records the ordinary path's.
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from privguard import Ledger
from privguard._accounting._journal import ChargeRecord, charge_record
from privguard.mechanisms import SubsampledGaussian


@pytest.mark.parametrize("label", [None, "train"])
def test_a_record_built_directly_is_the_dataclass_record(label):
    m = SubsampledGaussian(1.0, 0.01)
    fast, slow = charge_record(7, label, m, 12.5, 42), ChargeRecord(7, label, m, 12.5, 42)
    assert type(fast) is ChargeRecord
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert vars(fast) == vars(slow) and list(vars(fast)) == list(vars(slow))
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow)
    assert fast.to_dict() == slow.to_dict()
    assert pickle.loads(pickle.dumps(fast)) == slow
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.index = 8  # type: ignore[misc]


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
