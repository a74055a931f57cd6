"""One more adversarial pass over issue 24's fixes (adv24): each test failed before.

A state is re-checksummed with the library's own unkeyed digest: what anyone without
a ledger key can write.
"""

from __future__ import annotations

import copy

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._stores._integrity import Integrity
from privguard.tuning import Choice, Poisson, RandomSearch

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
    src._acc.replay_event({"event": "migrate", "retargets": [], "time": 0.0, "pid": 1,
                           "from": "privguard 0.1 (schema 1)", "rows": 0, "final_digest": "",
                           "target_restated": None})  # the keys privguard writes (review bi)
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


class _NoRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


def _deep(depth=100_000):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("call", [
    # repr(10**5000) raises ValueError (Python's digit limit): it escaped as a plain one
    lambda: Ledger(3.0, 1e-5).charge(M.Gaussian(2.0), times=10**5000),
    lambda: M.Gaussian(10**5000),
    # repr of a deeply nested list raises RecursionError; a user's __repr__ anything
    lambda: Ledger(3.0, 1e-5).charge(M.Gaussian(2.0), label=_deep()),
    lambda: Ledger(3.0, 1e-5).charge(M.Gaussian(2.0), label=_NoRepr()),
], ids=["huge-times", "huge-sigma", "deep-label", "raising-repr"])
def test_a_refused_argument_whose_repr_fails_is_still_an_invalid_argument_error(call):
    from privguard import InvalidArgumentError

    ledger_free = Ledger(3.0, 1e-5)
    with pytest.raises(InvalidArgumentError, match="is invalid"):
        call()
    assert ledger_free.epsilon() == 0.0


class _BadFloat:
    def __float__(self):
        raise RuntimeError("no float")


@pytest.mark.parametrize("utilities", [10**400, [10**400], _BadFloat(), [_BadFloat()]],
                         ids=["huge-int", "huge-int-list", "raising-float", "raising-list"])
def test_propose_test_select_refuses_unconvertible_utilities_before_any_round(utilities):
    from privguard import InvalidArgumentError
    from privguard.tuning import ProposeTest

    ledger = Ledger(3.0, 1e-5)
    tuner = ProposeTest([{"a": 1}], epsilon0=0.1, partitions=5, seed=1, progress=False)
    with pytest.raises(InvalidArgumentError, match="utilities"):
        tuner.select(utilities, ledger)
    assert ledger.epsilon() == 0.0


def test_report_after_a_retarget_states_the_running_epsilon_at_the_delta_fixed_first(tmp_path):
    # Before: `privguard report` printed "running ε 2.3338 at δ = 0.001 (...; valid under
    # adaptivity)" for a ledger created at δ = 10⁻⁶ and retargeted to 10⁻³ after its
    # outputs, a δ chosen afterwards (guarantee() already said 3.262 at 10⁻⁶); the plot's
    # running curve too.
    from privguard._cli._report import report, trajectory

    path = str(tmp_path / "r.db")
    with Ledger(delta=1e-6, path=path) as ledger:
        ledger.charge(STEP, times=200)
    with Ledger(delta=1e-3, path=path, retarget="chosen after the outputs") as ledger:
        stated = ledger.guarantee()
        data = report(ledger)
        running = trajectory(ledger, points=3)["running_epsilon"]
        assert ledger.epsilon() == stated.epsilon  # the default δ is the stated one too
    assert stated.delta == 1e-6
    assert (data["running_delta"], data["running_epsilon"]) == (1e-6, stated.epsilon)
    assert "fixed before the first output" in data["running_statement"]
    assert running[-1] == pytest.approx(stated.epsilon, rel=1e-12)


class _BadIter:
    def __iter__(self):
        raise RuntimeError("no iteration")


@pytest.mark.parametrize("make", [
    lambda: Choice(_BadIter()),
    lambda: RandomSearch({"lr": Choice(_BadIter())}, Poisson(3.0), cost=M.Gaussian(5.0)),
], ids=["choice", "in-a-space"])
def test_a_choice_whose_values_raise_on_iteration_is_an_invalid_argument_error(make):
    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="values"):
        make()


def test_fix_records_nudged_within_the_float_tolerance_never_lower_epsilon():
    # check_fix accepts recorded floats within 1e-9 relative of the derived ones (another
    # CPU's libm). Before, the recorded ones were installed: one mixture weight nudged up
    # by 9.9e-10 lowered ε from 2.2617724925066125 to 2.261772492501391. Now the derived
    # record is installed, so no nudge moves ε.
    src = Ledger(delta=1e-5)
    src.charge(STEP, times=1000)
    honest, state = src.epsilon(), src.state_dict()
    weights = state["fixed"]["odometer"]["weights"]
    top = sorted(range(len(weights)), key=lambda i: -weights[i])[:12]
    for i in top:
        forged = copy.deepcopy(state)
        nudged = list(weights)
        nudged[i] *= 1 + 9.9e-10
        forged["fixed"]["odometer"]["weights"] = nudged
        next(e for e in forged["journal"] if e[0] == "fix")[1]["odometer"]["weights"] = nudged
        loaded = Ledger.load_state_dict(_resummed(forged))
        assert loaded.epsilon() == honest
        assert loaded.state_dict()["fixed"] == state["fixed"]  # the derived record is kept


class _BadPath:
    def __fspath__(self):
        raise RuntimeError("no path")


@pytest.mark.parametrize("path", ["/tmp/adv24-a\0b.db", _BadPath()], ids=["nul", "raising-fspath"])
@pytest.mark.parametrize("opener", ["new", "open"])
def test_an_unusable_path_is_an_invalid_argument_error(path, opener):
    # Before: sqlite3's ValueError ("embedded null byte") and the caller's RuntimeError
    # escaped Ledger(path=...).
    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="path="):
        Ledger(3.0, 1e-5, path=path) if opener == "new" else Ledger.open(path)


def test_upgrade_leaves_no_stray_journal_of_its_temporary_file(tmp_path, capsys):
    # Before: "budget.db.upgrading-journal" (the temporary's TRUNCATE-mode journal) stayed
    # next to the upgraded file.
    import shutil
    from pathlib import Path

    from privguard._cli._cli import main

    path = tmp_path / "budget.db"
    shutil.copy(Path(__file__).parent / "data" / "ledger-0.1.db", path)
    assert main(["upgrade", str(path), "--epsilon", "4", "--delta", "1e-5"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.db", "budget.db.v1"]
