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
from privguard._stores._integrity import Integrity, canonical

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
                        r"\(filter differs"),
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
    from privguard._accounting import _config

    state = copy.deepcopy(ledger.state_dict())
    acc = copy.deepcopy(ledger._acc)
    for old, new in events:
        body = {"event": "retarget", "old": old, "new": new, "reason": "forged", "time": 0.0,
                "pid": 1}  # the keys privguard writes (review bi: others are refused)
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
    # A made-up "old" configuration (the RDP filter) is where the journal's replay starts:
    # its fix entry (a hybrid filter) is not what that configuration derives (issue 24).
    message = ("filter.kind differs" if variant == "made-up-old"
               else "retargets this ledger after its journal")
    with pytest.raises(LedgerStateError, match=message):
        ledger.load_state_dict(forged)
    assert not ledger.can_afford(STEP) and ledger.epsilon() <= 3.0


def test_overflowing_odometer_weights_in_a_state_fail_closed(state):
    big = {"weights": [10 ** 400] * len(state["fixed"]["odometer"]["weights"])}
    forged = copy.deepcopy(state)
    forged["fixed"]["odometer"] = big
    forged["journal"][0][1]["odometer"] = big
    forged = _resummed(forged)
    with pytest.raises(LedgerStateError, match=r"odometer\.weights differs"):
        Ledger.load_state_dict(forged)


def test_a_state_without_its_fixed_record_fails_closed(state):
    forged = copy.deepcopy(state)
    del forged["fixed"]
    with pytest.raises(LedgerStateError, match=r"malformed.*fixed"):
        Ledger.load_state_dict(_resummed(forged))


# -- issue 24, item 1: a state's plan-derived choices are derived again on load ------------
HYBRID_STEP = M.SubsampledGaussian(1.1, 0.01)


@pytest.fixture(scope="module")
def hybrid_state():
    src = Ledger(3.0, 1e-5, filter="hybrid")
    src.charge(HYBRID_STEP)
    return src.state_dict()


def _with_fixed(state, edit):
    """``state`` with ``edit`` applied to its fixed record and its journal's fix entry
    alike, re-checksummed: what a forger without a key can write."""
    forged = copy.deepcopy(state)
    edit(forged["fixed"])
    entry = next(e for e in forged["journal"] if e[0] == "fix")
    if entry[1] is not forged["fixed"]:  # one object in a state_dict() not yet serialised
        edit(entry[1])
    return _resummed(forged)


def _scale_steps_a(factor):
    def edit(fixed):
        config = fixed["filter"]["config"]
        config["steps_a"] = int(config["steps_a"] * factor)
    return edit


@pytest.mark.parametrize("load", [
    pytest.param(Ledger.load_state_dict, id="class"),
    pytest.param(lambda s: Ledger(3.0, 1e-5, filter="hybrid").load_state_dict(s), id="inplace"),
])
def test_a_state_with_a_larger_hybrid_t_a_never_loads(hybrid_state, load):
    # Loaded, T_A × 10 admitted 370,799 steps (class) and 40,001 (in place) against ~3,708.
    with pytest.raises(LedgerStateError, match=r"filter\.config\.steps_a differs"):
        load(_with_fixed(hybrid_state, _scale_steps_a(10)))


def test_a_state_with_a_smaller_hybrid_t_a_loads_and_keeps_it(hybrid_state):
    # Fewer certified steps are safe: a recorded T_A below the derived one loads (so a
    # dp-accounting that certifies more later keeps saved states loadable) and is used.
    honest = hybrid_state["fixed"]["filter"]["config"]["steps_a"]
    loaded = Ledger.load_state_dict(_with_fixed(hybrid_state, _scale_steps_a(0.5)))
    assert loaded._acc.filter.steps_a == honest // 2


def _one_hot(fixed, key):
    weights = fixed[key]["weights"] if key == "odometer" else fixed["filter"]["weights"]
    one = [0.0] * len(weights)
    one[max(range(len(weights)), key=weights.__getitem__)] = 1.0
    if key == "odometer":
        fixed["odometer"]["weights"] = one
    else:
        fixed["filter"]["weights"] = one


@pytest.mark.parametrize("field", ["odometer", "filter"])
def test_one_hot_weights_in_a_state_never_load_in_place(field):
    # One-hot odometer weights chosen after the fact loaded in place: ε dropped from 2.262
    # to 2.082. The δ shares of the RDP filter are derived again alike.
    src = Ledger(3.0, 1e-5)
    src.charge(HYBRID_STEP, times=20)
    forged = _with_fixed(src.state_dict(), lambda fixed: _one_hot(fixed, field))
    target = Ledger(3.0, 1e-5)
    with pytest.raises(LedgerStateError, match=rf"{field}\.weights differs"):
        target.load_state_dict(forged)
    assert target.epsilon() == 0.0


def test_the_derivation_a_state_records_is_checked(state):
    assert state["derivation"] == 1
    older = copy.deepcopy(state)
    del older["derivation"]  # a state written before the field existed: version 1
    assert Ledger.load_state_dict(_resummed(older)).epsilon() == \
        Ledger.load_state_dict(state).epsilon()
    for unknown in (2, "1", True, None):
        newer = copy.deepcopy(state)
        newer["derivation"] = unknown
        with pytest.raises(LedgerStateError, match=r"derivation .* is not one this privguard"):
            Ledger.load_state_dict(_resummed(newer))


