"""Files and states written by privguard 0.1 open, never silently.

tests/data/ledger-0.1.db and state-0.1.json were written by privguard 0.1.0
(commit 580131f): 71 charges in four runs, a retarget from ε = 3 to 4, and the
"tight" odometer, which reported ε = 3.224338293201262 for that file.

Nothing in a 0.1 file protects its configuration (only the journal rows are
chained), so the upgrade cross-checks it against the retarget events and
needs the target restated (``--epsilon 4 --delta 1e-5`` for that file).
Editing a copy's metadata here is what any editor of such a file can do.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sqlite3
from pathlib import Path

import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._cli._cli import main
from privguard._stores._migrate import upgrade

DATA = Path(__file__).parent / "data"
V01_EPSILON = 3.224338293201262
CONFIRM = ["--epsilon", "4", "--delta", "1e-5"]  # the target that file's ledger was given


@pytest.fixture()
def old_file(tmp_path):
    path = tmp_path / "budget.db"
    shutil.copy(DATA / "ledger-0.1.db", path)
    return path


def test_opening_a_0_1_file_refuses_and_names_the_upgrade_command(old_file):
    for opener in (lambda: Ledger.open(old_file), lambda: Ledger(4.0, 1e-5, path=old_file)):
        with pytest.raises(LedgerStateError, match="privguard upgrade"):
            opener()
    assert main(["report", str(old_file)]) == 2
    assert not (old_file.parent / "budget.db.v1").exists()  # nothing changed


def test_upgrade_verifies_logs_and_keeps_the_original(old_file, capsys):
    before = old_file.read_bytes()
    assert main(["upgrade", str(old_file), *CONFIRM]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["charges"] == 71 and (old_file.parent / "budget.db.v1").read_bytes() == before
    ledger = Ledger.open(old_file)
    # reports as before ("tight" files stay "tight"), or a rounding slack more: 0.1's
    # float value could be an ulp below the formula; it is raised now, never lowered (lo3)
    assert V01_EPSILON <= ledger.epsilon() <= V01_EPSILON * (1 + 1e-13)
    assert ledger._acc.config.odometer == "tight" and ledger.target == (4.0, 1e-5)
    migrate = ledger.events[0]
    assert migrate["event"] == "migrate" and migrate["rows"] == 71
    assert migrate["retargets"][0]["reason"] == "approved 4"
    assert migrate["target_restated"] == {"epsilon": 4.0, "delta": 1e-5}
    assert [(r.label, r.count) for r in ledger.runs] == [("train", 40), ("eval", 1),
                                                         ("train", 30)]
    ledger.charge(M.SubsampledGaussian(0.9, 0.01), label="train")  # and it keeps working
    assert main(["verify", str(old_file)]) == 0
    assert old_file.stat().st_size < 0.2 * len(before)  # runs, not one curve per charge


def test_upgrade_refuses_an_edited_0_1_file_and_changes_nothing(old_file):
    conn = sqlite3.connect(old_file)
    conn.execute("UPDATE journal SET label = 'edited' WHERE idx = 5")
    conn.commit()
    conn.close()
    _assert_refused(old_file, CONFIRM)


def test_a_0_1_state_loads_with_a_logged_migration():
    state = json.loads((DATA / "state-0.1.json").read_text())
    ledger = Ledger.load_state_dict(state)
    assert len(ledger.history) == 10 and ledger.events[0]["event"] == "migrate"
    assert ledger._acc.config.odometer == "tight"
    state["records"].pop()
    with pytest.raises(LedgerStateError):
        Ledger.load_state_dict(state)


def test_new_ledgers_cannot_choose_the_retired_odometer():
    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="retired"):
        Ledger(delta=1e-5, odometer="tight")
    assert Ledger(delta=1e-5)._acc.config.odometer == "mixture"


# -- helpers: edit a copy of the 0.1 file as anyone could (0.1 had no key) ----------------
def _assert_refused(path, args, match=None, capsys=None):
    """``privguard upgrade PATH ARGS`` exits 2 naming the file, and changes nothing."""
    before = path.read_bytes()
    if capsys is not None:
        capsys.readouterr()
    assert main(["upgrade", str(path), *args]) == 2
    if capsys is not None:
        err = capsys.readouterr().err
        assert err.startswith(f"privguard: {path}") and "error: " not in err, err
        if match is not None:
            assert match in err, err
    assert path.read_bytes() == before
    assert not path.with_name(path.name + ".v1").exists()


def _meta(path, **values):
    conn = sqlite3.connect(path)
    for key, value in values.items():
        conn.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))
    conn.commit()
    conn.close()


def _events(path):
    """The 0.1 file's retarget events, as stored in its meta table."""
    conn = sqlite3.connect(path)
    try:
        return json.loads(conn.execute("SELECT value FROM meta WHERE key='events'").fetchone()[0])
    finally:
        conn.close()


