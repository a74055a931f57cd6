"""Power loss at every point of a commit, in the rollback journal (TRUNCATE) and in WAL.

Issue 26, item 3. ``commit_crash.py`` kills the process (the kernel keeps what was
written); this script models a power cut, where the kernel's page cache is lost too.

A child process opens a ledger file and makes ``--charges`` charges with
``synchronous=FULL``, printing each one's count after ``charge`` returned. strace
records, in order, every write, pwrite, ftruncate, fsync, fdatasync, create and
unlink it makes on the ledger's files (``-e write=all`` dumps the bytes written), and
its writes to stdout. The trace is then replayed on a model filesystem that keeps two
images of each file: what the process sees (every write applied) and what is on the
platter (the image at that file's last fsync or fdatasync). A power cut after event K
leaves, for each file, its platter image plus, depending on the adversary,

* ``drop``: none of the writes since its last sync (the file as of that sync; a file
  never synced is empty), or
* ``subset``: a random subset of them, applied in order (``--seeds`` of them per
  point; writes reach the platter out of order, whole system calls at a time),

and the ``-shm`` index is lost (it is a memory map, never synced; SQLite rebuilds it
from the ``-wal``). Directory entries (create, unlink) are taken as durable at once.
After each cut the reconstructed files are opened with privguard and must

* open and verify from the genesis (a power cut never corrupts the journal), and
* hold every charge whose return the child had printed before event K, and at most
  one more (the one in flight).

This is a simulation of a filesystem that drops unsynced writes, driven by the real
privguard and the real SQLite library; it is not a test of any disk's firmware (a
drive that acknowledges an fsync it has not made durable defeats every journal).

Run: python benchmarks/power_loss.py [--charges 3] [--seeds 3]
Negative control (the simulation can fail): ``--synchronous OFF`` loses returned
charges in both modes, ``--synchronous NORMAL`` in WAL (which then syncs only at
checkpoints).
Needs strace on PATH; Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
SYSCALLS = ("openat,write,pwrite64,fsync,fdatasync,ftruncate,unlink,unlinkat,"
            "rename,renameat,renameat2")

CHILD = r"""
import sys
sys.path.insert(0, {here!r})
from journal_mode import STEP, use_mode
from privguard import Ledger
path, mode, charges, sync = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with use_mode(mode):
    ledger = Ledger(epsilon=1e6, delta=1e-5, path=path)
    ledger._store._conn.execute(f"PRAGMA synchronous = {{sync}}")  # FULL unless a control
    for i in range(charges):
        ledger.charge(STEP)
        print(i + 1, flush=True)
"""

_CALL = re.compile(r"^(\w+)\((.*)\)\s+= (-?\d+)(.*)$")
_FD = re.compile(r"^(\d+)<([^>]*)>")


@dataclass
class Event:
    kind: str  # write | truncate | sync | create | unlink | returned
    path: str = ""
    offset: int = 0
    data: bytes = b""
    size: int = 0


@dataclass
class Trace:
    events: list[Event] = field(default_factory=list)


def _dump_bytes(line: str) -> bytes:
    """The bytes of one strace ``-e write=`` dump line (`` | 00000  hh hh ...  ascii |``)."""
    out = bytearray()
    for j in range(16):
        at = 10 + 3 * j + (1 if j >= 8 else 0)
        pair = line[at:at + 2]
        if pair.strip() == "":
            break
        out.append(int(pair, 16))
    return bytes(out)


def parse(log: str, root: str) -> Trace:
    """The events touching files under ``root``, and the child's stdout writes, in order."""
    trace = Trace()
    pending: Event | None = None
    for line in log.splitlines():
        if line.startswith(" | "):
            if pending is not None:
                pending.data += _dump_bytes(line)
            continue
        pending = None
        m = _CALL.match(line)
        if m is None:
            continue
        name, args, ret, tail = m.group(1), m.group(2), int(m.group(3)), m.group(4)
        if ret < 0:
            continue
        fd = _FD.match(args)
        if name in ("write", "pwrite64") and fd is not None:
            if fd.group(1) == "1":
                pending = Event("returned")
            elif fd.group(2).startswith(root):
                if name == "write":
                    raise SystemExit(f"unexpected write() without an offset: {line}")
                offset = int(args.rsplit(",", 1)[1])
                pending = Event("write", fd.group(2), offset)
            if pending is not None:
                trace.events.append(pending)
        elif name in ("fsync", "fdatasync") and fd is not None and fd.group(2).startswith(root):
            trace.events.append(Event("sync", fd.group(2)))
        elif name == "ftruncate" and fd is not None and fd.group(2).startswith(root):
            trace.events.append(Event("truncate", fd.group(2), size=int(args.rsplit(",", 1)[1])))
        elif name == "openat" and "O_CREAT" in args:
            got = _FD.match(f"{ret}{tail.strip()}")
            if got is not None and got.group(2).startswith(root):
                trace.events.append(Event("create", got.group(2)))
        elif name in ("unlink", "unlinkat"):
            target = re.search(r'"([^"]*)"', args)
            if target is not None and target.group(1).startswith(root):
                trace.events.append(Event("unlink", target.group(1)))
        elif name.startswith("rename") and root in args:
            raise SystemExit(f"unexpected rename in a commit: {line}")
    return trace


