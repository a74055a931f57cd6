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

Each ``train()``/``fit`` is a branch, and each entry records the charges its ledger held
when the branch began (``"base"``; Hugging Face: a run id per branch, and the runs it
resumed from, ``"from"``, which :func:`lineage` follows; Lightning: the run id kept across
resumes, and a ``"branch"`` id): :func:`check_branches` refuses branches that are not one
sequence in which each began holding every charge the branches before it wrote. The prefix check alone cannot tell two branches
apart when their charges are alike one for one (the same label and step): a branch resumed
from step 2 that ran steps 3 and 4 holds a journal equal to the run's own to step 4, and
taking the larger of the two counted 4 steps where 6 ran (task fw).
"""

from __future__ import annotations

import warnings
from typing import Any

from privguard import _validation as check
from privguard._errors import LedgerStateError
from privguard._ledger._ledger import Ledger
from privguard.integrations._checkpoint import check_entry, holds, restore

__all__ = ["carry_later", "check_branches", "lineage"]


def lineage(entries: list[tuple[str, dict[str, Any]]], runs: set[str],
            ) -> list[tuple[str, dict[str, Any]]]:
    """The entries of ``entries`` whose run is connected to one of ``runs`` by resumes
    (``entry["checkpoint"]["from"]``, either way), checked by :func:`check_branches`.

    ``entries``: ``(path, entry)`` whose ``entry["checkpoint"]`` is a dict with a str
    ``"run"``; an entry written before task fw names no ``"from"`` (a run of its own).

    Raises:
        LedgerStateError: an entry's ``from`` is malformed or disagrees with its run's
            other entries, or the branches fork (:func:`check_branches`).
    """
    links: dict[str, tuple[str, ...]] = {}
    for path, entry in entries:
        named = entry["checkpoint"]
        _check_branch_fields(path, entry)  # every entry: an edited one may disconnect itself
        parents = named.get("from", [])
        if not (isinstance(parents, list) and all(isinstance(p, str) for p in parents)):
            raise LedgerStateError(f"{path}: the entry's checkpoint field is malformed "
                                   f"(from {check.short(parents)})")
        if links.setdefault(named["run"], tuple(parents)) != tuple(parents):
            raise LedgerStateError(f"{path}: the entry's run {named['run']} began from "
                                   f"{parents}, its other entries say "
                                   f"{list(links[named['run']])}: an edited entry")
    # review rfw: a run named as a parent is a node even where none of its entries is left
    # (removed): its branches are connected through it (siblings that forked from it were
    # taken one without the other)
    family, todo = set(), list(runs)
    while todo:
        run = todo.pop()
        if run not in family:
            family.add(run)
            todo += list(links.get(run, ()))
            todo += [r for r, parents in links.items() if run in parents]
    taken = [(path, entry) for path, entry in entries if entry["checkpoint"]["run"] in family]
    check_branches(taken, fields_checked=True)  # each entry's fields once, above
    return taken


def _check_branch_fields(path: str, entry: dict[str, Any]) -> None:
    """Review rfw: task fw writes ``"base"`` with ``"from"`` (Hugging Face) or ``"branch"``
    (Lightning), always both: one without the other is an edited entry (a ``"from"``
    removed disconnected its branch, whose charges were then not carried), and a branch
    cannot have begun holding more charges than its entry holds."""
    named = entry["checkpoint"]
    if ("base" in named) != ("from" in named or "branch" in named):
        raise LedgerStateError(f"{path}: the entry's checkpoint field is malformed (base "
                               "without from/branch, or one of them without base): an "
                               "edited entry")
    base, charges = named.get("base", 0), entry.get("charges")
    if type(base) is int and type(charges) is int and base > charges:
        raise LedgerStateError(f"{path}: the entry's branch began at {base} charges, more "
                               f"than the {charges} it holds: an edited entry")


def check_branches(entries: list[tuple[str, dict[str, Any]]], *,
                   fields_checked: bool = False) -> None:
    """Refuse entries of several branches that are not one sequence in which each branch
    began holding every charge the branches before it wrote.

    A branch is one ``train()``/``fit`` (``entry["checkpoint"]["branch"]``, else its
    ``"run"``); ``"base"`` is the charges its ledger held when it began (an entry written
    before task fw names none: 0, an earlier place in the order, which only makes the check
    stricter). Ordered by base, a branch that began below the charges an earlier one wrote
    did not carry them, and its own steps ran beside them: a fork.

    ``fields_checked``: the caller has already refused every entry whose ``base`` and
    ``from``/``branch`` disagree (:func:`_check_branch_fields`; :func:`lineage` checks
    each entry, taken or not), so it is not checked twice.

    Raises:
        LedgerStateError: a malformed or inconsistent ``branch``/``base``, or a fork.
    """
    bases: dict[str, int] = {}
    top: dict[str, tuple[int, str]] = {}
    for path, entry in entries:
        named = entry["checkpoint"]
        branch, base = named.get("branch", named.get("run")), named.get("base", 0)
        if not isinstance(branch, str) or type(base) is not int or base < 0:
            raise LedgerStateError(f"{path}: the entry's checkpoint field is malformed "
                                   f"(branch {check.short(branch)}, base {check.short(base)})")
        if not fields_checked:
            _check_branch_fields(path, entry)
        if bases.setdefault(branch, base) != base:
            raise LedgerStateError(f"{path}: the entry's branch began at {base} charges, its "
                                   f"other entries say {bases[branch]}: an edited entry")
        raw = entry.get("charges")
        charges: int = raw if type(raw) is int else 0  # malformed: carry_later refuses it
        top[branch] = max(top.get(branch, (-1, "")), (charges, path))
    written, last = -1, ""
    for branch in sorted(bases, key=lambda b: (bases[b], top[b])):
        if written > bases[branch]:
            raise LedgerStateError(
                f"the checkpoints of the run fork: {top[branch][1]} is of a branch that began "
                f"at {bases[branch]} charges, below the {written} of {last}, which it did not "
                "carry. Both branches ran, and one in-memory ledger cannot hold the charges of "
                "both (nor is either dropped): the privacy loss is both branches' together. A "
                "file-backed ledger (Ledger(..., path=...)) keeps every charge of every branch")
        written, last = max((written, last), top[branch])


def carry_later(ledger: Ledger, found: list[tuple[str, dict[str, Any]]], *, resumed: str,
                stacklevel: int = 2, context: str | None = None) -> str | None:
    """Bring the in-memory ``ledger`` to the entry of ``found`` with the most charges.

    Args:
        ledger: the ledger, already restored from the checkpoint resumed from.
        found: ``(path, entry)`` of every entry of the resumed run (its in-memory entries;
            the resumed one may be among them).
        resumed: the checkpoint resumed from, for the messages.
        context: what the messages begin with (default: "training resumes from
            ``resumed``"); with it, no warning (the caller warns).

    A file-backed ``ledger`` is not moved (it keeps every charge of every branch): each
    entry must be one its file holds (:func:`restore`), else LedgerStateError.

    Returns:
        The path of the entry the ledger was brought to; None where it did not move.

    Raises:
        LedgerStateError: the run's entries are not one prefix chain that extends the
            ledger (a fork, an edited entry); the ledger is then left as it was.
    """
    said = context or f"training resumes from {resumed}"
    if ledger.path is not None:  # a file keeps every charge: it must hold each entry
        for where, entry in found:
            try:
                restore(ledger, entry, where=where)
            except LedgerStateError as exc:
                raise LedgerStateError(f"{said}, whose run's checkpoint {where} holds charges "
                                       f"this ledger cannot take: {exc}") from None
        return None
    for where, entry in found:  # an edited entry of the run refuses the resume (fail closed)
        check_entry(entry, where)
        if entry.get("state") is None:
            raise LedgerStateError(f"{where}: the entry names the run resumed from but holds "
                                   "no in-memory ledger state, as that run's entries do")
    if not found:
        return None
    before = len(ledger.history)
    path, top = max(found, key=lambda row: (row[1]["charges"], row[0]))
    if top["charges"] <= before:
        chain = ledger
    else:
        try:  # a separate ledger: the chain is checked before this one moves
            chain = Ledger.load_state_dict(top["state"])
        except LedgerStateError as exc:
            raise LedgerStateError(
                f"{said}, whose run's later checkpoint {path} holds "
                f"an entry this ledger cannot take: {exc}") from None
    for other, entry in found:
        if not holds(chain, entry["charges"], entry["fingerprint"]):
            raise LedgerStateError(
                f"{said}, and the checkpoints of its run fork: "
                f"{other} ({entry['charges']} charges) is not a prefix of "
                f"{path if chain is not ledger else 'the ledger'} ({len(chain.history)} "
                "charges). Both branches ran, and one in-memory ledger cannot hold the "
                "charges of both (nor is either dropped): the privacy loss is both branches' "
                "together. A file-backed ledger (Ledger(..., path=...)) keeps every charge of "
                "every branch")
    if chain is ledger:
        return None
    try:
        restore(ledger, top, where=path)
    except LedgerStateError as exc:
        raise LedgerStateError(
            f"{said}, whose run's later checkpoint {path} holds "
            f"charges this ledger cannot take: {exc}") from None
    if context is not None:
        return path
    warnings.warn(
        f"training resumes from {resumed}, of a run that went on to later checkpoints: the "
        f"ledger now holds the entry {path} ({len(ledger.history)} charges, "
        f"{len(ledger.history) - before} carried over from the later checkpoints): those "
        "steps ran, and a ledger never goes backwards", UserWarning, stacklevel=stacklevel)
    return path
