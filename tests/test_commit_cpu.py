"""A commit's CPU work, cut without changing a byte of what is written (issue 26, t26).

Two cuts: a digest over strs and ints only (a journal head's MAC) is encoded directly,
not through ``json.dumps`` (``_integrity._canonical_flat``), and the SQLite store
remembers the last head MAC it computed (the next transaction's check of the head it
reads back asks for the same one). Both must leave every digest, MAC and row as before:
checked here against ``canonical`` directly, and by writing the same journal with and
without them (time, file id and pid fixed) and comparing the files' rows.
"""

from __future__ import annotations

import itertools
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privguard import Ledger
from privguard import mechanisms as M
from privguard._stores import _integrity, _sqlite
from privguard._stores._integrity import Integrity, canonical

PARTS = st.lists(st.one_of(st.text(), st.integers(min_value=-(2**70), max_value=2**70),
                           st.text(alphabet="\x00\x1f\"\\\u2028\u00e9\U0001f600abc")),
                 max_size=8)


@settings(max_examples=300, deadline=None)
@given(PARTS)
def test_the_flat_encoding_is_canonicals(parts):
    try:
        expected = canonical(list(parts))
    except UnicodeEncodeError:  # a lone surrogate: both refuse it
        with pytest.raises(UnicodeEncodeError):
            _integrity._canonical_flat(tuple(parts))
        return
    assert _integrity._canonical_flat(tuple(parts)) == expected


@pytest.mark.parametrize("part", [True, 1.5, None, [1], {"a": 1}, float("nan")])
def test_anything_but_str_and_int_takes_the_json_path(part):
    assert _integrity._canonical_flat(("head", part)) is None
    for key in (None, b"k"):
        assert Integrity(key).digest("head", part) == Integrity(key)._hex(
            canonical(["head", part]))


def _journal(path, monkeypatch, fast: bool) -> list:
    """Write one journal (fix, runs, leases, a lease-unused event, an event, a checkpoint)
    with time, file id and pid fixed, and return every row of every table."""
    ticks = itertools.count(1_700_000_000.0, 0.25)
    monkeypatch.setattr("time.time", lambda: next(ticks))
    monkeypatch.setattr("uuid.uuid4", lambda: type("U", (), {"hex": "0" * 32})())
    if not fast:  # the code before: every digest through json, no memo
        monkeypatch.setattr(_integrity, "_canonical_flat", lambda parts: None)
        monkeypatch.setattr(_sqlite.SQLiteStore, "_head_mac", lambda self, c: self.integrity
                            .digest("head", self.file_id, *c.as_tuple()))
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 16)  # several checkpoints, quickly
    # prefetch off: the two journals are compared bit for bit, and a background commit's
    # timing moves the lease boundaries and the ticks (review rpf: failed at the pf head)
    ledger = Ledger(30.0, 1e-5, path=path, prefetch=False)
    for i in range(300):
        ledger.charge(M.SubsampledGaussian(1.0, 0.01), label="train")
        if i % 97 == 0:
            ledger.charge(M.Gaussian(50.0 + i), label=f"eval {i}")
    ledger.close()
    ledger = Ledger(31.0, 1e-5, path=path, retarget="more data", lease=1)
    for i in range(40):  # a row each
        ledger.charge(M.Laplace(1000.0), label=f"{i % 2}")
    ledger.close()
    monkeypatch.undo()
    conn = sqlite3.connect(path)
    try:
        return [conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
                for t in ("meta", "mechanisms", "entries", "checkpoints", "head")]
    finally:
        conn.close()


@pytest.mark.parametrize("key", [None, "a ledger key"])
def test_a_journal_is_written_bit_for_bit_as_before(tmp_path, monkeypatch, key):
    if key is not None:
        monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", key)
    before = _journal(tmp_path / "before.db", monkeypatch, fast=False)
    if key is not None:
        monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", key)
    after = _journal(tmp_path / "after.db", monkeypatch, fast=True)
    assert len(before[3]) >= 3  # checkpoints were written (their MACs too)
    assert before == after


def test_the_run_digest_memo_answers_only_what_the_function_would(tmp_path):
    # Equal inputs whose texts differ (0.0 and -0.0; an int count against a float) are
    # computed, never answered from the memo.
    ledger = Ledger(3.0, 1e-5, path=tmp_path / "m.db")
    store = ledger._store
    args = ("p" * 64, 3, "m" * 64, "train", 7, 5)
    for first, last in [(0.0, -0.0), (-0.0, 0.0), (1.5, 2.5), (1.5, 2.5)]:
        got = store._run_digest(*args, first, last)
        text = (f"entry\x1e{args[0]}\x1e3\x1erun\x1e{args[2]}\x1e\"train\"\x1e7\x1e5"
                f"\x1e{first!r}\x1e{last!r}")
        assert got == store.integrity.digest_text(text)
    ledger.close()
