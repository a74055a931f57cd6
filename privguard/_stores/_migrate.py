"""``privguard upgrade FILE``: turn a privguard 0.1 ledger file into the current format.

Never silent: opening a 0.1 file refuses and names this command. The upgrade

1. reads the 0.1 file and verifies it the way 0.1 did: the SHA-256 chain of
   its rows (from ``privguard-journal-v1``), each row's stored curve against
   the curve recomputed from its mechanism, and the cached totals (count,
   digest and spent curve) against the replay; and checks its configuration
   against the retarget events that recorded it (and their count);
2. requires the caller to restate the target (``--epsilon E --delta D``, or
   what the ledger had instead): 0.1 protected its configuration with no
   digest, so an edited target (ε = 4 made 100) would otherwise be baked
   into the new file's genesis and verify there. The restated target must
   equal the file's exactly; without one it refuses and shows the claim;
3. writes a new file whose first entry is a ``migrate`` event (source
   schema, rows, final digest, any 0.1 retargets, the restated target, time,
   process), then the choices 0.1 fixed at its first charge, then the charges
   grouped into runs, each re-admitted by the current filter;
4. verifies the new file from its genesis and checks that it replays to the
   0.1 file's spent curve exactly;
5. keeps the original as ``FILE.v1`` and atomically replaces ``FILE``.

It refuses (changing nothing) if any step fails or ``FILE.v1`` exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shlex
import shutil
import sqlite3
import time
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._accounting import _config
from privguard._accounting._accounting import Accounting, Change
from privguard._accounting._journal import Run
from privguard._accounting._plan import Plan
from privguard._errors import InvalidArgumentError, LedgerStateError, PrivguardError
from privguard._mechanisms._base import mechanism_from_dict
from privguard._mechanisms._poisson_revision import poisson_tuning_hint
from privguard._stores._paths import explain, require_regular_file
from privguard._stores._revision import revised_up_only
from privguard._stores._sqlite import SQLiteStore

_V1_GENESIS = "privguard-journal-v1"


def _v1_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)


# What may go wrong decoding data an editor controls: all of it becomes LedgerStateError.
_DECODE_ERRORS = (PrivguardError, KeyError, TypeError, ValueError, AttributeError, IndexError,
                  RecursionError, OverflowError)


def read_v1(conn: sqlite3.Connection, path: str) -> dict[str, Any]:
    """Read and verify a privguard 0.1 file; returns its configuration, events and records.

    Raises:
        LedgerStateError: naming the file and the part of it that is unreadable, of the
            wrong type, or inconsistent (an edited file).
    """
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        rows = conn.execute("SELECT idx, time, label, mechanism, curve, pid, digest FROM "
                            "journal ORDER BY idx").fetchall()
        totals = conn.execute("SELECT count, spent, digest FROM totals WHERE id = 1").fetchone()
    except (sqlite3.Error, TypeError, ValueError) as exc:
        raise LedgerStateError(f"{path}: unreadable privguard 0.1 ledger ({exc})") from exc
    if meta.get("schema_version") != "1":
        raise LedgerStateError(f"{path}: not a privguard 0.1 ledger "
                               f"(schema {meta.get('schema_version')!r})")
    config_dict = _meta_json(meta, "config", path)
    try:
        config = _config.from_dict(config_dict)
    except _DECODE_ERRORS as exc:
        raise LedgerStateError(f"{path}: 0.1 metadata 'config' is invalid ({exc})") from exc
    retargets = _check_retargets(path, config_dict, _meta_json(meta, "events", path),
                                 meta.get("config_rev"))
    if totals is None:
        raise LedgerStateError(f"{path}: the 0.1 totals row is missing")
    count, spent, total_digest = totals
    records, previous = _read_rows(path, config.orders, rows)
    try:
        spent_curve = np.array(json.loads(spent), dtype=float)
    except _DECODE_ERRORS as exc:
        raise LedgerStateError(f"{path}: the 0.1 totals' spent curve is unreadable "
                               f"({type(exc).__name__}: {exc})") from exc
    if count != len(rows) or total_digest != previous:
        raise LedgerStateError(f"{path}: the 0.1 totals do not match its journal")
    return {"config": config_dict, "events": retargets, "records": records,
            "final_digest": previous, "spent": spent_curve}


def _meta_json(meta: dict[Any, Any], key: str, path: str) -> Any:
    text = meta.get(key)
    if not isinstance(text, str):
        raise LedgerStateError(f"{path}: 0.1 metadata {key!r} is "
                               f"{'missing' if text is None else type(text).__name__}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise LedgerStateError(f"{path}: 0.1 metadata {key!r} is not JSON ({exc})") from exc


def _check_retargets(path: str, config: Any, events: Any, config_rev: Any) -> list[Any]:
    """0.1 logged each change of target as a retarget event ("old" and "new" configuration)
    and counted them in ``config_rev``: they must agree with each other and with ``config``
    (which nothing else protects)."""
    if not isinstance(events, list):
        raise LedgerStateError(f"{path}: 0.1 metadata 'events' must be a list, got "
                               f"{type(events).__name__}")
    if config_rev != str(len(events)):
        raise LedgerStateError(f"{path}: 0.1 metadata 'config_rev' = {config_rev!r} does not "
                               f"count its {len(events)} retarget events (edited metadata)")
    previous = None
    for i, event in enumerate(events):
        where = f"{path}: 0.1 event {i}"
        if not isinstance(event, dict) or event.get("event") != "retarget":
            raise LedgerStateError(f"{where} is not a retarget event, the only event 0.1 "
                                   "logged (edited metadata)")
        old, new = event.get("old"), event.get("new")
        if not (isinstance(old, dict) and isinstance(new, dict)
                and isinstance(event.get("reason"), str)):
            raise LedgerStateError(f"{where}: a retarget needs 'old' and 'new' configurations "
                                   "and a 'reason'")
        if previous is not None and old != previous:
            raise LedgerStateError(f"{where}: its old configuration is not the one the "
                                   "previous retarget set (edited metadata)")
        for name in set(old) | set(new) | set(config):
            if name not in ("filter", "delta", "plan") and not (
                    old.get(name) == new.get(name) == config.get(name)):
                raise LedgerStateError(f"{where}: {name!r} differs across the retarget or "
                                       "from the configuration; 0.1 never changed it")
        previous = new
    if previous is not None and previous != config:
        raise LedgerStateError(f"{path}: 0.1 metadata 'config' is not the configuration its "
                               "last retarget event set: the file was edited")
    return events


_V1_COLUMNS: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("idx", int), ("time", float), ("label", (str, type(None))), ("mechanism", str),
    ("curve", str), ("pid", int), ("digest", str))


def _read_rows(path: str, grid: np.ndarray, rows: list[Any]) -> tuple[list[Any], str]:
    previous, records = _V1_GENESIS, []
    for position, row in enumerate(rows):
        where = f"{path}: 0.1 journal row {position}"
        for (column, kind), value in zip(_V1_COLUMNS, row):
            if not isinstance(value, kind) or isinstance(value, bool):
                raise LedgerStateError(f"{where}: column {column} holds a "
                                       f"{type(value).__name__} (edited or corrupt)")
        idx, t, label, mech, curve, pid, digest = row
        text = _v1_dumps([previous, idx, t, label, mech, curve, pid])
        if idx != position or hashlib.sha256(text.encode()).hexdigest() != digest:
            raise LedgerStateError(f"{where} fails its hash chain (edited, reordered or missing)")
        try:
            mechanism = mechanism_from_dict(json.loads(mech))
            stored = np.array(json.loads(curve), dtype=float)
            same = revised_up_only(mechanism._rdp_checked(grid), stored)
        except _DECODE_ERRORS as exc:
            raise LedgerStateError(f"{where} is unreadable ({type(exc).__name__}: {exc})") from exc
        if not same:
            raise LedgerStateError(f"{where}: its stored curve is not its mechanism's curve")
        records.append((label, mechanism, t, pid))
        previous = digest
    return records, previous


def _claimed(config: _config.Config) -> dict[str, Any]:
    """The target a 0.1 configuration claims, as the arguments that restate it."""
    if config.filter == "strict":
        assert config.rdp_budget is not None
        return {"rdp_budget": config.rdp_budget.tolist(), "delta": config.delta}
    return {"epsilon": config.epsilon, "delta": config.delta}


def _stated(epsilon: Any, delta: Any, rdp_budget: Any, no_target: Any) -> dict[str, Any] | None:
    """The target the caller restated (validated; ``rdp_budget`` is checked against the
    file's grid later), or None if they stated none."""
    if not isinstance(no_target, bool):
        raise InvalidArgumentError("no_target", check.short(no_target), "must be a bool")
    if no_target:
        for name, value in (("epsilon", epsilon), ("delta", delta), ("rdp_budget", rdp_budget)):
            if value is not None:
                raise InvalidArgumentError(name, value, "no_target=True states that the "
                                           "ledger had no target and no δ; give neither")
        return {"epsilon": None, "delta": None}
    if epsilon is None and delta is None and rdp_budget is None:
        return None
    d = None if delta is None else check.delta("delta", delta)
    if rdp_budget is not None:
        if epsilon is not None:
            raise InvalidArgumentError("rdp_budget", check.short(rdp_budget),
                                       "give either (epsilon, delta) or rdp_budget, not both")
        return {"rdp_budget": rdp_budget, "delta": d}
    return {"epsilon": None if epsilon is None else check.positive_finite("epsilon", epsilon),
            "delta": d}


def _command(path: str, target: dict[str, Any]) -> str:
    args = [f"--{k.replace('_', '-')} " + (",".join(map(repr, v)) if isinstance(v, list)
                                             else repr(v))
            for k, v in target.items() if v is not None]
    return " ".join(["privguard upgrade", shlex.quote(path), *(args or ["--no-target"])])


def _describe(target: dict[str, Any]) -> str:
    if target.get("rdp_budget") is not None:
        text = f"a strict per-order RDP budget ({len(target['rdp_budget'])} values)"
    elif target["epsilon"] is not None:
        text = f"the (ε, δ) target ε = {target['epsilon']!r}"
    else:
        text = "no ε target (odometer only)"
    return text + (", no δ" if target["delta"] is None else f", δ = {target['delta']!r}")


def _confirm(path: str, config: _config.Config, stated: dict[str, Any] | None) -> None:
    """Nothing in a 0.1 file protects its target: the caller must restate it, exactly."""
    claimed = _claimed(config)
    if stated is not None and "rdp_budget" in stated:
        budget = check.rdp_values("rdp_budget", stated["rdp_budget"], config.orders.size)
        stated = {**stated, "rdp_budget": budget.tolist()}
    if stated is None:
        raise LedgerStateError(
            f"{path}: a privguard 0.1 file does not protect its target, so the upgrade "
            f"adopts only a target you restate. This file claims {_describe(claimed)}; if "
            "that is not the target you set, the file was edited: do not confirm it. If it "
            f"is, confirm it with: {_command(path, claimed)}")
    if stated != claimed:
        raise LedgerStateError(
            f"{path}: you stated {_describe(stated)}, but this privguard 0.1 file claims "
            f"{_describe(claimed)}; nothing in a 0.1 file protects its target, so it may "
            "have been edited. Nothing was changed")


def upgrade(path: str, epsilon: float | None = None, delta: float | None = None, *,
            rdp_budget: Any = None, no_target: bool = False) -> dict[str, Any]:
    """Upgrade the privguard 0.1 ledger file at ``path`` (see the module docstring).

    Args:
        path: the 0.1 ledger file.
        epsilon, delta: the target you set for this ledger, restated; it must equal the
            file's exactly (for a ledger without an ε target, ``delta`` alone).
        rdp_budget: instead of ``epsilon``, the per-order budget of a strict 0.1 ledger.
        no_target: the ledger had neither a target nor δ.

    Raises:
        InvalidArgumentError: an argument is out of its domain.
        LedgerStateError: no target restated, a different one, or a file that is not a
            readable, consistent 0.1 ledger. Nothing is changed then.
    """
    stated = _stated(epsilon, delta, rdp_budget, no_target)  # bad arguments: before any I/O
    backup, tmp = path + ".v1", path + ".upgrading"
    if not os.path.exists(path):
        raise LedgerStateError(f"{path}: no such ledger file")
    require_regular_file(path)  # a FIFO would block the open below forever
    cause = explain(path, write=True)  # upgrade rewrites the file and writes PATH.v1 beside it
    if cause is not None:
        raise LedgerStateError(f"{path}: cannot upgrade: {cause}; nothing was changed")
    if os.path.exists(backup):
        raise LedgerStateError(f"{backup} exists; move it away before upgrading {path}")
    try:
        lock = open(path, "rb")
    except OSError as exc:
        raise LedgerStateError(f"{path}: cannot be opened ({exc})") from exc
    with lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # no 0.1 writer runs meanwhile
        try:
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # 0.1 used WAL: fold it in
                _refuse_current(conn, path)
                old = read_v1(conn, path)
            finally:
                conn.close()
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # (review rsq: SQLite's message
            # quoting a damaged schema's bytes raised UnicodeDecodeError, as in _sqlite.py)
            raise LedgerStateError(f"{path}: not a readable SQLite ledger ({exc})") from exc
        config = _config.from_dict(old["config"])
        _confirm(path, config, stated)
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        try:
            result = _write_v2(tmp, path, old)
            shutil.copy2(path, backup)
            os.replace(tmp, path)
        finally:
            for stale in (tmp, tmp + "-journal"):  # the temporary's TRUNCATE journal too
                with contextlib.suppress(FileNotFoundError):
                    os.remove(stale)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)
    return {**result, "path": path, "original": backup, "target": _claimed(config)}


