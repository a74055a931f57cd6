"""The cost of attach on a DP-SGD step: plain Opacus against attach in memory and on file.

The issue-26 setting: a 20-64-2 MLP, batch 128, one thread, Opacus' RDP accountant in
every variant. Each variant is timed over ``--steps`` steps, the variants alternate, and
the table gives medians of ``--rounds`` rounds and the ratio to plain Opacus measured in
the same run.

A second table interleaves single steps: the variant's step with attach's hook on,
the same model with the hook inactive, and plain Opacus, in alternating order (the
measure that resolves a few percent on a loaded machine). A third times attach's step
hook alone (the charge), per call: what attach
adds to a step, less sensitive to a loaded machine than the difference of two
step times.

What these leave out (review rhk3): the pairing check (``integrations/_forward_pairing.py``)
runs at Opacus' clip whether attach's hook is active or not, so "off" runs it too and
on/off leaves it out; its wrap of Opacus' accumulation is process-wide, so "plain Opacus"
in the same process runs the wrap too and on/plain leaves that out; and on one fixed
batch (the default) the loader counts no batch, so the check returns before comparing
anything. ``--draw`` steps on the batches the Poisson loader draws, as a training loop
does. ``--apart`` (:func:`apart`) is the measure with nothing left out: attach's steps in
one worker process, plain Opacus' in another that never imports privguard (it exits if it
finds privguard imported or Opacus' accumulation wrapped), taking turns, both on the
loader's batches.

"lease=1" variants commit every charge; "leases" variants take leases (the default for a
file or server ledger, docs/theory.md §13). ``--postgres`` adds a PostgreSQL ledger on a
local throwaway server (tests/_pgserver.py; needs the PostgreSQL binaries).

``--against COMMIT`` measures this tree against the library of ``COMMIT`` in one run
instead (:func:`against`): two worker processes, one importing each library (a copy of
this tree's ``privguard/`` and ``integrations/``, and that commit's from ``git archive``,
each laid out as the wheel installs them; a worker whose ``privguard`` comes from
elsewhere, an installed one, exits), step the same
variants in turn, a round each, in alternating order, so a load that comes and goes hits
both alike; each round is the interleaved measure above plus attach's hook timed in place.
``--cpu-time`` times the interleaved steps in CPU time of the thread (``time.thread_time``,
as witness_cost.py does) instead of wall time: a step the scheduler preempts on a loaded
machine is then not counted as slower (its caches, evicted meanwhile, still are). It
leaves out other threads' work: a leased ledger's prefetch commits its next lease on a
thread of its own (docs/theory.md §13 "Prefetch"), which wall time on a busy machine counts
and CPU time of the stepping thread does not.

Run: python benchmarks/attach_overhead.py [--rounds 5] [--steps 300] [--postgres]
     [--against COMMIT] [--cpu-time] [--draw] [--apart]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from math import nan

import torch
from _installed_layout import as_installed, ask, close, library_env, require_library
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
DELTA = 1e-5
PG: dict[str, str] = {}  # with --postgres: the database of a local throwaway server
CLOCK = {"now": time.perf_counter}  # the interleaved steps' clock (--cpu-time: the thread's)
DRAW = {"draw": False}  # --draw: every step on the next batch the Poisson loader draws
_NAMES = itertools.count()


def _path(variant: str, tmp: str) -> str | None:
    """Where ``variant`` keeps its ledger: None in memory, a new file, or a new ledger on
    the PostgreSQL server."""
    if "in memory" in variant:
        return None
    if "PostgreSQL" in variant:
        import _pgserver

        return _pgserver.server().url(_pgserver.OWNER, PG["db"], f"bench{next(_NAMES)}")
    path = os.path.join(tmp, f"{variant}{next(_NAMES)}.db")
    if os.path.exists(path):
        os.remove(path)
    return path


def make_step(variant: str, tmp: str, draw: bool | None = None):
    """A closure running one DP-SGD step of the MLP under ``variant``: on one fixed batch,
    or with ``draw`` (default: ``--draw``) on the next batch the (Poisson) loader draws, as
    a training loop does (the pairing check then compares each clip; on the fixed batch the
    loader counts no batch and the check returns before comparing: review rhk3).
    ``privguard`` is imported only for an attach variant (``--apart``'s plain worker never
    imports it)."""
    if draw is None:
        draw = DRAW["draw"]
    torch.manual_seed(0)
    x = torch.randn(8192, 20)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=128), noise_multiplier=1.0,
        max_grad_norm=1.0, poisson_sampling=True)
    ledger = None
    if variant != "plain Opacus":
        from privguard import Ledger
        from privguard.integrations.opacus import attach

        path = _path(variant, tmp)
        # "lease=1": a durable commit per step; otherwise a file takes leases (theory §13)
        ledger = Ledger(delta=DELTA, path=path, lease=1 if "lease=1" in variant else None,
                        prefetch=False if "prefetch off" in variant else None)
        if variant.endswith("fast path off"):
            ledger._acc.fast = False  # the grid arithmetic on every charge (before issue 26)
        attach(opt, ledger, data_loader=loader)
    xb, yb = x[:128], data.tensors[1][:128]
    batches = _endless(loader) if draw else None

    def step():
        opt.zero_grad()
        xs, ys = (xb, yb) if batches is None else next(batches)
        nn.functional.cross_entropy(model(xs), ys).backward()
        opt.step()

    step.optimizer = opt  # type: ignore[attr-defined]
    return step, ledger


def _endless(loader):
    """The loader's batches, epoch after epoch (each epoch's iterator made when reached)."""
    while True:
        yield from loader


#: Steps of :func:`hook_cost` not timed (warm-up): a run needs more than this many.
WARMUP = 20


def at_least(least: int):
    """An argparse ``type``: an int ≥ ``least``, else a clear usage error (not a crash)."""
    def count(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value
    return count


def hook_cost(variant: str, steps: int, tmp: str,
              prepare=None) -> tuple[float, float]:
    """Median and mean time of attach's step hook (the charge) per step, timed around the
    hook itself: a load-independent view of what attach adds to a step. With leases the
    mean is the one to read: one step in up to 16 pays a commit, the others none.
    ``prepare``: called with the ledger before the steps (lease_step_profile.py's
    diagnoses)."""
    spent: list[int] = []
    with hook_timed(spent):
        step, ledger = make_step(variant, tmp)
        if prepare is not None:
            prepare(ledger)
        for _ in range(steps):
            step()
    if ledger is not None:
        ledger.close()
    return (statistics.median(spent[WARMUP:]) / 1e9,
            statistics.mean(spent[WARMUP:]) / 1e9)


@contextlib.contextmanager
def hook_timed(spent: list[int]):
    """Inside: the time (ns) of each call of attach's step hook, on any optimizer attached
    here, appended to ``spent``. Timed as attach's own hook: a step hook set over it is
    called after the charge (attach charges a step before a hook that replaced its own
    sees it), so a wrapper would time nothing."""
    from privguard.integrations.opacus import AttachHandle

    hook = AttachHandle._hook

    def timed(handle, optimizer):
        t0 = time.perf_counter_ns()
        hook(handle, optimizer)
        spent.append(time.perf_counter_ns() - t0)

    AttachHandle._hook = timed  # type: ignore[method-assign]
    try:
        yield
    finally:
        AttachHandle._hook = hook  # type: ignore[method-assign]


def median_call(fn, calls: int) -> float:
    """Median seconds of ``fn()`` over ``calls`` calls."""
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e9


def hook_parts(calls: int = 3000) -> dict[str, float]:
    """Medians (seconds) of the parts of attach's step hook, called directly on a trained
    in-memory attach: the mechanism lookup, the charge (fast path on and off), Opacus'
    own accountant hook (which plain Opacus runs too) and the whole hook."""
    from privguard.integrations.opacus import _ATTACHED

    step, ledger = make_step("attach, in memory", "")
    for _ in range(30):
        step()
    opt = step.optimizer
    handle = _ATTACHED[opt]
    mech = handle.next_mechanism()

    def med(fn) -> float:
        return median_call(fn, calls)

    out = {"next_mechanism()": med(handle.next_mechanism),
           "charge, fast path": med(lambda: ledger.charge(mech, label=handle.label))}
    ledger._acc.fast = False
    out["charge, fast path off"] = med(lambda: ledger.charge(mech, label=handle.label))
    ledger._acc.fast = True
    out["Opacus' own accountant hook"] = med(lambda: handle._previous_hook(opt))
    out["the whole hook (attach's and Opacus')"] = med(lambda: handle._hook(opt))
    return out


def interleaved(variant: str, steps: int, tmp: str) -> tuple[float, float, float, float]:
    """attach's cost in steps interleaved one by one, on a loaded machine the measure that
    resolves a few percent: ``variant``'s step with its hook on, the same model and
    optimizer with the hook inactive (it then only calls Opacus' own accountant hook,
    as plain Opacus does), and a plain Opacus step, in alternating order, ``steps`` of
    each. Returns the medians (on, off, plain) and the ratio of the means on/off (the
    mean counts the steps that commit a lease)."""
    step, ledger = make_step(variant, tmp)
    plain, _ = make_step("plain Opacus", tmp)
    for _ in range(20):
        step()
        plain()
    measured = _interleave(step, plain, steps)
    if ledger is not None:
        ledger.close()
    return measured


def _interleave(step, plain, steps: int, spent: list[int] | None = None
                ) -> tuple[float, float, float, float]:
    """:func:`interleaved`'s measure on made steps; ``spent`` (the list :func:`hook_timed`
    fills): kept to the hook's times of the steps with the hook on. Plain Opacus steps
    with Opacus' accumulation unwrapped (the pairing check's wrap is process-wide: before
    review rhk3 plain Opacus ran it too, and on/plain left it out); the hook off still
    runs the pairing check at the clip and the wrap (on/off leaves them out)."""
    from opacus.grad_sample import grad_sample_module as gsm

    from privguard.integrations.opacus import _ATTACHED

    handle = _ATTACHED[step.optimizer]
    wrapped = gsm.create_or_accumulate_grad_sample
    bare = wrapped.__wrapped__ if getattr(wrapped, "_privguard_watch", False) else wrapped
    times: dict[int, list[float]] = {0: [], 1: [], 2: []}  # on, off, plain
    # review rhk3: on the loader's batches (--draw) no step with the hook off: its batch
    # would count in the next charged step's window (two micro-batches, another mechanism
    # each step: no fast path, a lease per step), a cost no loop pays
    kinds = (0, 2) if DRAW["draw"] else (0, 1, 2)
    try:
        for i in range(steps):
            for kind in (kinds if i % 2 else kinds[::-1]):
                handle._active = kind == 0
                run_one = plain if kind == 2 else step
                gsm.create_or_accumulate_grad_sample = bare if kind == 2 else wrapped
                kept = None if spent is None else len(spent)
                clock = CLOCK["now"]
                t0 = clock()
                run_one()
                times[kind].append(clock() - t0)
                if kept is not None and kind != 0:
                    del spent[kept:]  # the hook inactive (or plain Opacus'): not attach's cost
    finally:
        gsm.create_or_accumulate_grad_sample = wrapped
    handle._active = True
    if not times[1]:  # --draw: on/off not measured (nan)
        return statistics.median(times[0]), nan, statistics.median(times[2]), nan
    on, off, pl = (statistics.median(times[k]) for k in range(3))
    return on, off, pl, statistics.mean(times[0]) / statistics.mean(times[1])


def _worker(tmp: str, library: str) -> None:
    """``--worker``: answer each request line (a variant and a step count) on stdin with
    one JSON line: :func:`interleaved`'s on, off, plain and means, and the median of
    attach's hook timed in place over the steps with the hook on. One model per variant,
    made at its first request and kept (warmed up once). Exits at once, naming what it
    imported, unless its ``privguard`` (and integrations) are ``library``'s (review rhk)."""
    import privguard.integrations.opacus as opacus_integration

    print(f"worker: {opacus_integration.__file__}", file=sys.stderr, flush=True)
    require_library(library)
    spent: list[int] = []
    made: dict[str, tuple] = {}
    with hook_timed(spent):
        for line in sys.stdin:
            variant, steps = line.rstrip("\n").split("\t")
            if variant not in made:
                made[variant] = (make_step(variant, tmp), make_step("plain Opacus", tmp))
                for _ in range(WARMUP):
                    made[variant][0][0]()
                    made[variant][1][0]()
            (step, _ledger), (plain, _) = made[variant]
            spent.clear()
            on, off, pl, means = _interleave(step, plain, int(steps), spent)
            print(json.dumps([on, off, pl, means, statistics.median(spent) / 1e9]), flush=True)


