"""Review rlo7: the retarget reason is text a store keeps (in the retarget event), as a
label is, and it met neither of the label's checks.

1. A reason with a lone surrogate escaped ``Ledger(path=..., retarget=...)`` as Python's
   UnicodeEncodeError (a built-in exception out of a public call); it is refused as
   InvalidArgumentError naming ``retarget`` before any store is opened.
2. In a non-UTF8 PostgreSQL database a reason the encoding changes (EUC_JP "¦", read back
   "￤") was written under a digest of the original: the event row then failed its digest
   chain and the ledger never opened again. It is refused as InvalidArgumentError naming
   ``retarget``, nothing written; the ledger opens as before.
"""

from __future__ import annotations

import uuid

import pytest

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M


def test_a_reason_utf8_cannot_encode_is_refused_naming_retarget(tmp_path):
    path = str(tmp_path / "l.db")
    Ledger(3.0, 1e-5, path=path).close()
    with pytest.raises(InvalidArgumentError, match=r"^retarget="):
        Ledger(4.0, 1e-5, path=path, retarget="smaller\ud800")
    Ledger.open(path).close()  # nothing written: it opens as before
    Ledger(4.0, 1e-5, path=path, retarget="réduit").close()  # a kept reason: retargeted


def test_a_reason_the_database_would_change_is_refused_and_the_ledger_opens(pg_server):
    db = "enc_" + uuid.uuid4().hex[:10]
    pg_server.admin(f"CREATE DATABASE {db} ENCODING 'EUC_JP' LC_COLLATE 'C' LC_CTYPE 'C' "
                    "TEMPLATE template0")
    url = pg_server.url(db=db, ledger="t" + uuid.uuid4().hex[:12])
    ledger = Ledger(3.0, 1e-5, path=url)
    ledger.charge(M.Gaussian(10.0))
    ledger.close()
    with pytest.raises(InvalidArgumentError, match=r"^retarget=") as info:
        Ledger(4.0, 1e-5, path=url, retarget="¦")
    assert "EUC_JP" in str(info.value)
    again = Ledger.open(url)  # nothing written: it opens, at the old target
    assert len(again.history) == 1
    again.close()
    Ledger(4.0, 1e-5, path=url, retarget="日本").close()  # a reason it keeps
    Ledger.open(url).close()
