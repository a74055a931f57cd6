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

Run: python benchmarks/witness_cost.py [--rounds 600] [--against COMMIT]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--against", metavar="COMMIT", default=None)
    args = parser.parse_args()
    steps = {mode: dp_sgd_step(mode) for mode in MODES}
    if args.against:
        steps[f"at {args.against}"] = step_with_witnesses_of(args.against)
    for mode in steps:
        for _ in range(args.warmup):
            steps[mode]()
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    for _ in range(args.rounds):
        for mode in steps:
            start = time.thread_time()
            steps[mode]()
            times[mode].append(time.thread_time() - start)
    base_median, base_min = statistics.median(times["opacus"]), min(times["opacus"])
    print(f"{args.rounds} interleaved rounds, CPU time of the thread per step:")
    for mode in steps:
        med, low = statistics.median(times[mode]), min(times[mode])
        paired = statistics.median(t / b for t, b in zip(times[mode], times["opacus"],
                                                          strict=True))
        print(f"  {mode:18s} median {med * 1e3:.3f} ms ({med / base_median:.3f}×)   "
              f"min {low * 1e3:.3f} ms ({low / base_min:.3f}×)   paired {paired:.3f}×")


if __name__ == "__main__":
    main()
