"""The durable ledger: reopen, configuration, processes, crashes, corruption."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import _workers
import numpy as np
import pytest

from privguard import BudgetExhausted, InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._accounting._lease import DEFAULT_CAP, RELATIVE
from privguard._stores import open_store

STEP = M.SubsampledGaussian(1.0, 0.01)


def filled(path, n=30, **kw):
    ledger = Ledger(kw.pop("epsilon", 3.0), 1e-5, path=path, **kw)
    for i in range(n):
        ledger.charge(STEP, label=f"step-{i}")
    ledger.charge(M.Laplace(5.0), label="count")
    return ledger


def test_reopening_resumes_the_same_ledger(tmp_path):
    path = tmp_path / "budget.db"
    a = filled(path)
    eps, spent, labels = a.epsilon(), a.spent, [r.label for r in a.history]
    a.close()
    b = Ledger(3.0, 1e-5, path=path)
    assert b.epsilon() == eps and np.array_equal(b.spent, spent)
    assert [r.label for r in b.history] == labels
    assert b.remaining(STEP).repeats == Ledger.load_state_dict(b.state_dict()).remaining(STEP).repeats
    c = Ledger.open(path)
    assert c.target == (3.0, 1e-5) and c.epsilon() == eps


def test_in_memory_and_file_ledgers_agree_exactly(tmp_path):
    mem = Ledger(3.0, 1e-5)
    disk = Ledger(3.0, 1e-5, path=tmp_path / "b.db", lease=1)  # leases: test_leases.py
    rng = np.random.default_rng(1)
    for _ in range(200):
        m = M.SubsampledGaussian(float(rng.choice([0.9, 1.0, 1.3])), 0.01)
        assert mem.can_afford(m) == disk.can_afford(m)
        if mem.can_afford(m):
            mem.charge(m)
            disk.charge(m)
    assert np.array_equal(mem.spent, Ledger.open(tmp_path / "b.db").spent)


@pytest.mark.parametrize("kwargs,what", [
    (dict(epsilon=4.0), "epsilon: stored 3, requested 4"),
    (dict(orders=[2.0, 4.0, 8.0]), "orders"),
    (dict(odometer="paper"), "odometer"),
])
def test_another_configuration_is_refused(tmp_path, kwargs, what):
    path = tmp_path / "b.db"
    filled(path).close()
    eps = kwargs.pop("epsilon", 3.0)
    with pytest.raises(LedgerStateError, match=what):
        Ledger(eps, 1e-5, path=path, **kwargs)


def test_retarget_is_explicit_logged_and_keeps_the_journal(tmp_path):
    path = tmp_path / "b.db"
    old = filled(path, n=1500)
    eps = old.epsilon()
    new = Ledger(4.0, 1e-5, path=path, retarget="DPO approved ε = 4 on 2026-11-21")
    assert new.events[-1]["reason"].startswith("DPO approved")
    assert new.target == (4.0, 1e-5) and new.can_afford(STEP)
    assert new.epsilon() == eps  # the running ε is the journal's, whatever the target
    from privguard._cli._report import report

    assert "not fixed in advance" in report(new)["target_statement"]
    with pytest.raises(InvalidArgumentError, match="retarget"):
        Ledger(5.0, 1e-5, path=path, retarget="")  # a reason is required
    with pytest.raises(LedgerStateError, match="changed by another process"):
        old.charge(STEP)  # the other instance fails closed
    with pytest.raises(LedgerStateError, match="orders"):
        Ledger(4.0, 1e-5, orders=[2.0, 3.0], path=path, retarget="grid change")
    assert Ledger.open(path).events[-1]["event"] == "retarget"


def test_processes_never_overspend_together(tmp_path):
    path = str(tmp_path / "shared.db")
    expected = Ledger(2.0, 1e-5, plan=STEP).remaining(STEP).repeats
    Ledger(2.0, 1e-5, path=path).close()  # create it
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_workers.charge_until_refused, args=(path, 300, queue, 2.0, 1))
             for _ in range(4)]  # lease=1: every charge exact (leases: test_leases.py)
    assert 4 * 300 > expected
    for p in procs:
        p.start()
    admitted = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    ledger = Ledger.open(path)
    assert sum(admitted) == expected == len(ledger.history)
    assert [r.index for r in ledger.history] == list(range(expected))  # none lost or duplicated
    assert len({r.pid for r in ledger.history}) > 1
    assert not ledger.can_afford(STEP)


def test_sigkill_never_loses_an_applied_step(tmp_path):
    path, counter = str(tmp_path / "train.db"), str(tmp_path / "applied.txt")
    rng = random.Random(0)
    script = os.path.join(os.path.dirname(_workers.__file__), "_workers.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    progress = []
    for kills in range(1, 5):
        child = subprocess.Popen([sys.executable, script, path, counter], env=env,
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.2, 1.2))
        child.send_signal(signal.SIGKILL)
        child.wait()
        applied = int(open(counter).read()) if os.path.exists(counter) else 0
        journal = len(Ledger.open(path).history)
        assert journal >= applied, "an applied update is missing from the journal"
        # Each kill can leave at most one step charged but not applied (or applied but
        # not yet counted: the child's counter then restarts one short), plus the unused
        # part of a lease (fewer than max(cap, streak // 64), docs/theory.md §13), per kill.
        assert journal <= applied + kills * max(DEFAULT_CAP, journal // RELATIVE)
        progress.append(applied)
    assert progress[0] > 0 and progress[-1] > progress[0]  # the kills landed mid-training
    # after the crashes the ledger still enforces the budget
    child = subprocess.run([sys.executable, script, path, counter], env=env,
                           capture_output=True, text=True, timeout=600)
    assert "exhausted" in child.stdout
    ledger = Ledger.open(path)
    q = 16 / 1024
    assert not ledger.can_afford(M.SubsampledGaussian(1.0, q))
    assert ledger.target == (6.0, 1e-5) and ledger.epsilon() > 0


def _closed_copy(tmp_path, name="b.db"):
    path = tmp_path / name
    filled(path).close()
    return path


def test_truncated_file_fails_closed(tmp_path):
    path = _closed_copy(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LedgerStateError):
        Ledger(3.0, 1e-5, path=path)


def test_flipped_bytes_in_a_journal_row_fail_closed(tmp_path):
    path = _closed_copy(tmp_path)
    data = bytearray(path.read_bytes())
    at = data.find(b"step-17")
    assert at > 0
    data[at + 5] ^= 0x01  # step-17 -> step-07 on disk
    path.write_bytes(bytes(data))
    with pytest.raises(LedgerStateError, match=r"digest chain|integrity"):
        Ledger(3.0, 1e-5, path=path)


def test_flipped_bytes_in_the_file_header_fail_closed(tmp_path):
    path = _closed_copy(tmp_path)
    data = bytearray(path.read_bytes())
    data[0:16] = bytes(16)
    path.write_bytes(bytes(data))
    with pytest.raises(LedgerStateError):
        Ledger(3.0, 1e-5, path=path)


def cli_verify(path):
    """What ``privguard verify`` runs: the whole journal replayed from the genesis."""
    store = open_store(path, read_only=True)
    try:
        store.open(None, None, None)
        return store.verify()
    finally:
        store.close()


def _edit(path, sql, *args):
    conn = sqlite3.connect(path)
    conn.execute(sql, args)
    conn.commit()
    conn.close()


@pytest.mark.parametrize("sql,args,match", [
    ("UPDATE head SET entries = 3 WHERE id = 1", (), "head fails its digest"),
    ("DELETE FROM entries WHERE idx = 31", (), "head"),
    ("DELETE FROM entries WHERE idx = 20", (), "out of sequence|missing"),
    ("UPDATE entries SET label = 'edited' WHERE idx = 3", (), "digest chain"),
    ("UPDATE entries SET count = 5 WHERE idx = 3", (), "digest chain"),
    # SQLite keeps text in a numeric column: an unreadable number, not a ValueError
    ("UPDATE entries SET count = 'abc' WHERE idx = 3", (), "row 3 is unreadable"),
    ("UPDATE entries SET first = 'x' WHERE idx = 3", (), "row 3 is unreadable"),
    ("UPDATE entries SET pid = NULL WHERE idx = 3", (), "row 3 is unreadable"),
    ("UPDATE meta SET value = '99' WHERE key = 'schema_version'", (), "schema version 99"),
    ("UPDATE meta SET value = 'not json' WHERE key = 'config'", (), "unreadable"),
    ("UPDATE mechanisms SET body = replace(body, '1.0', '9.0')", (), "digest"),
    # single cells of the wrong type: LedgerStateError, never ValueError or TypeError
    ("UPDATE entries SET label = X'616263' WHERE idx = 3", (), "row 3 is unreadable"),
    ("UPDATE entries SET label = 7 WHERE idx = 3", (), "row 3 fails its digest chain"),
    ("UPDATE entries SET body = X'7b7d' WHERE idx = 0", (), "row 0 is unreadable"),
    ("UPDATE head SET entries = 'abc'", (), "head is unreadable"),
    ("UPDATE head SET last_count = 'x'", (), "head is unreadable"),
    ("UPDATE head SET entries = 1e400", (), "head is unreadable"),
    ("UPDATE head SET digest = X'00'", (), "head is unreadable"),
    ("UPDATE meta SET value = '²' WHERE key = 'schema_version'", (), "schema version ²"),
])
def test_edited_database_fails_closed_and_charges_nothing(tmp_path, sql, args, match):
    path = _closed_copy(tmp_path)
    _edit(path, sql, *args)
    with pytest.raises(LedgerStateError, match=match):
        Ledger(3.0, 1e-5, path=path)
    with pytest.raises(LedgerStateError, match=match):
        cli_verify(path)
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
    conn.close()
    assert rows <= 32  # nothing was appended


def _config_with(path, **changes):
    conn = sqlite3.connect(path)
    config = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
    conn.close()
    config.update(changes)
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize("key", ["config", "genesis_config"])
@pytest.mark.parametrize("change", [{"epsilon": 100.0}, {"delta": 0.5}])
def test_an_edited_target_never_refunds_budget(tmp_path, key, change):
    path = _closed_copy(tmp_path)
    _edit(path, "UPDATE meta SET value = ? WHERE key = ?", _config_with(path, **change), key)
    with pytest.raises(LedgerStateError, match="edited"):
        Ledger.open(path)


def test_a_deleted_retarget_event_is_detected(tmp_path):
    path = _closed_copy(tmp_path)
    Ledger(4.0, 1e-5, path=path, retarget="approved").close()
    conn = sqlite3.connect(path)
    idx = conn.execute("SELECT idx FROM entries WHERE kind = 'event'").fetchone()[0]
    conn.close()
    _edit(path, "DELETE FROM entries WHERE idx = ?", idx)
    with pytest.raises(LedgerStateError):
        Ledger.open(path)


def _rechain(path, keep=20, bodies=None):
    """What a forger with privguard in hand does: delete the rows from ``keep`` on (and
    rewrite the fix/event ``bodies`` given by row), then recompute every digest (genesis,
    rows, head) with the library's own code, without any key."""
    from privguard._stores._sqlite import SQLiteStore, _Cursor

    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM entries WHERE idx >= ?", (keep,))
    for idx, body in (bodies or {}).items():
        conn.execute("UPDATE entries SET body = ? WHERE idx = ?", (body, idx))
    conn.execute("DELETE FROM checkpoints")
    forger = SQLiteStore(str(path))
    forger.file_id = conn.execute("SELECT value FROM meta WHERE key='file_id'").fetchone()[0]
    genesis_config = json.loads(conn.execute(
        "SELECT value FROM meta WHERE key='genesis_config'").fetchone()[0])
    forger.genesis = forger._genesis_digest(genesis_config)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'genesis'", (forger.genesis,))
    prev, cur, count = forger.genesis, forger.genesis, 0
    mech = {i: (b, d) for i, b, d in conn.execute("SELECT id, body, digest FROM mechanisms")}
    for idx, kind, m, label, pid, n, first, last, body in conn.execute(
            "SELECT idx, kind, mech, label, pid, count, first, last, body FROM entries "
            "ORDER BY idx").fetchall():
        if kind == "run":
            digest = forger.integrity.digest("mechanism", mech[m][0])
            conn.execute("UPDATE mechanisms SET digest = ? WHERE id = ?", (digest, m))
            fields = [digest, label, pid, n, first, last]
        else:
            fields = [body]
        prev, cur = cur, forger._entry_digest(cur, idx, kind, fields)
        count = n if kind == "run" else 0
        conn.execute("UPDATE entries SET digest = ? WHERE idx = ?", (cur, idx))
    head = _Cursor(keep, count, cur, prev, None)
    conn.execute("UPDATE head SET entries = ?, last_count = ?, digest = ?, prev = ?, mac = ?",
                 (*head.as_tuple(), forger._head_mac(head)))
    conn.commit()
    conn.close()


