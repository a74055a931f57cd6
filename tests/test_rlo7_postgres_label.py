"""Review rlo7 of task lo7, item 1 (a label the PostgreSQL database cannot keep).

1. A label the server converts into *another* string was let through: in an EUC_JP
   database "¦" (U+00A6) is stored as the code that reads back as "￤" (U+FFE4). The
   charge was committed under a digest of "¦", and the row then failed its digest chain:
   the next charge broke the ledger and it could never be opened again. ``accepts`` now
   reads the server's conversion back and refuses a label that does not come back whole.
2. A label the conversion refuses with another data error than untranslatable_character
   (an EUC_JIS_2004 database and U+0085: "invalid byte sequence", SQLSTATE 22021) was
   reported as a LedgerStateError ("cannot check the label"), which broke the ledger:
   the very failure item 1 removed for LATIN1. Any data error of the label is a refusal.
3. A UTF8 database asks nothing, and the labels it was given are not kept in a set that
   grows with every distinct label (it grew without bound).
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M

STEP = M.SubsampledGaussian(1.0, 0.01)


def _url(srv, encoding: str) -> str:
    db = "enc_" + uuid.uuid4().hex[:10]
    srv.admin(f"CREATE DATABASE {db} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' "
              "TEMPLATE template0")
    return srv.url(db=db, ledger="t" + uuid.uuid4().hex[:12])


@pytest.mark.parametrize(("encoding", "label"), [("EUC_JP", "¦"), ("EUC_JIS_2004", "a\x85")])
def test_a_label_the_server_would_change_or_reject_is_refused_and_the_ledger_goes_on(
        pg_server, encoding, label):
    url = _url(pg_server, encoding)
    ledger = Ledger(3.0, 1e-5, path=url)
    ledger.charge(STEP, label="x")
    spent = ledger.epsilon()
    with pytest.raises(InvalidArgumentError, match=r"^label=") as info:
        ledger.charge(STEP, label=label)
    assert encoding in str(info.value)
    assert len(ledger.history) == 1 and ledger.epsilon() == spent  # nothing charged
    ledger.charge(STEP, label="y")  # the ledger goes on
    ledger.close()
    again = Ledger.open(url)  # and opens: no row fails its digest
    assert [r.label for r in again.history] == ["x", "y"]
    assert again._store.verify()["charges"] == 2
    again.close()


def test_a_label_that_comes_back_whole_is_kept_in_euc_jp(pg_server):
    url = _url(pg_server, "EUC_JP")
    ledger = Ledger(3.0, 1e-5, path=url)
    ledger.charge(STEP, label="日本")
    ledger.close()
    again = Ledger.open(url)
    assert [r.label for r in again.history] == ["日本"]
    again.close()


def test_a_utf8_database_asks_nothing_and_keeps_no_label_set(pg, monkeypatch):
    srv, db, name = pg
    ledger = Ledger(3.0, 1e-5, path=srv.url(db=db, ledger=name))
    asked = []
    execute = psycopg.Connection.execute

    def counting(self, query, *args, **kwargs):
        if isinstance(query, str) and "::text" in query:
            asked.append(query)
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counting)
    for i in range(5):
        ledger.charge(STEP, label=f"étape {i}")
    assert asked == [] and len(ledger._store._labels_fit) == 0
    assert [r.label for r in ledger.history] == [f"étape {i}" for i in range(5)]
    ledger.close()


def test_the_kept_labels_of_a_latin1_database_stay_bounded(pg_server, monkeypatch):
    from privguard._stores import _postgres

    monkeypatch.setattr(_postgres, "_LABELS_KEPT", 4)
    ledger = Ledger(3.0, 1e-5, path=_url(pg_server, "LATIN1"))
    for i in range(10):
        ledger.charge(STEP, label=f"café {i}")
    assert len(ledger._store._labels_fit) <= 4
    assert len(ledger.history) == 10
    ledger.close()
