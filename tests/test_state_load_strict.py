"""A re-checksummed state holding anything state_dict does not write never loads (review bx).

The unkeyed checksum is ``Integrity.from_environment().digest("state", body)``, which
anyone can recompute, so each edit below passes the checksum: the loader itself must
refuse an unknown key at any level, a mechanism no run uses, and an entry of another
arity. States written by earlier versions (no "derivation" key, privguard 0.1's format)
still load: tests/test_state_load.py and tests/test_migration.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._stores._integrity import Integrity, canonical

STEP = M.SubsampledGaussian(1.0, 0.01)
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def state():
    ledger = Ledger(3.0, 1e-5)
    for i in range(2):
        ledger.charge(STEP, label=f"s{i}")
    ledger.charge(M.Laplace(5.0), label="count")
    return ledger.state_dict()


@pytest.fixture(scope="module")
def retargeted(tmp_path_factory):
    path = tmp_path_factory.mktemp("retarget") / "r.db"
    ledger = Ledger(3.0, 1e-5, path=path)
    ledger.charge(STEP)
    ledger.close()
    ledger = Ledger(4.0, 1e-5, path=path, retarget="approved")
    ledger.charge(STEP)
    try:
        return ledger.state_dict()
    finally:
        ledger.close()


def _resummed(state):
    body = {k: v for k, v in state.items() if k != "checksum"}
    state["checksum"] = Integrity.from_environment().digest("state", body)
    return state


def _runs(state):
    return [e for e in state["journal"] if e[0] == "run"]


def _retarget(state):
    return next(e[1] for e in state["journal"] if e[0] == "event" and "old" in e[1])


def _swap_mechanisms(s):
    s["mechanisms"].reverse()
    for entry in _runs(s):
        entry[1] = 1 - entry[1]


def _duplicate_mechanism(s):
    # [STEP, Laplace] -> [STEP, STEP, Laplace], the second run using the copy
    s["mechanisms"].insert(1, copy.deepcopy(s["mechanisms"][0]))
    runs = _runs(s)
    assert [e[1] for e in runs] == [0, 0, 1]
    runs[1][1], runs[2][1] = 1, 2


EDITS = {
    # review bx's three
    "config-extra-key": (lambda s: s["config"].__setitem__("zz", 1), "configuration keys"),
    "unused-mechanism": (lambda s: s["mechanisms"].append(M.Gaussian(0.1).to_dict()),
                         "mechanisms are not the journal's"),
    "fix-extra-element": (lambda s: s["journal"][0].append(1), "entry 0: a fix entry has 2 elements"),
    # the same at the other levels
    "top-extra-key": (lambda s: s.__setitem__("zz", 1), r"unknown: \['zz'\]"),
    "top-missing-key": (lambda s: s.pop("fixed"), r"missing: \['fixed'\]"),
    "event-extra-element": (lambda s: s["journal"].append(["event", {"event": "x"}, 1]),
                            "entry 4: an event entry has 2 elements"),
    "entry-not-a-list": (lambda s: s["journal"].append("run"), "must be a non-empty list"),
    "shares-extra-key": (lambda s: s["config"]["shares"].__setitem__("zz", 1),
                         "exactly the keys type, params"),
    "duplicate-mechanism": (_duplicate_mechanism, "one mechanism twice"),
    "mechanisms-out-of-order": (_swap_mechanisms, "in order of first use"),
    "keyed-not-bool": (lambda s: s.__setitem__("keyed", 0), "not a bool"),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_an_edited_rechecksummed_state_never_loads(state, name):
    edit, message = EDITS[name]
    bad = copy.deepcopy(state)
    edit(bad)
    with pytest.raises(LedgerStateError, match=message):
        Ledger.load_state_dict(_resummed(bad))
    ledger = Ledger(3.0, 1e-5)
    ledger.charge(STEP)
    before = ledger.spent.tolist()
    with pytest.raises(LedgerStateError, match=message):
        ledger.load_state_dict(bad)
    assert ledger.spent.tolist() == before  # nothing loaded


def test_the_unedited_state_loads_rechecksummed(state):
    # the edits above are refused for the edit, not for the re-checksumming
    assert Ledger.load_state_dict(_resummed(copy.deepcopy(state))).epsilon() == \
        Ledger.load_state_dict(state).epsilon()


@pytest.mark.parametrize("side", ["old", "new"])
def test_a_retarget_with_an_extra_config_key_never_loads(retargeted, side):
    assert Ledger.load_state_dict(copy.deepcopy(retargeted)).epsilon() > 0
    bad = copy.deepcopy(retargeted)
    _retarget(bad)[side]["zz"] = 1
    with pytest.raises(LedgerStateError, match="configuration keys"):
        Ledger.load_state_dict(_resummed(bad))


def _v1(edit):
    state = json.loads((DATA / "state-0.1.json").read_text())
    edit(state)
    body = {k: v for k, v in state.items() if k != "checksum"}
    state["checksum"] = hashlib.sha256(canonical(body)).hexdigest()  # 0.1's checksum
    return state


def test_the_0_1_state_loads_and_edits_of_it_never_do():
    assert Ledger.load_state_dict(_v1(lambda s: None)).epsilon() > 0
    edits = {
        "keys .* are not the ones": lambda s: s.__setitem__("zz", 1),
        "record 3 must be a dict with keys": lambda s: s["records"][3].__setitem__("zz", 1),
        "record 3: index must be 3": lambda s: s["records"][3].__setitem__("index", 7),
    }
    for message, edit in edits.items():
        with pytest.raises(LedgerStateError, match=message):
            Ledger.load_state_dict(_v1(edit))