def test_a_rechained_deletion_is_seen_by_an_open_ledger(tmp_path):
    path = tmp_path / "b.db"
    ledger = filled(path)  # 32 rows: fix + 31 runs (every label differs)
    _rechain(path)
    with pytest.raises(LedgerStateError, match="backwards"):
        ledger.charge(STEP)


def test_a_keyed_ledger_refuses_forgeries_and_wrong_or_missing_keys(tmp_path, monkeypatch):
    path = tmp_path / "b.db"
    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", "correct horse battery staple")
    filled(path).close()
    assert len(Ledger.open(path).history) == 31
    monkeypatch.delenv("PRIVGUARD_LEDGER_KEY")
    with pytest.raises(LedgerStateError, match="protected by a ledger key"):
        Ledger.open(path)
    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", "wrong")
    with pytest.raises(LedgerStateError, match="not this ledger's key"):
        Ledger.open(path)
    key_file = tmp_path / "key"
    key_file.write_text("correct horse battery staple\n")
    monkeypatch.delenv("PRIVGUARD_LEDGER_KEY")
    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY_FILE", str(key_file))
    assert len(Ledger.open(path).history) == 31
    # A forger without the key re-chains with the unkeyed digest: refused.
    monkeypatch.delenv("PRIVGUARD_LEDGER_KEY_FILE")
    _rechain(path)
    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY_FILE", str(key_file))
    with pytest.raises(LedgerStateError, match=r"digest|edited"):
        Ledger.open(path)


