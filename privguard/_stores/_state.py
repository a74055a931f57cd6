"""A ledger's state as plain data: ``state_dict()`` and back, validated before use.

Format 2 (privguard ≥ 0.2)::

    {"format": "privguard.Ledger", "version": 2, "config": {...}, "fixed": {...} | None,
     "mechanisms": [mechanism dicts, each once],
     "journal": [["fix", {...}] | ["run", mechanism index, label, pid, count, first, last]
                 | ["event", {...}], ...],
     "spent": [...], "filter_state": {...}, "keyed": bool, "key_check": str | None,
     "derivation": int, "checksum": hex}

The checksum is an HMAC when a ledger key is configured (see
:mod:`privguard._stores._integrity`), SHA-256 otherwise. Loading checks format,
version, checksum and key, rebuilds the accounting from the configuration
and replays the journal through the one decision path, then compares the
result with the recorded spent curve and filter state: a state that does
not replay is refused. The fix entry's plan-derived choices (δ shares,
mixture weights, a hybrid T_A) are derived again from its plan, by the
derivation the state records (:mod:`privguard._accounting._derivation`), with the
stores' check (``_stores._rows.check_fix``); its plan must be the declared
one or the first charge's mechanism. Format 1 (privguard 0.1: one record per
charge) still loads; its charges are grouped into runs and a ``migrate``
event records that it happened.

Loading is strict (review bx: an unkeyed checksum is recomputed by anyone): exactly the
keys state_dict writes at every level it owns (a state without "derivation" predates it),
fix and event entries of two elements, runs of seven, each listed mechanism used by a
run, once, in order of first use. Event bodies are checked by ``replay_event``: the
keys of each kind privguard writes, in every version that wrote it (``EVENT_KEYS``), a
retarget's configurations strictly, as ``config``; a version-1 state's filter
configuration and filter state have the keys 0.1 wrote.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._accounting import _config
from privguard._accounting._accounting import Accounting, is_retarget
from privguard._accounting._derivation import DERIVATION, derivation_of, first_difference
from privguard._accounting._journal import Run
from privguard._accounting._plan import Plan
from privguard._errors import LedgerStateError, PrivguardError, _shown
from privguard._mechanisms._base import mechanism_from_dict
from privguard._mechanisms._poisson_revision import poisson_tuning_hint
from privguard._stores._integrity import Integrity, canonical
from privguard._stores._revision import revised_up_only
from privguard._stores._rows import check_fix

FORMAT = "privguard.Ledger"
VERSION = 2
# The keys state_dict writes, each exactly (review bx: an unkeyed checksum is recomputed by
# anyone, so an extra key is an edit). "derivation" since 4b7ad83; a state written before
# it lacks the key (derivation_of reads 1). Format 1: privguard 0.1's state_dict.
_KEYS = frozenset({"format", "version", "config", "fixed", "mechanisms", "journal", "spent",
                   "filter_state", "keyed", "key_check", "checksum"})
_V1_KEYS = frozenset({"format", "version", "config", "filter_state", "records", "spent",
                      "checksum"})
_V1_RECORD_KEYS = frozenset({"index", "label", "mechanism", "time", "pid"})


def state_dict(acc: Accounting, items: list[Any]) -> dict[str, Any]:
    """The state of ``acc``; ``items`` is its whole journal in order (runs, fix, events)."""
    mechanisms: dict[Any, int] = {}
    journal: list[list[Any]] = []
    for item in items:
        if isinstance(item, Run):
            index = mechanisms.setdefault(item.mechanism, len(mechanisms))
            journal.append(["run", index, item.label, item.pid, item.count, item.first_time,
                            item.last_time])
        else:
            journal.append(list(item))
    integrity = Integrity.from_environment()
    body = {
        "format": FORMAT, "version": VERSION,
        "config": acc.config.to_dict(), "fixed": acc.fixed,
        "mechanisms": [m.to_dict() for m in mechanisms],
        "journal": journal,
        "spent": acc.spent().tolist(),
        "filter_state": None if acc.filter is None else acc.filter.state(),
        "keyed": integrity.keyed, "key_check": integrity.key_check(),
        "derivation": DERIVATION,
    }
    body["checksum"] = integrity.digest("state", body)
    return body


def load(state: Any) -> tuple[Accounting, list[Run]]:
    """Validate and replay a state; returns the accounting and every run.

    Raises:
        LedgerStateError: anything unreadable, inconsistent, edited or of a
            newer version.
    """
    if not isinstance(state, dict):
        raise LedgerStateError(f"state must be a dict, got {type(state).__name__}")
    # Each header field is typed before it is compared: an array, or an object whose ==,
    # str or repr raises, escaped as that built-in exception (review fs).
    fmt = state.get("format")
    if type(fmt) is not str or fmt != FORMAT:
        raise LedgerStateError(f"not a privguard ledger state (format={_shown(fmt)})")
    version = state.get("version")
    if type(version) is not int:
        raise LedgerStateError(f"state version {_shown(version)} is not an integer; "
                               "refusing to load")
    if version == 1:
        return _load_v1(state)
    if version != VERSION:
        raise LedgerStateError(f"state version {version!r} is not supported by this privguard "
                               f"(it reads 1 and {VERSION}); refusing to load")
    keyed = state.get("keyed")
    if type(keyed) is not bool:
        raise LedgerStateError(f"the state's keyed {_shown(keyed)} is not a bool (True or False)")
    integrity = Integrity.from_environment()
    integrity.require_matches(keyed, state.get("key_check"), "this state")
    body = {k: v for k, v in state.items() if k != "checksum"}
    expected = _checksum(lambda: integrity.digest("state", body))
    checksum = state.get("checksum")
    # compare_digest raises TypeError on a str with non-ASCII characters
    if type(checksum) is not str or not checksum.isascii() or not hmac.compare_digest(
            checksum, expected):
        raise LedgerStateError("state checksum mismatch: the state was modified or corrupted")
    _check_keys(state)
    derivation = derivation_of(state)
    try:
        # The journal is replayed from the configuration it started with: the first
        # retarget's "old" one (each retarget then moves it on), else the state's own.
        final = _config.from_dict(state["config"])
        first = next((e[1] for e in state["journal"] if e[0] == "event"
                      and is_retarget(e[1])), None)
        acc = Accounting(final if first is None else _config.from_dict(first.get("old")),
                         fix_now=False)
        mechanisms = [mechanism_from_dict(m) for m in state["mechanisms"]]
        used: list[int] = []  # the mechanism indexes in order of first use
        for i, entry in enumerate(state["journal"]):
            where = f"state journal entry {i}"
            if not isinstance(entry, list) or not entry:
                raise LedgerStateError(f"{where} must be a non-empty list, got {entry!r}")
            if entry[0] in ("fix", "event") and len(entry) != 2:
                # state_dict writes [kind, body], nothing else (review bx)
                raise LedgerStateError(f"{where}: {'an' if entry[0] == 'event' else 'a'} "
                                       f"{entry[0]} entry has 2 elements, this one "
                                       f"{len(entry)}")
            if entry[0] == "fix":
                # Derived again from its plan, as the stores do (issue 24, item 1); the
                # plan is fixed once, before the first charge, so a second entry is forged.
                if acc.fixed is not None:
                    raise LedgerStateError(f"{where}: a second fix entry (the plan is fixed "
                                           "once, before the first charge)")
                acc.replay_fix(check_fix(acc, entry[1], where, derivation))
            elif entry[0] == "event":
                body = entry[1]
                if not isinstance(body, dict):
                    raise LedgerStateError(f"{where}: an event must be a dict, got "
                                           f"{type(body).__name__}")
                acc.replay_event(body, where)
            elif entry[0] == "run":
                m, label, pid, count, first, last = _run_entry(entry, len(mechanisms), where)
                if m not in used:
                    used.append(m)
                acc.replay_run(Run(acc.journal.run_count, acc.journal.charges, count, label,
                                   mechanisms[m], first, last, pid), where)
            else:
                raise LedgerStateError(f"{where} has an unknown kind {entry[0]!r}")
        recorded = np.array(state["spent"], dtype=float)
        filter_state, fixed = state["filter_state"], state["fixed"]
    except LedgerStateError:
        raise
    except (PrivguardError, KeyError, TypeError, ValueError, IndexError, AttributeError,
            OverflowError) as exc:
        raise LedgerStateError(f"state is malformed: {exc!r}") from exc
    if acc.config != final:
        raise LedgerStateError("the state's configuration is not the one its journal's "
                               "retargets end in")
    # acc.fixed is the derived record; the recorded one may differ by check_fix's tolerance
    if (acc.fixed is None) != (fixed is None) or first_difference(fixed, acc.fixed) is not None:
        raise LedgerStateError("the state's fixed plan does not match its journal")
    _check_replay(acc, recorded, filter_state)
    _check_mechanisms(mechanisms, used)
    return acc, acc.journal.held_runs()


def _check_keys(state: dict[str, Any]) -> None:
    """The top level holds exactly the keys state_dict writes (with or without
    "derivation", see ``_KEYS``), ``keyed`` a bool and ``key_check`` a string or None."""
    keys = set(state) - {"derivation"}
    if keys != _KEYS:
        raise LedgerStateError(f"state is malformed: its keys are not the ones privguard "
                               f"writes (unknown: "
                               f"{sorted(map(str, keys - _KEYS))}, missing: "
                               f"{sorted(_KEYS - keys)})")
    if type(state["keyed"]) is not bool or not (
            state["key_check"] is None or type(state["key_check"]) is str):
        raise LedgerStateError(f"the state's keyed {state['keyed']!r} / key_check "
                               f"{state['key_check']!r} are not a bool and a string or None")


def _check_mechanisms(mechanisms: list[Any], used: list[int]) -> None:
    """state_dict lists each run's mechanism once, numbered in order of first use: an
    entry no run uses, a duplicate or another order is an edit (review bx)."""
    if used != list(range(len(mechanisms))):
        raise LedgerStateError(f"the state's mechanisms are not the journal's, each once in "
                               f"order of first use ({len(mechanisms)} listed, the runs use "
                               f"{used})")
    if len(set(mechanisms)) != len(mechanisms):
        raise LedgerStateError("the state lists one mechanism twice")


def _checksum(compute: Callable[[], str]) -> str:
    """The state's checksum; a state that is not plain JSON data has none (refused)."""
    try:
        return compute()
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        raise LedgerStateError(f"state is not JSON data, so its checksum cannot be computed "
                               f"({type(exc).__name__}: {exc})") from exc