def _config(path):
    conn = sqlite3.connect(path)
    text = conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0]
    conn.close()
    return json.loads(text)


def _dumps(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)


def _rechain(path):
    """Recompute 0.1's SHA-256 row chain and totals digest after an edit (no key stops it)."""
    conn = sqlite3.connect(path)
    previous = "privguard-journal-v1"
    for row in conn.execute("SELECT idx, time, label, mechanism, curve, pid FROM journal "
                            "ORDER BY idx").fetchall():
        previous = hashlib.sha256(_dumps([previous, *row]).encode()).hexdigest()
        conn.execute("UPDATE journal SET digest = ? WHERE idx = ?", (previous, row[0]))
    conn.execute("UPDATE totals SET digest = ?", (previous,))
    conn.commit()
    conn.close()


def _retarget_free(path, budget):
    """The 0.1 file as if created with ``budget`` as its filter and never retargeted."""
    config = _config(path)
    config.update(budget)
    _meta(path, config=_dumps(config), events="[]", config_rev="0")


# -- H4: an edited 0.1 target is never adopted -----------------------------------------
def test_upgrade_without_a_restated_target_refuses_and_shows_the_confirming_command(
        old_file, capsys):
    _assert_refused(old_file, [], "claims the (ε, δ) target ε = 4.0, δ = 1e-05", capsys)
    assert main(["upgrade", str(old_file)]) == 2
    command = capsys.readouterr().err.rsplit("confirm it with: ", 1)[1].strip()
    assert command == f"privguard upgrade {old_file} --epsilon 4.0 --delta 1e-05"
    assert main(shlex.split(command)[1:]) == 0  # the command it shows is the one that works
    assert Ledger.open(old_file).target == (4.0, 1e-5)


@pytest.mark.parametrize("args", [
    ["--epsilon", "100", "--delta", "1e-5"],
    ["--epsilon", "4", "--delta", "1e-6"],
    ["--epsilon", "3", "--delta", "1e-5"],  # the target before its retarget
    ["--delta", "1e-5"],
    ["--no-target"],
])
def test_upgrade_refuses_a_restated_target_that_is_not_the_files(old_file, capsys, args):
    _assert_refused(old_file, args, "claims the (ε, δ) target ε = 4.0, δ = 1e-05", capsys)


def test_upgrade_refuses_a_0_1_config_edited_against_its_retarget_event(old_file, capsys):
    config = _config(old_file)
    config["filter"]["epsilon"] = 100.0
    _meta(old_file, config=_dumps(config))
    for args in ([], CONFIRM, ["--epsilon", "100", "--delta", "1e-5"]):
        _assert_refused(old_file, args, "is not the configuration its last retarget event "
                        "set: the file was edited", capsys)


