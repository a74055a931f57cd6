"""A forged or corrupt state raises LedgerStateError, never a Python built-in.

Both ways of loading are checked: ``Ledger.load_state_dict(state)`` (called
on the class: a new ledger) and ``ledger.load_state_dict(state)`` (in place).
Each state is re-checksummed with the library's own digest where the edit
would otherwise be caught by the checksum alone.
"""

from __future__ import annotations

import copy
import hashlib

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._integrity import Integrity, canonical

STEP = M.SubsampledGaussian(1.0, 0.01)


def _nested(depth):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture(scope="module")
def state():
    ledger = Ledger(3.0, 1e-5)
    for i in range(3):
        ledger.charge(STEP, label=f"s{i}")
    ledger.charge(M.Laplace(5.0), label="count")
    return ledger.state_dict()


def _resummed(state):
    body = {k: v for k, v in state.items() if k != "checksum"}
    state["checksum"] = Integrity(None).digest("state", body)
    return state


def _loaders():
    def in_place(state):
        ledger = Ledger(3.0, 1e-5)
        ledger.charge(STEP, label="s0")
        return ledger.load_state_dict(state)

    return [pytest.param(Ledger.load_state_dict, id="class"), pytest.param(in_place, id="inplace")]


EDITS = {
    # a journal event whose body is not a dict, re-checksummed (passes the checksum)
    "event-body-list": (lambda s: s["journal"].append(["event", [1]]), True,
                        "journal entry .*: an event must be a dict"),
    "event-body-str": (lambda s: s["journal"].append(["event", "x"]), True,
                       "journal entry .*: an event must be a dict"),
    # a fixed plan whose filter record is not a dict (journal fix entry and "fixed" alike)
    "fix-filter-list": (lambda s: [s["fixed"].__setitem__("filter", [1]),
                                   s["journal"][0][1].__setitem__("filter", [1])], True,
                        "fixed plan is unreadable"),
    # values the checksum's JSON encoding cannot take (the checksum is then not computable)
    "set-value": (lambda s: s.__setitem__("spent", {1.0, 2.0}), False, "not JSON data"),
    "bytes-value": (lambda s: s.__setitem__("extra", b"1"), False, "not JSON data"),
    "int-key": (lambda s: s.__setitem__(1, 1), False, "not JSON data"),
    "nested-100000": (lambda s: s.__setitem__("extra", _nested(100_000)), False,
                      "not JSON data"),
}


@pytest.mark.parametrize("load", _loaders())
@pytest.mark.parametrize("name", sorted(EDITS))
def test_an_edited_state_raises_ledger_state_error(state, load, name):
    edit, resum, message = EDITS[name]
    bad = copy.deepcopy(state)
    edit(bad)
    if resum:
        _resummed(bad)
    with pytest.raises(LedgerStateError, match=message):
        load(bad)


def _v1_state(state, **record):
    body = {"format": "privguard.Ledger", "version": 1, "config": {
        "orders": state["config"]["orders"], "delta": 1e-5, "odometer": "tight", "plan": None,
        "filter": {"kind": "dp", "epsilon": 3.0, "delta": 1e-5,
                   "shares": {"type": "Concentrated", "params": {"share": 0.9, "order": None}}}},
        "records": [{"label": "a", "mechanism": STEP.to_dict(), "time": 1.0, "pid": 1, **record}],
        "filter_state": {}, "spent": state["spent"]}
    body["checksum"] = hashlib.sha256(canonical(body)).hexdigest()  # 0.1's checksum
    return body


@pytest.mark.parametrize("load", _loaders())
@pytest.mark.parametrize("record, message", [
    ({"time": "abc"}, "version-1 record 0: time must be a finite number, got 'abc'"),
    ({"time": None}, "version-1 record 0: time must be a finite number"),
    ({"time": 10**400}, "version-1 record 0: time must be a finite number"),
    ({"pid": "1"}, "version-1 record 0: pid must be an integer"),
    ({"label": ["a"]}, "version-1 record 0: label must be a string or None"),
])
def test_a_version_1_state_with_a_mistyped_record_raises_ledger_state_error(
        state, load, record, message):
    with pytest.raises(LedgerStateError, match=message):
        load(_v1_state(state, **record))


def test_a_state_that_is_not_a_dict_raises_ledger_state_error():
    # consistent with what load has always done for a non-dict state
    with pytest.raises(LedgerStateError, match="state must be a dict, got list"):
        Ledger.load_state_dict([1])