def test_an_unkeyed_file_is_refused_while_a_key_is_configured(tmp_path, monkeypatch):
    path = _closed_copy(tmp_path)
    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", "k")
    with pytest.raises(LedgerStateError, match="not keyed"):
        Ledger.open(path)


def test_a_file_replaced_under_an_open_ledger_fails_it_closed(tmp_path):
    path = tmp_path / "b.db"
    ledger = filled(path, n=3)
    other = tmp_path / "other.db"
    filled(other, n=1).close()
    os.replace(other, path)
    with pytest.raises(LedgerStateError, match="replaced"):
        ledger.charge(STEP)
    with pytest.raises(LedgerStateError):
        ledger.can_afford(STEP)


def test_a_closed_file_ledger_says_that_it_refuses_reads_too(tmp_path):
    # A closed file ledger refuses reads as well as charges (fail closed: its file may
    # have moved on); the message said "refuses charges" to a read.
    ledger = filled(tmp_path / "b.db", n=3)
    ledger.close()
    for read in (ledger.budget, ledger.epsilon, ledger.guarantee, lambda: ledger.history):
        with pytest.raises(LedgerStateError, match="refuses charges and reads: closed"):
            read()


def test_committed_charges_live_in_the_main_file_after_close(tmp_path):
    # WAL (issue 26): while a ledger is open its charges may live in budget.db-wal; closing
    # checkpoints them into the main file, so deleting the side files after every close
    # can never lose a committed charge.
    path = tmp_path / "b.db"
    ledger = filled(path, n=10)
    other = Ledger.open(path)  # another connection stays open: SQLite's last close does
    ledger.close()             # not fold the -wal in then, privguard's close must
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert os.path.getsize(str(path) + "-wal") == 0  # checkpointed and truncated
    other.close()
    for suffix in ("-journal", "-wal", "-shm"):
        if os.path.exists(str(path) + suffix):
            os.remove(str(path) + suffix)
    reopened = Ledger.open(path)
    assert len(reopened.history) == 11
    reopened.charge(STEP)
    reopened.close()
    for suffix in ("-wal", "-shm"):
        if os.path.exists(str(path) + suffix):
            os.remove(str(path) + suffix)
    assert len(Ledger.open(path).history) == 12