def _check_replay(acc: Accounting, recorded: np.ndarray, filter_state: Any) -> None:
    # The replayed totals are the ones the ledger uses; the recorded ones only check the
    # journal. They may differ by the RDP tolerance, or lie below the replayed ones where a
    # curve's evaluation was revised up since the state was written (issue 24 moved PureDP
    # and Laplace up by ~1e-13 relative; the subsampled Gaussian's fractional orders moved
    # up by up to 1e-4: privguard/_stores/_revision.py). Never the other way.
    if recorded.shape != acc.orders.shape or not revised_up_only(acc.spent(), recorded):
        raise LedgerStateError("journal does not replay to the recorded spent totals"
                               + poisson_tuning_hint(*acc.journal.held_runs()))
    if (None if acc.filter is None else acc.filter.state()) != filter_state:
        raise LedgerStateError("journal does not replay to the recorded filter state"
                               + poisson_tuning_hint(*acc.journal.held_runs()))


def _load_v1(state: dict[str, Any]) -> tuple[Accounting, list[Run]]:
    """privguard 0.1's format: one record per charge, SHA-256 checksum, weights at the top."""
    body = {k: v for k, v in state.items() if k != "checksum"}
    expected = _checksum(lambda: hashlib.sha256(canonical(body)).hexdigest())
    checksum = state.get("checksum")
    # a str first, as in load(): an array's truth value, or a raising ==, escaped (review radv)
    if type(checksum) is not str or checksum != expected:
        raise LedgerStateError("state checksum mismatch: the state was modified or corrupted")
    if set(state) != _V1_KEYS:
        raise LedgerStateError(f"the version-1 state's keys {sorted(map(str, state))} are not "
                               f"the ones privguard 0.1 wrote {sorted(_V1_KEYS)}")
    try:
        config = _config.from_dict(state["config"])
        acc = Accounting(config, fix_now=False)
        records = [_v1_record(i, r) for i, r in enumerate(state["records"])]
        weights = _v1_filter_state(state["filter_state"], config.filter)
        recorded = np.array(state["spent"], dtype=float)
    except LedgerStateError:
        raise
    except PrivguardError as exc:
        raise LedgerStateError(f"state does not load: {exc}") from exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LedgerStateError(f"state is malformed: {exc!r}") from exc
    if records:
        plan = config.plan or Plan(records[0][1])
        fixed = acc.derive_fixed(plan)
        # 0.1 recorded its δ-share weights; they are derived again (issue 24, item 1) and
        # must be the ones this library derives, and the derived record is kept.
        derived = None if fixed["filter"] is None else fixed["filter"].get("weights")
        if weights is not None and first_difference(weights, derived) is not None:
            # or the ones it derived with the curves before e08c1f5 (docs/theory.md §1.1,
            # "Fix entries derived before the revision"); the derived record is kept
            fixed = acc.derive_fixed_legacy(plan)
            derived = None if fixed["filter"] is None else fixed["filter"].get("weights")
            if first_difference(weights, derived) is not None:
                raise LedgerStateError("the version-1 state's filter weights are not the ones "
                                       "this library derives from its plan (forged or foreign)"
                                       + poisson_tuning_hint(plan.step))
        acc.replay_fix(fixed)
        acc.replay_event({"event": "migrate", "from": "privguard 0.1 state (version 1)",
                          "records": len(records)})
    for (label, mech, pid), group in itertools.groupby(records, key=lambda r: (r[0], r[1], r[3])):
        times = [r[2] for r in group]
        acc.replay_run(Run(acc.journal.run_count, acc.journal.charges, len(times), label, mech,
                           times[0], times[-1], pid),
                       f"version-1 record {acc.journal.charges}")
    _check_replay(acc, recorded, None if acc.filter is None else acc.filter.state())
    return acc, acc.journal.held_runs()


