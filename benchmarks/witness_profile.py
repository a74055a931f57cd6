"""Where a witnessed step's extra time goes: each witness timed in place, inside real steps.

The witnessed pipeline of benchmarks/test_bench_witnesses.py (20-64-2 MLP, batch
128, one torch thread). Each part is wrapped with a wall-clock timer and run
inside real steps (after Opacus' own work, with the caches as a step leaves
them: the same small kernels cost several times their cost in a tight loop), and
the median per step is printed beside Opacus' own ``clip_and_accumulate`` and
the whole ``optimizer.step``:

- ``clip wrapper`` — the clipping witness's wrapper around Opacus' clipping on a
  micro-batch it does not recompute (7 in 8 after the first);
- ``clip check`` — the exact per-sample recomputation (every micro-batch here;
  1 in 8 in a real run);
- ``noise statistic`` — ``Witnesses._measure`` (copy, subtraction, norms);
- ``check`` — the whole check stage (noise, clipped-sum bound, sampling tests,
  per-record counts: all at every step), ``sampling tests`` its binomial tests.

With ``--ops``, the noise pass (``Witnesses._measure``) op by op instead: each torch
call it makes (the fused copy, the subtractions, the fused norm, the stack, the Gram
product) and its host syncs (``tolist``, ``item``, ``float``), timed in place through a
timing proxy of the module's ``torch`` (the code timed is the tree's own), summed per
step; ``Python`` is the rest of ``_measure``, and the rest of the check stage is printed
beside it.

With ``--ablate``, the whole paired gap attributed instead, with no timer inside the step
(:func:`ablate`): attach alone and five witnessed pipelines, each with one more part of the
witnesses switched off, step in turn a round each, in a new random order each round (CPU
time of the thread, as witness_cost.py times them); each part's cost is the difference of
the medians of two neighbours, so the parts sum to the whole gap (the difference of the
medians of the witnessed step and attach's), cache effects included.

Timers add about a microsecond each; the VM's load moves every number (run it
twice). What the witnesses cost as a ratio: benchmarks/witness_cost.py.

Run: python benchmarks/witness_profile.py [--steps 3000] [--ops | --ablate]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from test_bench_witnesses import dp_sgd_step  # noqa: E402


def _timed(record: list[int], call):
    def timed(*args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return call(*args, **kwargs)
        finally:
            record.append(time.perf_counter_ns() - start)
    return timed


def profile(steps: int, check_every: bool) -> dict[str, float]:
    """Median microseconds per step of each part, the per-sample check on every
    micro-batch (``check_every``) or never after the first."""
    from privguard.integrations.opacus import _ATTACHED

    before = set(_ATTACHED)
    step = dp_sgd_step("witnesses")
    (optimizer,) = [o for o in _ATTACHED if o not in before]
    witnesses = _ATTACHED[optimizer].witnesses
    witnesses._coins = SimpleNamespace(random=lambda: 0.0 if check_every else 1.0)
    times: dict[str, list[int]] = {k: [] for k in (
        "opacus clip", "wrapper", "noise statistic", "sampling tests", "check", "step")}
    witnesses._original = _timed(times["opacus clip"], witnesses._original)
    optimizer.clip_and_accumulate = _timed(times["wrapper"], optimizer.clip_and_accumulate)
    witnesses._measure = _timed(times["noise statistic"], witnesses._measure)
    witnesses._check_sampling = _timed(times["sampling tests"], witnesses._check_sampling)
    witnesses.check = _timed(times["check"], witnesses.check)
    optimizer.step = _timed(times["step"], optimizer.step)
    for _ in range(50):
        step()
    for record in times.values():
        record.clear()
    for _ in range(steps):
        step()
    own = [w - o for w, o in zip(times.pop("wrapper"), times["opacus clip"], strict=True)]
    out = {k: statistics.median(v) / 1e3 for k, v in times.items() if v}
    out["clip check" if check_every else "clip wrapper"] = statistics.median(own) / 1e3
    return out


_TIMED_OPS = ("sub", "_foreach_norm", "stack", "mm")
_SYNCS = ("tolist", "item", "__float__")


def ops(steps: int) -> None:
    """Print the noise pass op by op: median µs per step of each call, inside real steps."""
    import torch

    from privguard.integrations import _witnesses as module
    from privguard.integrations.opacus import _ATTACHED

    before = set(_ATTACHED)
    step = dp_sgd_step("witnesses")
    (optimizer,) = [o for o in _ATTACHED if o not in before]
    witnesses = _ATTACHED[optimizer].witnesses
    witnesses._coins = SimpleNamespace(random=lambda: 1.0)  # no per-sample recomputation
    now: dict[str, int] = {}  # this step's ns per call name
    inside = [False]

    def timed(name, call):
        def run(*args, **kwargs):
            start = time.perf_counter_ns()
            try:
                return call(*args, **kwargs)
            finally:
                if inside[0]:
                    now[name] = now.get(name, 0) + time.perf_counter_ns() - start
        return run

    class TimedTorch:  # the module's torch, its noise-pass calls timed
        def __getattr__(self, name):
            attr = getattr(torch, name)
            return timed(name, attr) if name in _TIMED_OPS else attr

    module.torch = TimedTorch()
    if module._FOREACH_COPY is not None:
        module._FOREACH_COPY = timed("_foreach_copy_", module._FOREACH_COPY)
    originals = {name: getattr(torch.Tensor, name) for name in _SYNCS}
    for name, method in originals.items():
        setattr(torch.Tensor, name, timed(name, method))
    measure, check = witnesses._measure, witnesses.check

    def measured(scale):
        inside[0] = True
        start = time.perf_counter_ns()
        try:
            return measure(scale)
        finally:
            now["_measure"] = time.perf_counter_ns() - start
            inside[0] = False

    def checked(mechanism):
        start = time.perf_counter_ns()
        try:
            return check(mechanism)
        finally:
            now["check"] = time.perf_counter_ns() - start

    witnesses._measure, witnesses.check = measured, checked
    per_step: list[dict[str, int]] = []
    try:
        for i in range(50 + steps):
            now.clear()
            step()
            if i >= 50:
                per_step.append(dict(now))
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
        module.torch = torch
    names = sorted({k for s in per_step for k in s} - {"_measure", "check"})

    def med(key):
        return statistics.median(s.get(key, 0) for s in per_step) / 1e3

    python = statistics.median(s["_measure"] - sum(s.get(k, 0) for k in names)
                               for s in per_step) / 1e3
    print(f"{steps} steps, the noise pass (Witnesses._measure) op by op, median µs per step "
          "(one thread, wall clock, in place):")
    for name in names:
        print(f"  {name:20s} {med(name):8.1f}")
    print(f"  {'Python':20s} {python:8.1f}")
    print(f"  {'_measure (all)':20s} {med('_measure'):8.1f}")
    print(f"  check stage (all)    {med('check'):8.1f}   (the rest: the tests' host arithmetic, "
          "the sampling tests, the per-record counts)")


_ABLATED = ("attach", "all off", "+ loader records", "+ clip wrapper", "+ check stage",
            "witnesses")


def _witnessed(parts: int):
    """A witnessed step with only the first ``parts`` of the witnesses on: 0, none (the
    hook's other witness work: the δ reserve, the refusal handling); 1, the loader's records
    (the micro-batch sizes and the per-record indices); 2, the clipping wrapper, without
    its per-sample recomputation; 3, the check stage (noise, clipped-sum bound, sampling
    tests); 4, all of it (the recomputation on 1 micro-batch in 8)."""
    from privguard.integrations.opacus import _ATTACHED

    before = set(_ATTACHED)
    step = dp_sgd_step("witnesses")
    (optimizer,) = [o for o in _ATTACHED if o not in before]
    handle = _ATTACHED[optimizer]
    w = handle.witnesses
    if parts < 4:
        w._coins = SimpleNamespace(random=lambda: 1.0)  # no recomputation after the first
    if parts < 3:
        w.check = lambda mechanism: None
    if parts < 2:  # Opacus' own clipping, unwrapped
        vars(optimizer).pop("clip_and_accumulate", None)
    if parts < 1:  # the loader's records off: its sampler's class back, no sizes recorded
        if w.inclusion is not None:
            w.inclusion.restore()
        handle.counter.sizes = None
    return step


def ablate(rounds: int) -> None:
    """Print the paired gap of the witnessed step over attach's, part by part."""
    steps = {"attach": dp_sgd_step("attach")}
    steps.update({name: _witnessed(i) for i, name in enumerate(_ABLATED[1:])})
    for _ in range(50):  # warm-up, past the first micro-batch's recomputation
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    order, shuffle = list(steps), random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for mode in order:
            start = time.thread_time()
            steps[mode]()
            times[mode].append(time.thread_time() - start)
    medians = {mode: statistics.median(t) for mode, t in times.items()}
    base = medians["attach"]
    print(f"{rounds} interleaved rounds (random order), CPU time of the thread per step; "
          f"attach alone {base * 1e6:.0f} µs (median); each part: the difference of its "
          "median from the row above's, µs")
    names = list(steps)
    for above, name in itertools.pairwise(names):
        print(f"  {name:18s} {(medians[name] - medians[above]) * 1e6:8.1f}")
    whole = medians["witnesses"] - base
    paired = statistics.median(t / b for t, b in zip(times["witnesses"], times["attach"],
                                                      strict=True))
    print(f"  {'whole gap':18s} {whole * 1e6:8.1f}   ({1 + whole / base:.3f}× attach; "
          f"paired {paired:.3f}×)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--ops", action="store_true", help="the noise pass op by op")
    parser.add_argument("--ablate", action="store_true",
                        help="the whole paired gap, part by part (no timer inside the step)")
    args = parser.parse_args()
    if args.ablate:
        ablate(args.steps)
        return
    if args.ops:
        ops(args.steps)
        return
    never = profile(args.steps, check_every=False)
    every = profile(args.steps, check_every=True)
    print(f"{args.steps} steps, median µs per step (one thread, wall clock):")
    print(f"  optimizer.step (all)           {never['step']:8.1f}")
    print(f"  Opacus clip_and_accumulate     {never['opacus clip']:8.1f}")
    print(f"  clip wrapper (not recomputed)  {never['clip wrapper']:8.1f}")
    print(f"  clip check (recomputed)        {every['clip check']:8.1f}   (1 micro-batch in 8)")
    print(f"  check stage (every step)       {never['check']:8.1f}")
    print(f"    noise statistic              {never['noise statistic']:8.1f}")
    print(f"    sampling tests               {never['sampling tests']:8.1f}")


if __name__ == "__main__":
    main()