@pytest.mark.parametrize("flt", ["rdp", "hybrid"])
def test_a_forged_retarget_that_changes_nothing_never_loads(flt):
    # privguard never logs a retarget that keeps the configuration; appended to a state
    # and re-checksummed it would pass "extends my journal" and "same configuration",
    # and a retarget swaps a hybrid filter for the RDP filter at the full δ
    from privguard import Plan

    ledger = Ledger(3.0, 1e-5, plan=Plan(STEP, steps=1000), filter=flt)
    for _ in range(10):
        ledger.charge(STEP, label="train")
    forged = copy.deepcopy(ledger.state_dict())
    cfg = forged["config"]
    forged["journal"].append(["event", {"event": "retarget", "old": cfg, "new": cfg,
                                        "reason": "forged", "time": 0.0}])
    forged = _resummed(forged)
    for load in (Ledger.load_state_dict, ledger.load_state_dict):
        with pytest.raises(LedgerStateError, match="a retarget that changes nothing"):
            load(forged)
    ledger.charge(STEP, label="train")  # the refused state left the ledger usable


@pytest.mark.parametrize("flt", ["rdp", "hybrid"])
@pytest.mark.parametrize("charged_before", [False, True], ids=["retarget-first", "charge-first"])
@pytest.mark.parametrize("new", [(4.0, 1e-5), (3.0, 1e-6)], ids=["epsilon", "delta"])
def test_a_retargeted_ledgers_own_state_loads(tmp_path, flt, charged_before, new):
    # the journal is replayed from the configuration it started with, each retarget moving
    # it on (replaying from the final one refused every honest retarget)
    from privguard import Plan

    path, plan = tmp_path / "r.db", Plan(STEP, steps=1000)
    ledger = Ledger(3.0, 1e-5, path=path, plan=plan, filter=flt)
    if charged_before:
        ledger.charge(STEP, label="a")
    ledger.close()
    ledger = Ledger(*new, path=path, plan=plan, filter=flt, retarget="approved")
    ledger.charge(STEP, label="b")
    state = ledger.state_dict()
    loaded = Ledger.load_state_dict(state)
    assert loaded.runs == ledger.runs and loaded.epsilon() == ledger.epsilon()
    assert loaded.target == ledger.target == new
    assert loaded.remaining(STEP).repeats == ledger.remaining(STEP).repeats
    assert ledger.load_state_dict(state) is ledger
    forged = copy.deepcopy(state)
    forged["config"] = next(body["old"] for kind, body, *_ in forged["journal"]
                            if kind == "event")  # the target before the retarget
    with pytest.raises(LedgerStateError, match="retargets end in"):
        Ledger.load_state_dict(_resummed(forged))


def _forged_retargets(ledger, events):
    """``ledger``'s state with retarget ``events`` appended, its fixed record and filter
    state recomputed by the library's own replay, re-checksummed: what a forger without a
    key can write."""
    from privguard import _config

    state = copy.deepcopy(ledger.state_dict())
    acc = copy.deepcopy(ledger._acc)
    for old, new in events:
        body = {"event": "retarget", "old": old, "new": new, "reason": "forged", "time": 0.0}
        state["journal"].append(["event", body])
        acc.config = _config.from_dict(old)
        acc.replay_event(body, _config.from_dict(new))
    state["fixed"], state["filter_state"] = acc.fixed, acc.filter.state()
    return _resummed(state)


@pytest.mark.parametrize("variant", ["made-up-old", "round-trip"])
def test_an_in_place_load_never_applies_a_retarget_the_ledger_did_not_make(variant):
    # An in-memory hybrid ledger whose part A died, charged until refused. A forged state
    # that retargets after its journal (from a made-up "old", or to another target and
    # back) swapped in the RDP filter at the full δ: 921 more steps, ε 3.66 > 3.
    from privguard import Plan

    ledger = Ledger(3.0, 1e-5, plan=Plan(STEP, steps=1000), filter="hybrid")
    ledger.charge(M.Laplace(50.0), label="outside")  # outside the envelope: part A dies
    while ledger.can_afford(STEP):
        ledger.charge(STEP, label="train")
    cfg = ledger.state_dict()["config"]
    if variant == "made-up-old":
        events = [(dict(cfg, filter="rdp"), cfg)]
    else:
        events = [(cfg, dict(cfg, epsilon=3.5)), (dict(cfg, epsilon=3.5), cfg)]
    forged = _forged_retargets(ledger, events)
    with pytest.raises(LedgerStateError, match="retargets this ledger after its journal"):
        ledger.load_state_dict(forged)
    assert not ledger.can_afford(STEP) and ledger.epsilon() <= 3.0


def test_overflowing_odometer_weights_in_a_state_fail_closed(state):
    big = {"weights": [10 ** 400] * len(state["fixed"]["odometer"]["weights"])}
    forged = copy.deepcopy(state)
    forged["fixed"]["odometer"] = big
    forged["journal"][0][1]["odometer"] = big
    forged = _resummed(forged)
    with pytest.raises(LedgerStateError, match="fixed plan is unreadable"):
        Ledger.load_state_dict(forged)


def test_a_state_without_its_fixed_record_fails_closed(state):
    forged = copy.deepcopy(state)
    del forged["fixed"]
    with pytest.raises(LedgerStateError, match="malformed.*fixed"):
        Ledger.load_state_dict(_resummed(forged))