def _apply(image: bytearray, ev: Event) -> None:
    if ev.kind == "write":
        end = ev.offset + len(ev.data)
        if len(image) < ev.offset:
            image.extend(b"\0" * (ev.offset - len(image)))
        image[ev.offset:end] = ev.data
    elif ev.kind == "truncate":
        del image[ev.size:]
        image.extend(b"\0" * (ev.size - len(image)))


def platter(trace: Trace, initial: dict[str, bytes], cut: int, rng: random.Random | None
            ) -> tuple[dict[str, bytes], int]:
    """The files on the platter after a power cut following event ``cut`` (exclusive), and
    how many charges had returned by then. ``rng`` None: every unsynced write is lost."""
    synced = {p: bytearray(b) for p, b in initial.items()}
    unsynced: dict[str, list[Event]] = {p: [] for p in initial}
    returned, stdout = 0, b""
    for ev in trace.events[:cut]:
        if ev.kind == "returned":
            stdout += ev.data  # print() may write the number and its newline apart
            lines = stdout.split(b"\n")[:-1]  # complete lines only
            returned = int(lines[-1]) if lines else 0
        elif ev.kind == "create":
            if ev.path not in synced:
                synced[ev.path], unsynced[ev.path] = bytearray(), []
        elif ev.kind == "unlink":
            synced.pop(ev.path, None)
            unsynced.pop(ev.path, None)
        elif ev.kind in ("write", "truncate"):
            unsynced.setdefault(ev.path, []).append(ev)
            synced.setdefault(ev.path, bytearray())
        elif ev.kind == "sync":
            for pending in unsynced.get(ev.path, []):
                _apply(synced[ev.path], pending)
            unsynced[ev.path] = []
    files = {}
    for path, image in synced.items():
        if path.endswith("-shm"):
            continue  # a memory map: never on the platter
        if rng is not None:
            for pending in unsynced.get(path, []):
                if rng.random() < 0.5:
                    _apply(image, pending)
        files[path] = bytes(image)
    return files, returned


def record(db: str, mode: str, charges: int, sync: str) -> str:
    log = db + ".strace"
    cmd = ["strace", "-qq", "-y", "-o", log, f"--trace={SYSCALLS}", "-e", "write=all",
           sys.executable, "-c", CHILD.format(here=HERE), db, mode, str(charges), sync]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
                                  PYTHONDONTWRITEBYTECODE="1"))
    assert out.stdout.split() == [str(i + 1) for i in range(charges)], out
    with open(log) as f:
        return f.read()


def check(mode: str, charges: int, seeds: int, sync: str) -> tuple[int, int, int]:
    """(cut points, reconstructions tried, reconstructions after which every check held)."""
    sys.path.insert(0, HERE)
    from journal_mode import use_mode

    from privguard import Ledger, LedgerStateError

    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.join(tmp, "run")
        os.mkdir(work)
        db = os.path.join(work, "t.db")
        with use_mode(mode):
            Ledger(epsilon=1e6, delta=1e-5, path=db).close()
        initial = {}
        for side in ("", "-journal", "-wal"):  # TRUNCATE mode keeps an empty -journal
            if os.path.exists(db + side):
                with open(db + side, "rb") as f:
                    initial[db + side] = f.read()
        trace = parse(record(db, mode, charges, sync), work)
        for side in ("-journal", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(db + side)
        points = len(trace.events) + 1
        tried = good = 0
        for cut in range(points):
            for seed in [None, *range(seeds)]:
                files, returned = platter(trace, initial, cut,
                                          None if seed is None else random.Random(seed))
                shutil.rmtree(work)
                os.mkdir(work)
                for path, data in files.items():
                    with open(path, "wb") as f:
                        f.write(data)
                tried += 1
                try:
                    with use_mode(mode):
                        ledger = Ledger.open(db)
                        held = len(ledger.history)
                        ledger._store.verify()  # replays the whole chain from the genesis
                        ledger.close()
                except LedgerStateError as exc:
                    print(f"  {mode}: cut {cut} seed {seed}: does not open: {exc}")
                    continue
                if returned <= held <= returned + 1:
                    good += 1
                else:
                    print(f"  {mode}: cut {cut} seed {seed}: {returned} returned, "
                          f"{held} in the journal")
        return points, tried, good


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--charges", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--synchronous", default="FULL",
                        help="a negative control: OFF (or NORMAL in WAL) must lose charges")
    args = parser.parse_args()
    print(f"{args.charges} charges per child, synchronous={args.synchronous}; a power cut after every "
          f"traced event; adversaries: all unsynced writes lost, and {args.seeds} random "
          "subsets of them kept")
    print("| journal mode | cut points | reconstructions | opened, verified, no returned "
          "charge lost |")
    print("|---|---|---|---|")
    for mode in ("TRUNCATE", "WAL"):
        points, tried, good = check(mode, args.charges, args.seeds, args.synchronous)
        print(f"| {mode} | {points} | {tried} | {good} of {tried} |")


if __name__ == "__main__":
    main()