def _refuse_current(conn: sqlite3.Connection, path: str) -> None:
    """Say so when ``path`` is already a current ledger (it has no 0.1 ``journal`` table)."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "journal" not in tables and {"meta", "entries"} <= tables:
        raise LedgerStateError(f"{path}: already a current privguard ledger; there is nothing "
                               "to upgrade (open it with Ledger.open)")


def _write_v2(tmp: str, path: str, old: dict[str, Any]) -> dict[str, Any]:
    config = _config.from_dict(old["config"])
    records = old["records"]
    store = SQLiteStore(tmp)
    try:
        acc = store.open(config, Accounting(config, fix_now=False), None)
        event = {"event": "migrate", "time": time.time(), "pid": os.getpid(),
                 "from": "privguard 0.1 (schema 1)", "rows": len(records),
                 "final_digest": old["final_digest"], "target_restated": _claimed(config),
                 "retargets": [e for e in old["events"] if e.get("event") == "retarget"]}
        with store.transaction(acc, write=True) as txn:
            acc.replay_event(event)
            txn.write(acc, [Change("event", body=event)])
            if records:
                plan = config.plan or Plan(records[0][1])
                fixed = acc.derive_fixed(plan)
                acc.replay_fix(fixed)
                txn.write(acc, [Change("fix", body=fixed)])
            for (label, mech, pid), group in itertools.groupby(
                    records, key=lambda r: (r[0], r[1], r[3])):
                times = [r[2] for r in group]
                run = Run(acc.journal.run_count, acc.journal.charges, len(times), label, mech,
                          times[0], times[-1], pid)
                acc.replay_run(run, f"{path}: 0.1 record {run.start}")
                txn.write(acc, [Change("run", run=acc.journal.last)])
        if not revised_up_only(acc.spent(), old["spent"]):
            raise LedgerStateError(f"{path}: the upgraded journal does not replay to the 0.1 "
                                   "file's spent curve; nothing was changed"
                                   + poisson_tuning_hint(*acc.journal.held_runs()))
        verified = store.verify()
    finally:
        store.close()
    return {"charges": verified["charges"], "runs": verified["runs"], "rows": verified["rows"]}