def test_upgrade_refuses_a_consistently_edited_target_unless_restated(old_file, capsys):
    # config and its retarget event both say 100: only the restated target can catch it
    events = _events(old_file)
    config = _config(old_file)
    config["filter"]["epsilon"] = events[0]["new"]["filter"]["epsilon"] = 100.0
    _meta(old_file, config=_dumps(config), events=_dumps(events))
    _assert_refused(old_file, CONFIRM, "you stated the (ε, δ) target ε = 4.0, δ = 1e-05, but "
                    "this privguard 0.1 file claims the (ε, δ) target ε = 100.0", capsys)
    _assert_refused(old_file, [], "claims the (ε, δ) target ε = 100.0", capsys)


@pytest.mark.parametrize("edit, message", [
    ({"events": "[]"}, "'config_rev' = '1' does not count its 0 retarget events"),
    ({"config_rev": "0"}, "'config_rev' = '0' does not count its 1 retarget events"),
    ({"events": '[{"event": "migrate"}]'}, "0.1 event 0 is not a retarget event"),
])
def test_upgrade_refuses_0_1_retarget_records_that_disagree(old_file, capsys, edit, message):
    _meta(old_file, **edit)
    _assert_refused(old_file, CONFIRM, message, capsys)


def test_upgrade_refuses_retargets_that_do_not_chain(old_file, capsys):
    events = _events(old_file)
    second = {**events[0], "reason": "approved 100", "old": json.loads(_dumps(events[0]["new"]))}
    second["old"]["filter"]["epsilon"] = 100.0  # not what the first retarget set
    _meta(old_file, events=_dumps([events[0], second]), config_rev="2")
    _assert_refused(old_file, CONFIRM, "0.1 event 1: its old configuration is not the one the "
                    "previous retarget set", capsys)


def test_upgrade_refuses_a_retarget_that_changed_the_grid_or_odometer(old_file, capsys):
    events = _events(old_file)
    events[0]["old"]["odometer"] = "paper"
    _meta(old_file, events=_dumps(events))
    _assert_refused(old_file, CONFIRM, "'odometer' differs across the retarget", capsys)


def test_a_0_1_ledger_without_a_target_needs_its_delta_restated(old_file, capsys):
    _retarget_free(old_file, {"filter": None})
    _assert_refused(old_file, [], "claims no ε target (odometer only), δ = 1e-05", capsys)
    _assert_refused(old_file, ["--no-target"], "claims no ε target", capsys)
    _assert_refused(old_file, CONFIRM, "claims no ε target", capsys)
    assert main(["upgrade", str(old_file), "--delta", "1e-5"]) == 0
    assert Ledger.open(old_file).target is None


def test_a_0_1_ledger_without_target_or_delta_needs_no_target_stated(old_file, capsys):
    _retarget_free(old_file, {"filter": None, "delta": None})
    _assert_refused(old_file, [], f"confirm it with: privguard upgrade {old_file} --no-target",
                    capsys)
    _assert_refused(old_file, ["--delta", "1e-5"], "claims no ε target (odometer only), no δ",
                    capsys)
    assert main(["upgrade", str(old_file), "--no-target"]) == 0


def test_a_strict_0_1_ledger_needs_its_budget_restated(old_file, capsys):
    budget = [1e9] * len(_config(old_file)["orders"])
    _retarget_free(old_file, {"filter": {"kind": "strict", "budget": budget}})
    _assert_refused(old_file, [], "a strict per-order RDP budget", capsys)
    assert main(["upgrade", str(old_file)]) == 2
    command = capsys.readouterr().err.rsplit("confirm it with: ", 1)[1].strip()
    assert "--rdp-budget 1000000000.0,1000000000.0," in command
    _assert_refused(old_file, ["--rdp-budget", ",".join(["999"] * len(budget)), "--delta",
                               "1e-5"], "you stated a strict", capsys)
    assert main(shlex.split(command)[1:]) == 0


