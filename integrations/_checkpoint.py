"""The ledger's entry in a training checkpoint: written at save, restored at resume (private).

One format for Opacus, Lightning and Hugging Face checkpoints. An entry says
which journal the ledger held when the checkpoint was written:

* an in-memory ledger travels whole: its verified ``state_dict`` is in the
  entry, and a resume loads it into the resuming ledger with
  ``ledger.load_state_dict`` (a fresh ledger takes it; one that already spent
  more refuses, because a ledger never goes backwards);
* a file-backed ledger stays in its file: the entry holds the file's path,
  the journal length and a fingerprint of the journal, and a resume checks
  that the resuming ledger holds that journal (reopen the same file).

Either way a resumed run starts from at least what was spent before the
checkpoint; anything else raises :class:`privguard.LedgerStateError` naming
what to do. For Opacus the entry also records the history of Opacus' own
accountant at save time: the steps the ledger already holds.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from privguard import _validation as check
from privguard._errors import InvalidArgumentError, LedgerStateError, _shown
from privguard._ledger._ledger import Ledger

__all__ = ["ENTRY_FORMAT", "check_entry", "holds", "is_entry", "ledger_entry", "restore"]

ENTRY_FORMAT = "privguard.checkpoint"
ENTRY_VERSION = 1


def _fingerprint(ledger: Ledger, count: int) -> str:
    """A digest of the first ``count`` charges (label and mechanism) of ``ledger``.

    Computed from the journal's runs (label, mechanism, how many of the first
    ``count`` charges), so it costs O(runs), not O(charges).
    """
    rows: list[list[Any]] = []
    for run in ledger.runs:
        if run.start >= count:
            break
        n = min(run.count, count - run.start)
        if rows and rows[-1][:2] == [run.label, run.mechanism.to_dict()]:
            rows[-1][2] += n  # runs that differ only by process are one sequence here
        else:
            rows.append([run.label, run.mechanism.to_dict(), n])
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def ledger_entry(ledger: Ledger, accountant_history: list | None = None) -> dict[str, Any]:
    """The entry to store in a checkpoint for ``ledger`` (JSON-ready).

    Example:
        >>> from privguard import Ledger, mechanisms as M
        >>> ledger = Ledger(delta=1e-5)
        >>> _ = ledger.charge(M.SubsampledGaussian(1.0, 0.01))
        >>> entry = ledger_entry(ledger)
        >>> entry["charges"], entry["path"] is None
        (1, True)
        >>> restore(Ledger(delta=1e-5), entry, where="example").history[0].index
        0
    """
    n = len(ledger.history)
    return {
        "format": ENTRY_FORMAT,
        "version": ENTRY_VERSION,
        "path": ledger.path,
        "state": ledger.state_dict() if ledger.path is None else None,
        "charges": n,
        "fingerprint": _fingerprint(ledger, n),
        "accountant_history": (None if accountant_history is None
                               else [[float(s), float(q), int(k)] for s, q, k in accountant_history]),
    }


def is_entry(value: Any) -> bool:
    """Whether ``value`` looks like an entry written by :func:`ledger_entry`."""
    # a str first: an array compared element-wise, and its truth value raised (review fs)
    return isinstance(value, dict) and isinstance(value.get("format"), str) \
        and value.get("format") == ENTRY_FORMAT


def check_entry(entry: Any, where: str) -> None:
    """Raise unless ``entry`` is a well-formed entry this privguard reads."""
    if not is_entry(entry):
        raise InvalidArgumentError(where, type(entry).__name__,
                                   "is not a privguard checkpoint entry")
    version = entry.get("version")
    if not isinstance(version, int) or not 1 <= version <= ENTRY_VERSION:
        raise LedgerStateError(f"{where}: checkpoint entry version {_shown(version)} is not "
                               f"supported by this privguard (supports up to {ENTRY_VERSION})")
    if not isinstance(entry.get("charges"), int) or entry["charges"] < 0 \
            or not isinstance(entry.get("fingerprint"), str):
        raise LedgerStateError(f"{where}: checkpoint entry is malformed")
    held = entry.get("accountant_history")
    if held is not None and not (isinstance(held, (list, tuple)) and all(map(is_step_row, held))):
        # read as (σ, q, steps) triples at resume: 5 raised TypeError there, [[1.0, 0.01]]
        # ValueError (task bs)
        raise LedgerStateError(f"{where}: checkpoint entry is malformed (accountant_history "
                               f"{check.short(held)} is not a list of [σ, q, steps] as "
                               "privguard writes it)")


def is_step_row(row: Any) -> bool:
    """Whether ``row`` is an accountant history row (σ, q, steps) as :func:`ledger_entry`
    writes it, or with numpy or torch numbers in place of Python's (the resume reads them
    as they are, as it did before bs refused them: review rbs)."""
    if not isinstance(row, (list, tuple)) or len(row) != 3:
        return False
    sigma, q, k = (_item(x) for x in row)
    reals = [check._real(x) for x in (sigma, q)]
    return all(x is not None and math.isfinite(x) and x >= 0 for x in reals) \
        and type(k) is int and k >= 0


def _item(x: Any) -> Any:
    """The number of a 0-d tensor, array or numpy scalar (``tensor(0.01).item()``);
    anything else as it is."""
    if getattr(x, "ndim", None) == 0 and callable(getattr(x, "item", None)):
        try:
            return x.item()
        except Exception:  # not a number after all: refused as it is
            return x
    return x


def restore(ledger: Ledger, entry: Any, *, where: str) -> Ledger:
    """Bring ``ledger`` to (at least) the journal ``entry`` describes, or raise.

    Raises:
        InvalidArgumentError: ``entry`` is not a privguard checkpoint entry.
        LedgerStateError: the ledger cannot hold the checkpoint's journal:
            an in-memory ledger that already spent something else (a
            rewind), or a ledger other than the file the checkpoint names.
    """
    check_entry(entry, where)
    count, fingerprint = entry["charges"], entry["fingerprint"]
    if entry.get("state") is not None and not holds(ledger, count, fingerprint):
        # In-memory ledger at save: load its state (only ever moves forward).
        ledger.load_state_dict(entry["state"])
    if not holds(ledger, count, fingerprint):
        if entry.get("path") is not None:
            raise LedgerStateError(
                f"{where}: the checkpoint's ledger is the file {_shown(entry['path'])} with "
                f"{count} charges, and this ledger does not hold them (it has "
                f"{len(ledger.history)}); resume with the same file: Ledger(..., "
                f"path={_shown(entry['path'])}) or Ledger.open({_shown(entry['path'])})")
        raise LedgerStateError(
            f"{where}: the ledger does not hold the checkpoint's {count} charges after "
            "loading them")
    return ledger


def holds(ledger: Ledger, count: int, fingerprint: str) -> bool:
    """Whether ``ledger``'s journal begins with the ``count`` charges of ``fingerprint``."""
    return len(ledger.history) >= count and _fingerprint(ledger, count) == fingerprint