def test_tampering_while_open_breaks_the_ledger(tmp_path):
    path = tmp_path / "b.db"
    ledger = filled(path)
    _edit(path, "UPDATE head SET entries = 99 WHERE id = 1")
    with pytest.raises(LedgerStateError, match="head"):
        ledger.charge(STEP)
    with pytest.raises(LedgerStateError):  # and stays refused
        ledger.can_afford(STEP)


def test_file_backed_ledger_accepts_only_its_own_prefix(tmp_path):
    path = tmp_path / "b.db"
    ledger = filled(path, n=5)
    prefix = Ledger(3.0, 1e-5)
    for _ in range(3):
        prefix.charge(STEP)
    with pytest.raises(LedgerStateError, match="prefix"):
        ledger.load_state_dict(prefix.state_dict())  # labels differ: not its journal
    same = Ledger.load_state_dict(ledger.state_dict())
    assert ledger.load_state_dict(same.state_dict()) is ledger
    with pytest.raises(BudgetExhausted):
        big = Ledger(3.0, 1e-5, path=tmp_path / "c.db")
        big.charge(M.Gaussian(0.1))


def test_verify_restores_the_garbage_collector_as_it_found_it(tmp_path):
    import gc

    path = _closed_copy(tmp_path)
    assert gc.isenabled()
    cli_verify(path)
    assert gc.isenabled()
    gc.disable()
    try:
        cli_verify(path)
        assert not gc.isenabled()
    finally:
        gc.enable()
    _edit(path, "UPDATE entries SET label = 'edited' WHERE idx = 3")
    with pytest.raises(LedgerStateError):
        cli_verify(path)
    assert gc.isenabled()  # also when verification fails