def _this_tree(into: str) -> str:
    """:func:`_library_of` for this working tree as it is (review rhk: the worker of "this
    tree" imported whichever ``privguard`` the interpreter had installed, this tree's only
    where that was an editable install of it)."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    return as_installed(root, os.path.join(into, "here"))


def _library_of(commit: str, into: str) -> str:
    """A folder to put first on ``PYTHONPATH`` whose ``privguard`` is ``commit``'s (with its
    ``integrations/`` as ``privguard.integrations``, as the wheel installs it)."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    archive = os.path.join(into, "src.tar")
    subprocess.run(["git", "archive", "-o", archive, commit, "privguard", "integrations"],
                   cwd=root, check=True)
    src = os.path.join(into, "src")
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    os.rename(os.path.join(src, "integrations"), os.path.join(src, "privguard", "integrations"))
    return src


def against(commit: str, rounds: int, steps: int, variants: list[str], cpu_time: bool = False
            ) -> None:
    """This tree's attach against ``commit``'s, in one run (``--against``): per variant, the
    medians over ``rounds`` of each round's on/off and on/plain ratios (interleaved steps)
    and of attach's hook timed in place."""
    here = os.path.dirname(os.path.abspath(__file__))
    results: dict[tuple[str, str], list[list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": _this_tree(tmp), commit: _library_of(commit, tmp)}
        workers = {}
        for i, (name, path) in enumerate(trees.items()):
            files = os.path.join(tmp, f"ledgers{i}")  # each worker its own ledger files
            os.mkdir(files)
            workers[name] = subprocess.Popen(
                [sys.executable, os.path.join(here, "attach_overhead.py"), "--worker", files,
                 "--library", path, *(["--cpu-time"] if cpu_time else []),
                 *(["--draw"] if DRAW["draw"] else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=library_env(path))
        try:
            for r in range(rounds):
                order = list(trees) if r % 2 == 0 else list(trees)[::-1]
                for v in variants:
                    for name in order:
                        answer = ask(workers[name], name, f"{v}\t{steps}")
                        results.setdefault((name, v), []).append(json.loads(answer))
        finally:
            close(workers.values())
    batches = "the loader's batches" if DRAW["draw"] else "one fixed batch"
    print(f"this tree against {commit}: {rounds} rounds in alternating order, each "
          f"{steps} steps of on, off and plain Opacus interleaved "
          f"({'CPU time of the thread' if cpu_time else 'wall time'}, on {batches}); "
          f"medians over rounds")
    print("| variant | library | on/off (medians) | on/off (means) | on/plain | hook in place |")
    print("|---|---|---|---|---|---|")
    for v in variants:
        for name in trees:
            rows = results[(name, v)]
            print(f"| {v} | {name} | {statistics.median(r[0] / r[1] for r in rows):.4f}× | "
                  f"{statistics.median(r[3] for r in rows):.4f}× | "
                  f"{statistics.median(r[0] / r[2] for r in rows):.4f}× | "
                  f"{statistics.median(r[4] for r in rows) * 1e6:.1f} µs |")


#: Steps a worker of :func:`apart` runs per request (the two workers alternate by requests):
#: one, as :func:`interleaved` alternates single steps (turns of 10 at load 6-7 gave the
#: control row 0.89x and 0.97x; turns of 1, 1.002x and 0.989x: review rhk3)
CHUNK = 1


def _require_plain() -> None:
    """In ``--apart``'s plain worker: exit, naming what it found, if ``privguard`` was
    imported or Opacus' accumulation is wrapped (the pairing check's wrap is process-wide:
    plain Opacus steps in a process that attached anything run it; review rhk3)."""
    from opacus.grad_sample import grad_sample_module as gsm

    imported = sorted(m for m in sys.modules if m.split(".")[0] == "privguard")
    accumulate = getattr(gsm, "create_or_accumulate_grad_sample", None)
    if imported or getattr(accumulate, "_privguard_watch", False) or hasattr(
            accumulate, "__wrapped__"):
        sys.exit(f"plain worker: not plain Opacus (privguard modules {imported[:3]}, "
                 f"Opacus' accumulation {accumulate!r}): the timing would not be plain")


def _apart_worker(tmp: str, library: str | None) -> None:
    """``--apart-worker``: answer each request line (a variant and a step count) with one
    JSON line, the time of each step, run on the loader's batches (:func:`make_step` with
    ``draw``). With ``library`` (attach's worker): its ``privguard`` must be that one, and
    a variant's pairing check must have compared a clip by the end of its warm-up. Without
    (the plain worker): only ``"plain Opacus"``, and :func:`_require_plain` at each request."""
    if library is not None:
        import privguard.integrations.opacus  # noqa: F401 - what require_library reads

        require_library(library)
    made: dict[str, object] = {}
    for line in sys.stdin:
        variant, steps = line.rstrip("\n").split("\t")
        if library is None:
            if variant != "plain Opacus":
                sys.exit(f"plain worker: asked for {variant!r}")
            _require_plain()
        if variant not in made:
            step, _ledger = make_step(variant, tmp, draw=True)
            for _ in range(WARMUP):
                step()
            if library is not None:
                from privguard.integrations.opacus import _ATTACHED

                pairing = _ATTACHED[step.optimizer].pairing
                if pairing is None or not pairing._counted:
                    sys.exit(f"attach worker: {variant}: the pairing check compared no clip")
            made[variant] = step
        step = made[variant]
        clock, times = CLOCK["now"], []
        for _ in range(int(steps)):
            t0 = clock()
            step()  # type: ignore[operator]
            times.append(clock() - t0)
        print(json.dumps(times), flush=True)


def apart(rounds: int, steps: int, variants: list[str], cpu_time: bool = False
          ) -> dict[str, list[list[float]]]:
    """Attach (this tree) against plain Opacus in a process that never imported privguard
    (``--apart``, review rhk3): two worker processes step in turn, :data:`CHUNK` steps a
    request, in alternating order, ``steps`` steps of each per variant and round, every
    step on the next batch the Poisson loader draws (a training loop's steps: the pairing
    check compares each clip). Unlike :func:`interleaved`'s plain Opacus (the same process,
    where the accumulation's wrap is installed) and its hook off (which still runs the
    pairing check at the clip), this ratio contains all of attach's per-step work. The
    variant ``"plain Opacus"`` is the measure's control: plain Opacus in a second worker
    without privguard against the first (1× but for noise and the two processes' own
    difference). Returns per variant the rounds' [variant's median, plain median, ratio of
    medians, ratio of means], and prints their medians over rounds."""
    here = os.path.dirname(os.path.abspath(__file__))
    results: dict[str, list[list[float]]] = {v: [] for v in variants}
    clock = ["--cpu-time"] if cpu_time else []
    with tempfile.TemporaryDirectory() as tmp:
        library = _this_tree(tmp)
        script = os.path.join(here, "attach_overhead.py")

        def worker(*library_args: str, env: dict[str, str] | None = None
                   ) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, script, "--apart-worker", tmp, *library_args, *clock],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

        workers = {"plain": worker()}
        if any(v != "plain Opacus" for v in variants):
            workers["attach"] = worker("--library", library, env=library_env(library))
        if "plain Opacus" in variants:
            workers["control"] = worker()
        try:
            for r in range(rounds):
                for v in variants:
                    first = "control" if v == "plain Opacus" else "attach"
                    times: dict[str, list[float]] = {first: [], "plain": []}
                    for c in range((steps + CHUNK - 1) // CHUNK):
                        for name in ((first, "plain") if (r + c) % 2 else ("plain", first)):
                            asked = v if name == "attach" else "plain Opacus"
                            times[name] += json.loads(ask(workers[name], f"{name} ({asked})",
                                                          f"{asked}\t{CHUNK}"))
                    a, p = times[first], times["plain"]
                    results[v].append([statistics.median(a), statistics.median(p),
                                       statistics.median(a) / statistics.median(p),
                                       statistics.mean(a) / statistics.mean(p)])
        finally:
            close(workers.values())
    print(f"attach (this tree) against plain Opacus in a process without privguard: "
          f"{rounds} rounds, each {CHUNK * ((steps + CHUNK - 1) // CHUNK)} steps of each in "
          f"turns of {CHUNK}, on the Poisson loader's batches "
          f"({'CPU time of the thread' if cpu_time else 'wall time'}); medians over rounds; "
          f"plain Opacus: a second plain worker (the control)")
    print("| variant | its step | plain Opacus (apart) | ratio (medians) | ratio (means) |"
          "\n|---|---|---|---|---|")
    for v, rows in results.items():
        a, p, ratio, means = (statistics.median(row[k] for row in rows) for k in range(4))
        print(f"| {v} | {a * 1e6:,.0f} µs | {p * 1e6:,.0f} µs | {ratio:.4f}× | {means:.4f}× |")
    return results


def run(rounds: int, steps: int, variants: list[str]) -> dict[str, float]:
    per_step: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        made = {v: make_step(v, tmp) for v in variants}
        for v in variants:  # warm-up
            for _ in range(20):
                made[v][0]()
        for _ in range(rounds):
            for v in variants:
                step = made[v][0]
                t0 = time.perf_counter()
                for _ in range(steps):
                    step()
                per_step[v].append((time.perf_counter() - t0) / steps)
        for _, ledger in made.values():
            if ledger is not None:
                ledger.close()
    return {v: statistics.median(ts) for v, ts in per_step.items()}


VARIANTS = ["plain Opacus", "attach, in memory", "attach, file, lease=1",
            "attach, SQLite file, leases", "attach, SQLite file, leases, prefetch off"]
EXTRA = ["attach, in memory, fast path off"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=at_least(1), default=5)
    parser.add_argument("--steps", type=at_least(WARMUP + 1), default=300,
                        help=f"steps per variant; the first {WARMUP} are not timed")
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--against", metavar="COMMIT", default=None,
                        help="this tree against COMMIT's library, in one run")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the interleaved steps in CPU time of the thread")
    parser.add_argument("--draw", action="store_true",
                        help="step on the loader's Poisson batches (default: one fixed batch)")
    parser.add_argument("--apart", action="store_true",
                        help="attach against plain Opacus in a process without privguard, "
                             "on the loader's batches")
    parser.add_argument("--worker", metavar="TMP", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--apart-worker", metavar="TMP", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--library", default=None, help=argparse.SUPPRESS)  # the worker's
    args = parser.parse_args()
    if args.cpu_time:
        CLOCK["now"] = time.thread_time
    DRAW["draw"] = args.draw
    if args.apart_worker is not None:
        _apart_worker(args.apart_worker, args.library)
        return
    if args.apart:
        apart(args.rounds, args.steps,
              ["plain Opacus", "attach, in memory", "attach, SQLite file, leases"],
              args.cpu_time)
        return
    if args.worker is not None:
        if args.library is None:
            parser.error("--worker needs --library (the folder its privguard must come from)")
        _worker(args.worker, args.library)
        return
    if args.against is not None:
        against(args.against, args.rounds, args.steps,
                ["attach, in memory", "attach, SQLite file, leases"], args.cpu_time)
        return
    extra = list(EXTRA)
    if args.postgres:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "tests"))
        import _pgserver

        PG["db"] = _pgserver.initialised_database()
        extra += ["attach, PostgreSQL, lease=1", "attach, PostgreSQL, leases"]
    med = run(args.rounds, args.steps, VARIANTS + extra)
    base = med["plain Opacus"]
    batches = "the loader's batches" if args.draw else "one fixed batch"
    print(f"20-64-2 MLP, batch 128 ({batches}), 1 thread; medians of {args.rounds} "
          f"alternating rounds of {args.steps} steps")
    print("| | per step | vs plain Opacus |\n|---|---|---|")
    for v, t in med.items():
        print(f"| {v} | {t * 1e6:,.0f} µs | {t / base:.3f}× |")
    print(f"\nsteps interleaved one by one ({args.steps * 2} of each; the hook off: the same "
          "model and optimizer, attach's hook inactive):")
    print("| | on | off | plain Opacus | on/off (medians) | on/off (means) | on/plain |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for v in VARIANTS[1:] + extra[1:]:
            on, off, pl, means = interleaved(v, args.steps * 2, tmp)
            print(f"| {v} | {on * 1e6:,.0f} µs | {off * 1e6:,.0f} µs | {pl * 1e6:,.0f} µs | "
                  f"{on / off:.3f}× | {means:.3f}× | {on / pl:.3f}× |")
    print("\nthe hook's parts, called directly (medians of 3,000 calls):")
    print("| part | median |\n|---|---|")
    for what, t in hook_parts().items():
        print(f"| {what} | {t * 1e6:,.1f} µs |")
    print("\nattach's step hook alone (the charge), per step:")
    print("| | median | mean | mean's share of the plain step above |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for v in VARIANTS[1:] + extra:
            h, mean = hook_cost(v, args.steps, tmp)
            print(f"| {v} | {h * 1e6:,.1f} µs | {mean * 1e6:,.1f} µs | {mean / base:.2%} |")


if __name__ == "__main__":
    main()
