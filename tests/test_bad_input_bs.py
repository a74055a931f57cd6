"""Bad input and forged state, sweep bs: each test fails on the code before its fix.

A forger here recomputes the unkeyed SHA-256 digests (what anyone with privguard can do):
digests are consistent, so what must refuse is the forged content itself, with a
LedgerStateError (fail closed), never a built-in exception and never a ledger that opens.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from _tiny_opacus import private_linear

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._stores import _sqlite
from privguard._stores._integrity import Integrity
from privguard.tuning import (
    Poisson,
    _calibration,
    calibrate_noise_multiplier,
    calibrate_tuning_noise,
)

STEP = M.SubsampledGaussian(1.0, 0.01)


def _checkpointed(path, monkeypatch):
    """A file ledger with a lease-unused event, then a checkpoint that lists it."""
    ledger = Ledger(8.0, 1e-5, path=path, prefetch=False)
    for _ in range(20):
        ledger.charge(STEP, label="train")
    ledger.close()  # the lease's remainder: a lease-unused event
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 4)  # as at 512 rows, sooner
    ledger = Ledger.open(path, lease=1)
    for i in range(6):
        ledger.charge(STEP, label=f"l{i}")
    ledger.close()


def _forge_checkpoint(path, edit) -> None:
    """``edit`` the newest checkpoint's snapshot (a dict), then recompute its MAC."""
    conn = sqlite3.connect(path)
    file_id = conn.execute("SELECT value FROM meta WHERE key = 'file_id'").fetchone()[0]
    row = conn.execute("SELECT entries, last_count, head, prev, snapshot FROM checkpoints "
                       "ORDER BY entries DESC LIMIT 1").fetchone()
    snapshot = json.loads(row[4])
    edit(snapshot)
    text = json.dumps(snapshot)
    mac = Integrity(None).digest("checkpoint", file_id, *row[:4], text)
    conn.execute("UPDATE checkpoints SET snapshot = ?, mac = ? WHERE entries = ?",
                 (text, mac, row[0]))
    conn.commit()
    conn.close()


def _unused_event(snapshot):
    return next(e for e in snapshot["accounting"]["events"] if e["event"] == "lease-unused")


@pytest.mark.parametrize("change", [
    {"steps": -100}, {"steps": 10**9}, {"steps": "x"}, {"steps": None}, {"steps": 2.0},
    {"extra": 1}, {"mechanism": 5}, {"mechanism": {"type": "Gaussian", "noise_multiplier": -1}},
], ids=repr)
def test_a_checkpoint_event_is_checked_as_a_journal_event_is(tmp_path, monkeypatch, change):
    # On the code before: a checkpoint's events were checked for their kind only, so a
    # remainder of -100 or 10**9 steps opened (leased_unused -100: released steps beyond
    # the charges), one of "x" or None steps raised ValueError/TypeError from
    # leased_unused, and an event with other keys or an unreadable mechanism opened.
    path = tmp_path / "c.db"
    _checkpointed(path, monkeypatch)
    _forge_checkpoint(path, lambda snap: _unused_event(snap).update(change))
    with pytest.raises(LedgerStateError, match="checkpoint"):
        Ledger.open(path)


def test_checkpoint_remainders_beyond_the_charges_are_refused(tmp_path, monkeypatch):
    # Each event within the charges, together more than them: the released steps would be
    # negative (recorded remainders are charges, docs/theory.md §13).
    path = tmp_path / "s.db"
    _checkpointed(path, monkeypatch)

    charges = len(Ledger.open(path, read_only=True).history)

    def double(snap):
        # copies of the checkpoint's own remainder, each within the charges alone (the
        # journal's at the checkpoint are at most ``charges``), together beyond them
        event = _unused_event(snap)
        copies = charges // event["steps"] + 1
        snap["accounting"]["events"].extend(dict(event) for _ in range(copies))

    _forge_checkpoint(path, double)
    with pytest.raises(LedgerStateError, match="checkpoint"):
        Ledger.open(path)


def test_an_honest_checkpoint_with_a_remainder_still_opens(tmp_path, monkeypatch):
    path = tmp_path / "h.db"
    _checkpointed(path, monkeypatch)
    _forge_checkpoint(path, lambda snap: None)  # the MAC recomputed, nothing changed
    ledger = Ledger.open(path)
    assert 0 < ledger.leased_unused < 20
    ledger.charge(STEP, label="train")
    ledger.close()