@pytest.mark.parametrize("snapshot", ["not json", '{"accounting": {}}', "[1, 2]"])
def test_a_rewritten_checkpoint_fails_closed(tmp_path, snapshot):
    # Unkeyed, anyone can recompute a checkpoint's MAC; what it says must still agree
    # with the replayed journal, and garbage is an error of its own, not a KeyError.
    from privguard._stores._rows import Cursor

    path = str(tmp_path / "cp.db")
    ledger = Ledger(delta=1e-5, path=path)
    for i in range(1100):  # checkpoints at rows 512 and 1024
        ledger.charge(M.Gaussian(50.0), label=f"row {i}")
    ledger.close()
    store = open_store(path, read_only=True)
    store.open(None, None, None)
    store.close()

    def rewrite(entries):
        conn = sqlite3.connect(path)
        last_count, head, prev = conn.execute(
            "SELECT last_count, head, prev FROM checkpoints WHERE entries = ?",
            (entries,)).fetchone()
        mac = store._checkpoint_mac(Cursor(entries, last_count, head, prev, None), snapshot)
        conn.execute("UPDATE checkpoints SET snapshot = ?, mac = ? WHERE entries = ?",
                     (snapshot, mac, entries))
        conn.commit()
        conn.close()

    rewrite(512)  # an older checkpoint: opening uses the newest, verify meets this one
    assert len(Ledger.open(path).history) == 1100
    with pytest.raises(LedgerStateError, match="checkpoint at row 512"):
        cli_verify(path)
    rewrite(1024)  # the newest: opening fails closed
    with pytest.raises(LedgerStateError, match="checkpoint at row 1024 is unreadable"):
        Ledger.open(path)


@pytest.mark.parametrize("body", ["[1, 2]", '"text"', '{"event": "retarget", "old": 3}',
                                  '{"event":' + "[" * 100_000 + "]" * 100_000 + "}"],
                         ids=["list", "string", "bad-retarget", "nested-too-deep"])
def test_a_rechained_event_that_is_not_an_object_fails_closed(tmp_path, body):
    # unkeyed, a forger can re-chain any body: what it says is still checked, and an
    # event that is not a JSON object is a LedgerStateError, not an AttributeError
    path = _closed_copy(tmp_path)
    Ledger(4.0, 1e-5, path=path, retarget="approved").close()
    conn = sqlite3.connect(path)
    idx = conn.execute("SELECT idx FROM entries WHERE kind = 'event'").fetchone()[0]
    conn.close()
    _rechain(path, keep=idx + 1, bodies={idx: body})
    with pytest.raises(LedgerStateError, match=f"row {idx}"):
        Ledger.open(path)
    with pytest.raises(LedgerStateError, match=f"row {idx}"):
        cli_verify(path)


def test_keyed_digests_are_hmac_sha256_and_unkeyed_ones_sha256():
    # RFC 4231 test case 2 (an independent reference), then the standard library's hmac on
    # keys shorter than, equal to and longer than SHA-256's 64-byte block, and SHA-256.
    import hashlib
    import hmac

    from privguard._stores._integrity import Integrity

    jefe = Integrity(b"Jefe")
    assert jefe.digest_text("what do ya want for nothing?") == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    for key in (b"k", b"x" * 64, b"y" * 65, bytes(range(200))):
        keyed = Integrity(key)
        for text in ("", "entry\x1eabc\x1e0", "é" * 100):
            data = text.encode("utf-8")
            assert keyed.digest_text(text) == hmac.new(key, data, hashlib.sha256).hexdigest()
            assert keyed.digest_text(text) == keyed.digest_text(text)  # the key's state kept
            assert Integrity(None).digest_text(text) == hashlib.sha256(data).hexdigest()
        assert keyed.digest("a", [1, 2.5]) == hmac.new(
            key, b'["a",[1,2.5]]', hashlib.sha256).hexdigest()


def _rows_in(path):
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
    finally:
        conn.close()