def _run_entries(state):
    return [e for e in state["journal"] if e[0] == "run"]


MALFORMED = {
    # -1 read the last mechanism (Python indexing from the end)
    "mechanism-index-minus-one": (lambda s: _run_entries(s)[0].__setitem__(1, -1),
                                  "mechanism index -1"),
    # a bool is not an int here (True counted as one charge)
    "count-true": (lambda s: _run_entries(s)[0].__setitem__(4, True), "count must be an integer"),
    # a second fix entry, identical, after the runs
    "duplicate-fix": (lambda s: s["journal"].append(copy.deepcopy(s["journal"][0])),
                      "a second fix entry"),
}


@pytest.mark.parametrize("load", _loaders())
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_rechecksummed_state_never_loads(state, load, name):
    edit, message = MALFORMED[name]
    bad = copy.deepcopy(state)
    edit(bad)
    assert bad["journal"][0][0] == "fix"
    with pytest.raises(LedgerStateError, match=message):
        load(_resummed(bad))


def test_an_in_place_load_of_a_0_1_state_points_to_the_class_method():
    import json
    from pathlib import Path

    old = json.loads((Path(__file__).parent / "data" / "state-0.1.json").read_text())
    with pytest.raises(LedgerStateError, match=r"0\.1 state .*Ledger\.load_state_dict\(state\)"):
        Ledger(3.0, 1e-5).load_state_dict(old)
    assert Ledger.load_state_dict(old).epsilon() > 0


def test_an_in_place_load_of_another_plans_fix_says_so(hybrid_state):
    from privguard import Plan

    # A ledger that fixed its plan (declared, 0 charges) and a state whose fix entry is
    # valid for another plan: the message names the fix entry, not the charge counts.
    ledger = Ledger(3.0, 1e-5, filter="hybrid", plan=Plan(HYBRID_STEP))
    forged = _with_fixed(hybrid_state, _scale_steps_a(0.5))
    forged["config"] = copy.deepcopy(ledger.state_dict()["config"])
    with pytest.raises(LedgerStateError, match=r"fix entry .*filter\.config\.steps_a differs"):
        ledger.load_state_dict(_resummed(forged))


def test_recorded_totals_within_the_rdp_tolerance_load_and_the_replay_is_used(state):
    # A state written before a curve's evaluation moved (issue 24: PureDP and Laplace went
    # up by up to ~1e-13 relative) still loads; the ledger uses the replayed totals.
    honest = Ledger.load_state_dict(state)
    older = copy.deepcopy(state)
    older["spent"] = [x * (1 - 1e-12) for x in state["spent"]]
    loaded = Ledger.load_state_dict(_resummed(older))
    assert loaded.epsilon() == honest.epsilon()
    edited = copy.deepcopy(state)
    edited["spent"] = [x * 0.5 for x in state["spent"]]
    with pytest.raises(LedgerStateError, match="recorded spent totals"):
        Ledger.load_state_dict(_resummed(edited))


def test_recorded_totals_below_a_revised_curve_load_above_it_never(state):
    # A curve revised up since the state was written (the subsampled Gaussian's fractional
    # orders rose by up to 1e-4 relative: privguard/_stores/_revision.py): recorded totals up
    # to 1e-4 below the replay load and the replay (the larger) is used; recorded totals
    # above the replay (a curve gone down) or further below it are refused.
    honest = Ledger.load_state_dict(state)
    for factor, loads in [(1 - 5e-5, True), (1 - 3e-4, False), (1 + 1e-7, False)]:
        revised = copy.deepcopy(state)
        revised["spent"] = [x * factor for x in state["spent"]]
        if loads:
            assert Ledger.load_state_dict(_resummed(revised)).epsilon() == honest.epsilon()
        else:
            with pytest.raises(LedgerStateError, match="recorded spent totals"):
                Ledger.load_state_dict(_resummed(revised))


@pytest.mark.parametrize("declared", [False, True])
def test_a_state_whose_plan_was_chosen_after_its_charges_never_loads(declared):
    # A plan (and the weights derived from it, consistently) picked after the charges:
    # Plan(step, steps=5000) lowered ε from 2.970 to 2.872 for 2000 charges of the step.
    from privguard import Plan
    from privguard._accounting._accounting import Accounting

    step = M.SubsampledGaussian(1.1, 0.01)
    src = Ledger(3.0, 1e-5, plan=Plan(step, steps=100) if declared else None)
    src.charge(step, times=2000)
    forged = copy.deepcopy(src.state_dict())
    fixed = Accounting(src._acc.config, fix_now=False).derive_fixed(Plan(step, steps=5000))
    forged["fixed"] = fixed
    forged["journal"][0] = ["fix", fixed]
    message = "declared plan" if declared else r"not Plan\(the first charge's mechanism\)"
    with pytest.raises(LedgerStateError, match=message):
        Ledger.load_state_dict(_resummed(forged))