@pytest.mark.parametrize("kwargs, name", [
    ({"epsilon": "4", "delta": 1e-5}, "epsilon"),
    ({"epsilon": 4.0, "delta": 1.5}, "delta"),
    ({"epsilon": float("nan"), "delta": 1e-5}, "epsilon"),
    ({"epsilon": 4.0, "delta": 1e-5, "no_target": True}, "epsilon"),
    ({"no_target": "yes"}, "no_target"),
    ({"epsilon": 4.0, "delta": 1e-5, "rdp_budget": [1.0]}, "rdp_budget"),
    ({"delta": 1e-5, "rdp_budget": [1.0]}, "rdp_budget"),  # not one value per order
])
def test_upgrade_arguments_out_of_their_domain_are_named(old_file, kwargs, name):
    before = old_file.read_bytes()
    with pytest.raises(InvalidArgumentError) as info:
        upgrade(str(old_file), **kwargs)
    assert info.value.argument == name
    assert old_file.read_bytes() == before


# -- M5: an edited 0.1 file is refused with LedgerStateError, never a built-in ------------
@pytest.mark.parametrize("sql, rechain, message", [
    ("UPDATE meta SET value = '[1]' WHERE key = 'config'", False, "'config' is invalid"),
    ("UPDATE meta SET value = '{}' WHERE key = 'config'", False, "'config' is invalid"),
    ("UPDATE meta SET value = 'not json' WHERE key = 'config'", False, "'config' is not JSON"),
    ("UPDATE meta SET value = X'7B7D' WHERE key = 'config'", False, "'config' is bytes"),
    ("DELETE FROM meta WHERE key = 'events'", False, "'events' is missing"),
    ("UPDATE meta SET value = '5' WHERE key = 'events'", False, "'events' must be a list"),
    ("UPDATE meta SET value = '[5]' WHERE key = 'events'", False, "event 0 is not a retarget"),
    ("UPDATE meta SET value = '" + "[" * 100_000 + "]" * 100_000 + "' WHERE key = 'events'",
     False, "'events' is not JSON"),
    ("DELETE FROM totals", False, "the 0.1 totals row is missing"),
    ("UPDATE totals SET spent = 'x'", False, "spent curve is unreadable"),
    ("UPDATE journal SET mechanism = X'00' WHERE idx = 0", False,
     "row 0: column mechanism holds a bytes"),
    ("UPDATE journal SET label = X'00' WHERE idx = 0", False, "row 0: column label holds a bytes"),
    ("UPDATE journal SET time = 'abc' WHERE idx = 0", False, "row 0: column time holds a str"),
    ("UPDATE journal SET pid = 1.5 WHERE idx = 0", False, "row 0: column pid holds a float"),
    ("UPDATE journal SET mechanism = '\"x\"' WHERE idx = 0", True, "row 0 is unreadable"),
    ("UPDATE journal SET mechanism = '[]' WHERE idx = 0", True, "row 0 is unreadable"),
    ("UPDATE journal SET curve = '" + "[" * 100_000 + "]" * 100_000 + "' WHERE idx = 0", True,
     "row 0 is unreadable"),
    ("UPDATE journal SET curve = '[[1], 2]' WHERE idx = 0", True, "row 0 is unreadable"),
])
def test_upgrade_of_an_edited_0_1_file_raises_ledger_state_error(
        old_file, capsys, sql, rechain, message):
    conn = sqlite3.connect(old_file)
    conn.execute(sql)
    conn.commit()
    conn.close()
    if rechain:
        _rechain(old_file)
    with pytest.raises(LedgerStateError, match=str(old_file)):
        upgrade(str(old_file), 4.0, 1e-5)
    _assert_refused(old_file, CONFIRM, message, capsys)


def test_upgrade_of_a_file_that_is_not_a_database_raises_ledger_state_error(tmp_path, capsys):
    path = tmp_path / "budget.db"
    path.write_text("not a database")
    _assert_refused(path, CONFIRM, "not a readable SQLite ledger", capsys)
    (tmp_path / "dir.db").mkdir()
    assert main(["upgrade", str(tmp_path / "dir.db"), *CONFIRM]) == 2