def _fail_inside_the_write(path, how, monkeypatch):
    """Make the next charge's write fail: SQLite refuses the row, or an interrupt arrives
    after the rows were written but before the commit."""
    # (a trigger RAISE(ABORT) made SQLite refuse the row before review sq; a file with a
    # trigger is now refused before any write, so the error is raised after the rows were
    # written, as a full disk's would be at the last page)
    from privguard._stores._sqlite import SQLiteStore

    real = SQLiteStore._write

    def interrupted(self, *args):
        real(self, *args)
        if how == "sqlite error":
            raise sqlite3.OperationalError("database or disk is full")
        raise KeyboardInterrupt

    monkeypatch.setattr(SQLiteStore, "_write", interrupted)
    return LedgerStateError if how == "sqlite error" else KeyboardInterrupt


@pytest.mark.parametrize("how", ["sqlite error", "interrupt"])
def test_a_failed_write_breaks_the_ledger_and_leaves_the_file_as_it_was(tmp_path, how,
                                                                         monkeypatch):
    path = tmp_path / "b.db"
    ledger = filled(path, n=3)  # fix + 4 runs
    expected = _fail_inside_the_write(path, how, monkeypatch)
    with pytest.raises(expected):
        ledger.charge(STEP, label="boom")
    monkeypatch.undo()
    # its memory holds a charge the file does not: it refuses everything from now on
    for use in (lambda: ledger.charge(STEP, label="boom"), lambda: ledger.charge(STEP),
                ledger.epsilon, ledger.state_dict):
        with pytest.raises(LedgerStateError, match=r"unusable.*write to the store failed"):
            use()
    assert _rows_in(path) == 5  # nothing was written over another row
    assert cli_verify(path)["charges"] == 4
    again = Ledger.open(path)
    assert len(again.history) == 4
    again.charge(STEP, label="after")
    assert cli_verify(path)["charges"] == 5


