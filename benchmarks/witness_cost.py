"""What the witnesses cost, interleaved: Opacus alone, attach, attach(witnesses=True).

The three pipelines of benchmarks/test_bench_witnesses.py (20-64-2 MLP, batch
128, one torch thread) step in turn, one step each per round, so a load that
comes and goes on a shared machine hits all three alike; each step is timed in
CPU time of the thread (``time.thread_time``), and the medians and minima are
reported as ratios to Opacus alone, measured in the same run; ``paired`` is the
median over rounds of each round's ratio to Opacus' step of the same round
(a load that moves from round to round cancels in it).

``--against COMMIT`` adds a fourth mode, the witnesses of that commit
(``git show COMMIT:integrations/_witnesses.py``, installed on an attach of
this tree in place of the current ones), to compare before and after in one run.
``--against-library COMMIT`` compares whole libraries instead (the witnesses' other
modules too, _inclusion.py, _sampling.py, _shard.py, _tails.py, and attach's own step
path): two worker processes, one importing this tree and one ``COMMIT``'s, each laid out
as the wheel installs it (benchmarks/_installed_layout.py, as attach_overhead.py
--against does), each step the three pipelines above in interleaved rounds, in blocks of
``--block`` rounds, the workers alternating block by block so that a load that comes and
goes hits both alike; the paired ratios are reported per library.

Run: python benchmarks/witness_cost.py [--rounds 600] [--against COMMIT]
     python benchmarks/witness_cost.py --against-library COMMIT [--rounds 600] [--block 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from test_bench_witnesses import dp_sgd_step  # noqa: E402

MODES = ("opacus", "attach", "witnesses")


def step_with_witnesses_of(commit: str):
    """A witnessed step whose witnesses are those of ``commit`` (the hook of this tree)."""
    from privguard.integrations.opacus import _ATTACHED

    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "show", f"{commit}:integrations/_witnesses.py"], cwd=root,
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType(f"witnesses_{commit}")
    exec(compile(source, f"{commit}:integrations/_witnesses.py", "exec"), module.__dict__)
    before = set(_ATTACHED)
    step = dp_sgd_step("witnesses")
    (optimizer,) = [o for o in _ATTACHED if o not in before]
    handle = _ATTACHED[optimizer]
    current = handle.witnesses
    current.uninstall()
    handle.witnesses = module.Witnesses(optimizer, current.dataset_size,
                                        false_alarm=current.false_alarm, loader=current._loader)
    handle.witnesses.install()
    return step


def _rounds(steps: dict, rounds: int, times: dict[str, list[float]]) -> None:
    """``rounds`` interleaved rounds of ``steps``, each step's CPU time into ``times``."""
    for _ in range(rounds):
        for mode in steps:
            start = time.thread_time()
            steps[mode]()
            times[mode].append(time.thread_time() - start)


def _worker(library: str, warmup: int) -> None:
    """``--worker``: for each line on stdin (a number of rounds), that many interleaved rounds
    of :data:`MODES`, answered with one JSON line of their CPU times. Exits at once unless
    its ``privguard`` (and integrations) are ``library``'s (as attach_overhead.py's)."""
    from _installed_layout import require_library

    require_library(library)
    steps = {mode: dp_sgd_step(mode) for mode in MODES}
    _rounds(steps, warmup, {mode: [] for mode in MODES})
    for line in sys.stdin:
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        _rounds(steps, int(line), times)
        print(json.dumps(times), flush=True)


def against_library(commit: str, rounds: int, block: int, warmup: int = 30) -> None:
    """This tree's library against ``commit``'s in one run (``--against-library``); each
    worker warms up ``warmup`` rounds first."""
    from _installed_layout import ask, close, library_env
    from attach_overhead import _library_of, _this_tree

    here = os.path.abspath(__file__)
    times: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": _this_tree(tmp), commit: _library_of(commit, tmp)}
        workers = {}
        for name, path in trees.items():
            workers[name] = subprocess.Popen(
                [sys.executable, here, "--worker", path, "--warmup", str(warmup)], cwd=path,
                env=library_env(path),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            times[name] = {mode: [] for mode in MODES}
        try:
            done = 0
            while done < rounds:
                n = min(block, rounds - done)
                order = list(trees) if (done // block) % 2 == 0 else list(trees)[::-1]
                for name in order:
                    for mode, got in json.loads(ask(workers[name], name, str(n))).items():
                        times[name][mode] += got
                done += n
        finally:
            close(workers.values())
    print(f"this tree against {commit}: {rounds} interleaved rounds each, in blocks of {block} "
          "alternating between the two libraries; CPU time of the thread per step")
    for name, per_mode in times.items():
        _report(f"{name}: ", per_mode)


def _report(prefix: str, times: dict[str, list[float]]) -> None:
    """Medians, minima and paired ratios to Opacus alone, and witnesses to attach paired."""
    base_median, base_min = statistics.median(times["opacus"]), min(times["opacus"])
    for mode in times:
        med, low = statistics.median(times[mode]), min(times[mode])
        paired = statistics.median(t / b for t, b in zip(times[mode], times["opacus"],
                                                          strict=True))
        print(f"  {prefix}{mode:18s} median {med * 1e3:.3f} ms ({med / base_median:.3f}×)   "
              f"min {low * 1e3:.3f} ms ({low / base_min:.3f}×)   paired {paired:.3f}×")
    paired = statistics.median(t / b for t, b in zip(times["witnesses"], times["attach"],
                                                      strict=True))
    print(f"  {prefix}witnesses / attach, paired {paired:.3f}×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--against", metavar="COMMIT", default=None)
    parser.add_argument("--against-library", metavar="COMMIT", default=None)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--worker", metavar="LIBRARY", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # review rwc: --block 0 ended in a ZeroDivisionError and --block -3 looped forever,
    # --rounds 0 in a StatisticsError; --warmup never reached the --against-library workers
    for name, least in (("rounds", 1), ("block", 1), ("warmup", 0)):
        if getattr(args, name) < least:
            parser.error(f"--{name} must be at least {least}, got {getattr(args, name)}")
    if args.against and args.against_library:
        parser.error("--against and --against-library: give one")
    if args.worker is not None:
        _worker(args.worker, args.warmup)
        return
    if args.against_library:
        against_library(args.against_library, args.rounds, args.block, args.warmup)
        return
    steps = {mode: dp_sgd_step(mode) for mode in MODES}
    if args.against:
        steps[f"at {args.against}"] = step_with_witnesses_of(args.against)
    for mode in steps:
        for _ in range(args.warmup):
            steps[mode]()
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    _rounds(steps, args.rounds, times)
    print(f"{args.rounds} interleaved rounds, CPU time of the thread per step:")
    _report("", times)


if __name__ == "__main__":
    main()