def _v1_filter_state(filter_state: Any, kind: str | None) -> Any:
    """The recorded weights of a version-1 filter state: 0.1 wrote ``{}`` without a filter
    or for the strict one, ``{"weights": list | None}`` for its (ε, δ) filter; any other
    key set is an edit (review bi)."""
    expected = {"weights"} if kind == "rdp" else set()
    if not isinstance(filter_state, dict) or set(filter_state) != expected:
        raise LedgerStateError(f"the version-1 state's filter_state must be a dict with the "
                               f"keys {sorted(expected)} for its filter, got "
                               f"{check.short(filter_state)}")
    weights = filter_state.get("weights")
    if weights is not None and not isinstance(weights, list):
        raise LedgerStateError(f"the version-1 state's filter weights must be a list or None, "
                               f"got {check.short(weights)}")
    return weights


def _run_entry(entry: list[Any], n_mechanisms: int, where: str
               ) -> tuple[int, str | None, int, int, float, float]:
    """A run entry's (mechanism index, label, pid, count, first, last), each of the type
    state_dict writes: an index into the mechanisms (not a negative one, which Python would
    read from the end), integers that are not bools, finite times."""
    _, m, label, pid, count, first, last = entry
    if type(m) is not int or not 0 <= m < n_mechanisms:
        raise LedgerStateError(f"{where}: mechanism index {m!r} is not one of the state's "
                               f"{n_mechanisms} mechanisms")
    if label is not None and type(label) is not str:
        raise LedgerStateError(f"{where}: label must be a string or None, got {label!r}")
    for name, value in (("pid", pid), ("count", count)):
        if type(value) is not int:
            raise LedgerStateError(f"{where}: {name} must be an integer, got {value!r}")
    for name, value in (("first time", first), ("last time", last)):
        if type(value) not in (int, float) or not _finite(value):
            raise LedgerStateError(f"{where}: {name} must be a finite number, got {value!r}")
    return m, label, pid, count, float(first), float(last)


def _v1_record(i: int, record: Any) -> tuple[str | None, Any, float, int]:
    """(label, mechanism, time, pid) of a version-1 record, each of the type 0.1 wrote."""
    where = f"version-1 record {i}"
    if not isinstance(record, dict) or not set(record) <= _V1_RECORD_KEYS:
        raise LedgerStateError(f"{where} must be a dict with keys {sorted(_V1_RECORD_KEYS)}, "
                               f"got {check.short(record)}")
    if "index" in record and (type(record["index"]) is not int or record["index"] != i):
        raise LedgerStateError(f"{where}: index must be {i}, got {record['index']!r}")
    label, t, pid = record["label"], record["time"], record["pid"]
    if label is not None and not isinstance(label, str):
        raise LedgerStateError(f"{where}: label must be a string or None, got {label!r}")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not _finite(t):
        raise LedgerStateError(f"{where}: time must be a finite number, got {t!r}")
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise LedgerStateError(f"{where}: pid must be an integer, got {pid!r}")
    return label, mechanism_from_dict(record["mechanism"]), float(t), pid


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range
        return False