def test_a_disk_that_fills_up_breaks_the_ledger_and_never_corrupts_the_file(tmp_path):
    # A real I/O error, no tampering: the file may not grow past its size (RLIMIT_FSIZE).
    path = tmp_path / "full.db"
    code = f"""
import resource, signal, sqlite3
from privguard import Ledger, LedgerStateError, mechanisms as M
step = M.SubsampledGaussian(1.0, 0.01)
ledger = Ledger(3.0, 1e-5, path={str(path)!r})
for i in range(3):
    ledger.charge(step, label=f"s{{i}}")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
try:
    ledger.charge(step, label="while full")
    raise SystemExit("the charge went through with the disk full")
except LedgerStateError:
    pass
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
for label in ("while full", "later"):
    try:
        ledger.charge(step, label=label)
        raise SystemExit("a ledger whose write failed went on charging")
    except LedgerStateError as exc:
        assert "unusable" in str(exc), exc
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert cli_verify(path)["charges"] == 3
    assert len(Ledger.open(path).history) == 3


def test_a_journal_read_that_fails_its_chain_breaks_the_open_ledger(tmp_path):
    # Opening replays only the rows after the newest checkpoint; a whole-journal read
    # (history, state_dict) meets an edit older than that, and the ledger stays closed.
    path = tmp_path / "b.db"
    filled(path, n=600).close()  # 602 rows: a checkpoint at row 512
    ledger = Ledger.open(path)
    _edit(path, "UPDATE entries SET label = 'edited' WHERE idx = 5")
    with pytest.raises(LedgerStateError, match="row 5 fails its digest chain"):
        len(ledger.history)
    with pytest.raises(LedgerStateError, match=r"unusable.*row 5"):
        ledger.charge(STEP)
    with pytest.raises(LedgerStateError, match="row 5 fails its digest chain"):
        cli_verify(path)


def _remac_checkpoint(path, entries, edit):
    """Rewrite checkpoint ``entries``'s snapshot with ``edit`` and recompute its MAC, as a
    forger without a key can (the library's own function)."""
    from privguard._stores._rows import Cursor

    store = open_store(path, read_only=True)
    store.open(None, None, None)
    store.close()
    conn = sqlite3.connect(path)
    last_count, head, prev, snapshot = conn.execute(
        "SELECT last_count, head, prev, snapshot FROM checkpoints WHERE entries = ?",
        (entries,)).fetchone()
    snap = json.loads(snapshot)
    edit(snap)
    text = json.dumps(snap, sort_keys=True, separators=(",", ":"))
    mac = store._checkpoint_mac(Cursor(entries, last_count, head, prev, None), text)
    conn.execute("UPDATE checkpoints SET snapshot = ?, mac = ? WHERE entries = ?",
                 (text, mac, entries))
    conn.commit()
    conn.close()


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def edit(snap):
        d = snap
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return edit


@pytest.mark.parametrize("edit", [
    _set("accounting", "journal", "streak", 1, 1),  # a refund on open: the streak's count
    _set("accounting", "journal", "charges", 5),
    _set("accounting", "journal", "base", 0, 0.5),
    _set("accounting", "journal", "last", 6, 1.0),  # the run's last time then
    _set("last_kind", "fix"),
], ids=["streak-count", "charges", "base", "last-time", "last-kind"])
def test_verify_compares_a_checkpoint_whole_even_when_its_run_grew_later(tmp_path, edit):
    # The run the checkpoint ends on grows after the checkpoint is written (a DP-SGD run
    # does). Verify replays the row as the checkpoint saw it and compares everything.
    path = str(tmp_path / "grown.db")
    step = M.Gaussian(60.0)
    ledger = Ledger(3.0, 1e-5, path=path)
    for i in range(511):  # the fix row and 511 runs: a checkpoint at row 512
        ledger.charge(step, label=f"r{i}")
    for _ in range(300):  # row 511 grows after the checkpoint
        ledger.charge(step, label="r510")
    ledger.close()
    assert cli_verify(path)["checkpoints"] == 1
    _remac_checkpoint(path, 512, edit)
    with pytest.raises(LedgerStateError, match="checkpoint at row 512"):
        cli_verify(path)


def test_a_checkpoint_that_misstates_the_kind_of_its_last_row_fails_closed_on_open(tmp_path):
    path = str(tmp_path / "head.db")
    ledger = Ledger(3.0, 1e-5, path=path)
    for i in range(511):  # the checkpoint at row 512 is the head
        ledger.charge(M.Gaussian(60.0), label=f"r{i}")
    ledger.close()
    _remac_checkpoint(path, 512, _set("last_kind", "fix"))
    with pytest.raises(LedgerStateError, match="checkpoint at row 512 is inconsistent"):
        Ledger.open(path)  # (it used to open, and its next charge raised AssertionError)
    with pytest.raises(LedgerStateError, match="checkpoint at row 512"):
        cli_verify(path)


@pytest.mark.parametrize("edit", [
    lambda fix: fix.update(odometer="x"),  # used to open and verify, then break epsilon()
    lambda fix: fix.update(odometer={"weights": "x"}),
    lambda fix: fix["filter"].update(weights=[w / 2 for w in fix["filter"]["weights"]]),
    lambda fix: fix.update(filter="x"),
], ids=["odometer-text", "odometer-weights-text", "weaker-filter-weights", "filter-text"])
def test_a_rechained_fix_row_must_hold_what_its_plan_derives(tmp_path, edit):
    path = _closed_copy(tmp_path)
    conn = sqlite3.connect(path)
    fix = json.loads(conn.execute("SELECT body FROM entries WHERE idx = 0").fetchone()[0])
    conn.close()
    edit(fix)
    _rechain(path, keep=32, bodies={0: json.dumps(fix, sort_keys=True, separators=(",", ":"))})
    with pytest.raises(LedgerStateError, match="journal row 0"):
        Ledger.open(path)
    with pytest.raises(LedgerStateError, match="journal row 0"):
        cli_verify(path)



@pytest.mark.parametrize("sql", [
    "UPDATE checkpoints SET last_count = 'x'",
    "UPDATE checkpoints SET head = X'00'",
    "UPDATE checkpoints SET snapshot = CAST(snapshot AS BLOB)",
    "UPDATE checkpoints SET last_count = 1e400",
])
def test_an_edited_checkpoint_cell_fails_closed(tmp_path, sql):
    path = tmp_path / "cp.db"
    filled(path, n=530).close()  # a checkpoint at row 512, the newest: opening reads it
    _edit(path, sql)
    with pytest.raises(LedgerStateError, match="checkpoint"):
        Ledger.open(path)
    with pytest.raises(LedgerStateError, match="checkpoint"):
        cli_verify(path)


def test_a_rechained_retarget_that_changes_nothing_is_refused(tmp_path):
    # privguard never logs a retarget that keeps the configuration; one forged into the
    # journal would swap a hybrid filter for the RDP filter (a relaxation), so it is refused
    path = tmp_path / "b.db"
    Ledger(3.0, 1e-5, path=path).close()
    ledger = Ledger(4.0, 1e-5, path=path, retarget="approved")  # row 0: the retarget
    for i in range(5):
        ledger.charge(STEP, label=f"s{i}")  # row 1 fixes the plan under ε = 4
    ledger.close()
    conn = sqlite3.connect(path)
    event = json.loads(conn.execute("SELECT body FROM entries WHERE idx = 0").fetchone()[0])
    conn.close()
    event["old"] = event["new"]  # now from ε = 4 to ε = 4, genesis and all
    _edit(path, "UPDATE meta SET value = ? WHERE key = 'genesis_config'",
          json.dumps(event["new"], sort_keys=True, separators=(",", ":")))
    _rechain(path, keep=7, bodies={0: json.dumps(event, sort_keys=True, separators=(",", ":"))})
    with pytest.raises(LedgerStateError, match="row 0: a retarget that changes nothing"):
        Ledger.open(path)
    with pytest.raises(LedgerStateError, match="row 0: a retarget that changes nothing"):
        cli_verify(path)


def test_a_checkpoint_is_written_after_the_transactions_last_row(tmp_path, monkeypatch):
    # A first charge without a plan writes two rows, fix and run. With the fix row just
    # before a checkpoint's multiple, the checkpoint used to be written between them: the
    # fix row's cursor with the run's accounting, and the honest file no longer opened.
    from privguard._stores import _sqlite

    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 4)  # as at 512 rows, sooner
    path = tmp_path / "b.db"
    Ledger(3.0, 1e-5, path=path).close()
    for i in range(3):  # logged retargets before the first charge: rows 0..2
        Ledger(3.5 if i % 2 == 0 else 3.0, 1e-5, path=path, retarget=f"r{i}").close()
    ledger = Ledger.open(path)
    ledger.charge(STEP, label="train")  # fix row 3, run row 4
    eps = ledger.epsilon()
    ledger.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT entries, last_count FROM checkpoints").fetchall() == [(5, 1)]
    conn.close()
    again = Ledger.open(path)
    assert len(again.history) == 1 and again.epsilon() == eps
    assert cli_verify(path)["checkpoints"] == 1