@pytest.mark.parametrize("column,value", [("count", "count + 0.9"), ("pid", "pid + 0.5")])
@pytest.mark.parametrize("read_only", [False, True])
def test_a_keyed_run_row_edited_to_a_fraction_is_refused(tmp_path, monkeypatch, column,
                                                         value, read_only):
    # A keyed ledger: the editor cannot recompute the HMAC chain. On the code before, a
    # run row (not the last one) whose count 5 was edited to 5.9, or whose pid gained
    # .5, was read back truncated to the value its digest covers: the edit went unseen.
    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", "s3cret")
    monkeypatch.delenv("PRIVGUARD_LEDGER_KEY_FILE", raising=False)
    path = tmp_path / "k.db"
    ledger = Ledger(8.0, 1e-5, path=path, lease=1)
    for _ in range(5):
        ledger.charge(M.Gaussian(40.0), label="a")
    ledger.charge(M.Gaussian(40.0), label="b")
    ledger.close()
    conn = sqlite3.connect(path)
    conn.execute(f"UPDATE entries SET {column} = {value} WHERE label = 'a'")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerStateError, match="not an integer"):
        Ledger.open(path, read_only=read_only)


@pytest.mark.parametrize("keyed", ["yes", "2", "", "true"])
def test_an_ambiguous_keyed_flag_is_refused(tmp_path, keyed):
    # On the code before, any value but "1" read as unkeyed: a file whose flag was edited
    # from "0" to "yes" opened and charged as if nothing were edited.
    path = tmp_path / "f.db"
    Ledger(8.0, 1e-5, path=path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'keyed'", (keyed,))
    conn.commit()
    conn.close()
    with pytest.raises(LedgerStateError, match="keyed"):
        Ledger.open(path)


class _Bounded:
    """A ``fits`` for the calibration's search that fails the test past ``limit`` calls
    (a search that never ends, on the code before, fails instead of hanging)."""

    def __init__(self, fits, limit: int = 400) -> None:
        self.fits, self.limit, self.calls = fits, limit, 0

    def __call__(self, sigma: float) -> bool:
        self.calls += 1
        assert self.calls <= self.limit, "the search does not end"
        return self.fits(sigma)


@pytest.mark.parametrize("rtol", [0, -1, -0.0, float("nan"), float("inf"), "1", True, 10**400,
                                  None], ids=repr)
@pytest.mark.parametrize("calibrate", ["noise", "tuning"])
def test_calibration_rtol_is_checked(monkeypatch, rtol, calibrate):
    # On the code before, rtol was used unchecked: 0 or a negative one bisected forever,
    # "1" raised TypeError, 10**400 OverflowError, NaN stopped the search at once.
    search = _calibration.smallest_sigma
    monkeypatch.setattr(_calibration, "smallest_sigma",
                        lambda fits, *a, **k: search(_Bounded(fits), *a, **k))
    with pytest.raises(InvalidArgumentError, match="rtol"):
        if calibrate == "noise":
            calibrate_noise_multiplier(0.01, 10, 3.0, 1e-5, rtol=rtol)
        else:
            calibrate_tuning_noise(0.01, 10, Poisson(2.0), 3.0, 1e-5, rtol=rtol)


def test_an_rtol_below_float_precision_ends_at_a_sigma_that_fits():
    # On the code before, the bracket stopped shrinking at adjacent floats, above such an
    # rtol, and the bisection went on forever.
    fits = _Bounded(lambda sigma: sigma >= 1.2345)
    sigma = _calibration.smallest_sigma(fits, rtol=1e-300)
    assert sigma >= 1.2345 and sigma - 1.2345 < 1e-12


@pytest.mark.parametrize("spent", [[10**400, 0.0, 0.0], [0.1, 0.2, 10**400], ["0.1"] * 3,
                                   [True, False, True], [b"1"] * 3], ids=repr)
@pytest.mark.parametrize("batch", [False, True])
def test_odometer_spent_must_be_numbers(spent, batch):
    # On the code before, a spent curve holding 10**400 raised OverflowError, and strings
    # or bools were read as numbers ("0.1" as 0.1).
    from privguard import Odometer

    odometer = Odometer([2.0, 4.0, 8.0])
    with pytest.raises(InvalidArgumentError, match="spent"):
        (odometer.epsilon_batch if batch else odometer.epsilon)(spent, 1e-5)


@pytest.mark.parametrize("held", [5, "ab", [[1.0, 0.01]], [[1.0, 0.01, "3"]], [None],
                                  [[float("nan"), 0.01, 1]], [[1.0, 0.01, -3]],
                                  [[True, 0.01, 1]]], ids=repr)
def test_an_edited_accountant_history_in_a_checkpoint_entry_is_refused(held):
    # On the code before, attach(resume=entry) read the entry's accountant_history as
    # (σ, q, steps) triples unchecked: 5 raised TypeError, [[1.0, 0.01]] ValueError,
    # [[1.0, 0.01, "3"]] TypeError; NaN or negative steps were taken.
    _, opt, _ = private_linear("rdp")  # (skips without torch or Opacus)
    from privguard.integrations._checkpoint import ledger_entry
    from privguard.integrations.opacus import attach

    entry = ledger_entry(Ledger(3.0, 1e-5), [])
    entry["accountant_history"] = held
    ledger = Ledger(3.0, 1e-5)
    with pytest.raises(LedgerStateError, match="accountant_history"):
        attach(opt, ledger, resume=entry, check_poisson=False)
    assert len(ledger.history) == 0
