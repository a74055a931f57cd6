"""A resume from an earlier checkpoint of a run takes that run's later entries (private).

An in-memory ledger travels whole in a checkpoint's entry (:mod:`._checkpoint`). A resume
from an earlier checkpoint of a run whose later checkpoints are still saved (a rewind: the
later steps ran, and their checkpoints were written out) brought a fresh in-memory ledger
back to the earlier checkpoint's charges, while a file-backed one keeps them all: a ledger
never goes backwards. The framework callback finds the entries the same run wrote (its
run id in ``entry["checkpoint"]["run"]``) and hands them here; the ledger takes the one
with the most charges.

The run's entries must be one journal prefix chain (each a prefix of the one taken, which
extends the ledger): two that fork (branches of the run, each of which spent budget that
the other does not hold) cannot both be held by one in-memory ledger, and the resume is
refused rather than one branch's charges dropped. Entries of another run are never looked
at here: unrelated ledgers are never merged.
"""

from __future__ import annotations

import warnings
from typing import Any

from privguard._errors import LedgerStateError
from privguard._ledger._ledger import Ledger
from privguard.integrations._checkpoint import check_entry, holds, restore

__all__ = ["carry_later"]


def carry_later(ledger: Ledger, found: list[tuple[str, dict[str, Any]]], *, resumed: str,
                stacklevel: int = 2) -> None:
    """Bring the in-memory ``ledger`` to the entry of ``found`` with the most charges.

    Args:
        ledger: the ledger, already restored from the checkpoint resumed from.
        found: ``(path, entry)`` of every entry of the resumed run (its in-memory entries;
            the resumed one may be among them).
        resumed: the checkpoint resumed from, for the messages.

    Raises:
        LedgerStateError: the run's entries are not one prefix chain that extends the
            ledger (a fork, an edited entry); the ledger is then left as it was.
    """
    for where, entry in found:  # an edited entry of the run refuses the resume (fail closed)
        check_entry(entry, where)
        if entry.get("state") is None:
            raise LedgerStateError(f"{where}: the entry names the run resumed from but holds "
                                   "no in-memory ledger state, as that run's entries do")
    if not found:
        return
    before = len(ledger.history)
    path, top = max(found, key=lambda row: (row[1]["charges"], row[0]))
    if top["charges"] <= before:
        chain = ledger
    else:
        try:  # a separate ledger: the chain is checked before this one moves
            chain = Ledger.load_state_dict(top["state"])
        except LedgerStateError as exc:
            raise LedgerStateError(
                f"training resumes from {resumed}, whose run's later checkpoint {path} holds "
                f"an entry this ledger cannot take: {exc}") from None
    for other, entry in found:
        if not holds(chain, entry["charges"], entry["fingerprint"]):
            raise LedgerStateError(
                f"training resumes from {resumed}, and the checkpoints of its run fork: "
                f"{other} ({entry['charges']} charges) is not a prefix of "
                f"{path if chain is not ledger else 'the ledger'} ({len(chain.history)} "
                "charges). Both branches ran, and one in-memory ledger cannot hold the "
                "charges of both (nor is either dropped): the privacy loss is both branches' "
                "together. A file-backed ledger (Ledger(..., path=...)) keeps every charge of "
                "every branch")
    if chain is ledger:
        return
    try:
        restore(ledger, top, where=path)
    except LedgerStateError as exc:
        raise LedgerStateError(
            f"training resumes from {resumed}, whose run's later checkpoint {path} holds "
            f"charges this ledger cannot take: {exc}") from None
    warnings.warn(
        f"training resumes from {resumed}, of a run that went on to later checkpoints: the "
        f"ledger now holds the entry {path} ({len(ledger.history)} charges, "
        f"{len(ledger.history) - before} carried over from the later checkpoints): those "
        "steps ran, and a ledger never goes backwards", UserWarning, stacklevel=stacklevel)