def test_charging_a_read_only_ledger_is_refused_and_it_stays_readable(tmp_path):
    path = _closed_copy(tmp_path)
    reader = Ledger.open(path, read_only=True)
    eps = reader.epsilon()
    for _ in range(2):
        with pytest.raises(LedgerStateError, match="read-only: it cannot be charged"):
            reader.charge(STEP)
    assert reader.epsilon() == eps and len(reader.history) == 31 and reader.can_afford(STEP)


def test_an_unknown_row_kind_behind_the_checkpoint_breaks_the_ledger_that_reads_it(tmp_path):
    path = tmp_path / "b.db"
    filled(path, n=520).close()  # a checkpoint at row 512: opening does not read row 0
    _edit(path, "UPDATE entries SET kind = X'00' WHERE idx = 0")
    ledger = Ledger.open(path)
    with pytest.raises(LedgerStateError, match="row 0 has an unknown kind"):
        len(ledger.history)  # a TypeError before, and the ledger went on charging
    with pytest.raises(LedgerStateError, match="unusable"):
        ledger.charge(STEP)


@pytest.mark.parametrize("edit", [
    _set("accounting", "journal", "streak", 1, 10 ** 400),  # OverflowError at epsilon()
    _set("accounting", "journal", "streak", 1, 10 ** 6),  # more than the charges
    _set("accounting", "fixed", "odometer", {}),  # KeyError at epsilon()
    _set("accounting", "fixed", "odometer", "x"),  # TypeError at epsilon()
    _set("accounting", "fixed", "odometer", {"weights": [1e40] * 157}),
], ids=["streak-huge", "streak-over-charges", "odometer-empty", "odometer-text",
        "odometer-weights"])
def test_a_remaced_newest_checkpoint_that_cannot_hold_fails_closed_on_open(tmp_path, edit):
    path = str(tmp_path / "cp.db")
    ledger = Ledger(3.0, 1e-5, path=path)
    for i in range(520):  # the checkpoint at row 512 is the newest: opening reads it
        ledger.charge(M.Gaussian(200.0), label=f"r{i}")
    ledger.close()
    _remac_checkpoint(path, 512, edit)
    with pytest.raises(LedgerStateError, match="checkpoint"):
        Ledger.open(path).epsilon()
    with pytest.raises(LedgerStateError, match="checkpoint"):
        cli_verify(path)
