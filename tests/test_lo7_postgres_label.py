"""Task lo7, item 1: a label that the database's encoding cannot hold (a LATIN1 database,
whatever the client encoding) was written, refused by the server, reported as a
LedgerStateError and broke the ledger for good. It is refused before anything is decided,
as InvalidArgumentError naming ``label``; nothing is charged and the ledger goes on."""

from __future__ import annotations

import uuid

import pytest

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)


@pytest.fixture
def latin1_url(pg_server):
    srv = pg_server
    db = "latin1_" + uuid.uuid4().hex[:10]
    srv.admin(f"CREATE DATABASE {db} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
              "TEMPLATE template0")
    return srv.url(db=db, ledger="t" + uuid.uuid4().hex[:12])


def test_a_label_a_latin1_database_cannot_hold_is_refused_and_the_ledger_goes_on(latin1_url):
    ledger = Ledger(3.0, 1e-5, path=latin1_url)
    ledger.charge(STEP, label="café")  # in LATIN1: kept
    spent = ledger.epsilon()
    with pytest.raises(InvalidArgumentError, match=r"^label=") as info:
        ledger.charge(STEP, label="日本")
    assert "日本" in str(info.value) and "LATIN1" in str(info.value)
    assert len(ledger.history) == 1 and ledger.epsilon() == spent  # nothing charged
    ledger.charge(STEP, label="café")  # the ledger goes on (not broken)
    ledger.charge(STEP, label="plain")
    ledger.close()
    again = Ledger.open(latin1_url)
    assert [r.label for r in again.history] == ["café", "café", "plain"]
    assert again._store.verify()["charges"] == 3
    again.close()


def test_a_refused_label_is_refused_again_and_a_kept_one_is_not_asked_twice(latin1_url):
    ledger = Ledger(3.0, 1e-5, path=latin1_url)
    for _ in range(2):
        with pytest.raises(InvalidArgumentError, match=r"^label="):
            ledger.charge(STEP, label="€")  # not in LATIN1 (it is in WIN1252)
    ledger.charge(STEP, label="ä")
    assert ledger._store._labels_fit == {"ä"}
    ledger.charge(M.SubsampledGaussian(1.1, 0.01), label="ä")
    assert [r.label for r in ledger.history] == ["ä", "ä"]
    ledger.close()


def test_a_utf8_database_keeps_every_label_without_asking(pg):
    srv, db, name = pg
    ledger = Ledger(3.0, 1e-5, path=srv.url(db=db, ledger=name))
    ledger.charge(STEP, label="日本€")
    assert ledger._store._labels_fit == set()  # not asked, not kept (review rlo7)
    assert [r.label for r in ledger.history] == ["日本€"]
    ledger.close()


@pytest.mark.parametrize("label", ["a\x00b", "\ud800x"])
def test_sqlite_refuses_what_it_cannot_hold_up_front(tmp_path, label):
    """The analogue in SQLite (NUL, a lone surrogate) was already refused by check_label:
    kept here as the store's side of item 1 (the ledger goes on)."""
    ledger = Ledger(3.0, 1e-5, path=str(tmp_path / "b.db"))
    with pytest.raises(InvalidArgumentError, match=r"^label="):
        ledger.charge(STEP, label=label)
    ledger.charge(STEP, label="ok")
    assert [r.label for r in ledger.history] == ["ok"]
    ledger.close()
