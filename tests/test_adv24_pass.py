"""One more adversarial pass over issue 24's fixes (adv24): each test failed before.

A state is re-checksummed with the library's own unkeyed digest: what anyone without
a ledger key can write.
"""

from __future__ import annotations

import copy

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._integrity import Integrity

STEP = M.SubsampledGaussian(1.1, 0.01)


def _resummed(state):
    body = {k: v for k, v in state.items() if k != "checksum"}
    state["checksum"] = Integrity(None).digest("state", body)
    return state


def _with_event(ledger, body):
    state = copy.deepcopy(ledger.state_dict())
    state["journal"].append(["event", body])
    return _resummed(state)


@pytest.fixture()
def odometer_ledger():
    ledger = Ledger(delta=1e-6)
    ledger.charge(STEP, times=200)
    return ledger


def test_a_forged_migrate_event_appended_to_a_checkpoint_cannot_move_the_guarantee(
        odometer_ledger):
    # Before: loaded in place, a migrate event listing a 0.1 "retarget" from δ = 0.5 made
    # guarantee() state the odometer at δ = 0.5 (ε 1.14 instead of 3.26 at 10⁻⁶ for 2000
    # steps): a δ of the forger's choosing, and a smaller ε than the honest ledger reports.
    honest = odometer_ledger.guarantee()
    forged = _with_event(odometer_ledger, {"event": "migrate", "retargets": [
        {"event": "retarget", "old": {"delta": 0.5}, "new": {"delta": 1e-6}}]})
    for load in (odometer_ledger.load_state_dict, Ledger.load_state_dict):
        with pytest.raises(LedgerStateError, match="retargets outside the migrate event"):
            load(forged)
    assert odometer_ledger.guarantee() == honest


def test_a_migrate_event_opening_a_checkpoint_is_refused_in_place():
    # A fresh ledger has an empty journal, so a state that opens with a migrate event
    # "extends" it; an in-memory ledger never migrates, so in place it is refused.
    src = Ledger(delta=1e-6)
    src._acc.replay_event({"event": "migrate", "retargets": []})
    src.charge(STEP)
    state = src.state_dict()
    with pytest.raises(LedgerStateError, match="retargets this ledger"):
        Ledger(delta=1e-6).load_state_dict(state)
    assert Ledger.load_state_dict(state).epsilon() == src.epsilon()


@pytest.mark.parametrize("retargets", [
    [{"old": 5}],  # not a retarget: guarantee() raised AttributeError on the loaded ledger
    [{"event": "retarget", "old": 5, "new": 5}],
    "x",
    [{"event": "retarget", "old": {"delta": 0.5}, "new": {"delta": 0.25}}],  # ends elsewhere
])
def test_malformed_migrated_retargets_fail_closed(retargets):
    src = Ledger(delta=1e-6)
    state = copy.deepcopy(src.state_dict())
    state["journal"].insert(0, ["event", {"event": "migrate", "retargets": retargets}])
    with pytest.raises(LedgerStateError, match="migrat"):
        Ledger.load_state_dict(_resummed(state))
