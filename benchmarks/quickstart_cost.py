"""The README's quick start, in memory and with ``path=``: the cost of a durable budget.

Issue 26 asks for the quick start with ``path=`` within 1.5× of its in-memory time.
The loop below is the README's (100 epochs of 234 steps, σ 1.1 then 0.9, ε = 3),
without its prints; it stops at the first refusal, as the README's does. Each
variant runs ``--rounds`` times, alternating, in a fresh ledger (and a fresh file).

With leases (docs/theory.md §13, the default for ``path=``) the journal holds the
released charges plus a lease's unused remainder; the count compared below is the
charges the loop released. ``path=, lease=1`` is a durable commit per charge.
Direct charges take no prefetch by default (it is on under ``attach``): the
``prefetch=True`` variant shows what it costs where nothing runs between charges.

Every round runs after an untimed warm-up, so a round times warm runs. ``--against DIR``
also runs every variant with the package of another checkout DIR (``git archive main |
tar -x -C /tmp/base``), a round in a fresh process with DIR first on ``PYTHONPATH``,
alternating with this checkout's (also in a process of its own) round by round:
before/after ratios measured in one run, at one load. ``--meter-evals`` counts, in one
run with ``path=``, the meter evaluations of each lease's sizing (the meter cap's search).

With ``TMPDIR=/dev/shm`` (a tmpfs, where an fsync returns at once) the files' runs show
the Python and SQLite work alone, without the disk's fsync (a diagnosis only).

Run: python benchmarks/quickstart_cost.py [--rounds 3] [--against DIR] [--skip-lease-1]
    [--meter-evals]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _installed_layout import as_installed

from privguard import BudgetExhausted, Ledger, Plan
from privguard import mechanisms as M


def quick_start(path: str | None, lease: int | None = None,
                prefetch: bool | None = None) -> tuple[float, int]:
    """(seconds, charges released) for one run of the README's quick start."""
    t0 = time.perf_counter()
    q = 256 / 60_000
    step = M.SubsampledGaussian(noise_multiplier=1.1, sample_rate=q)
    ledger = Ledger(epsilon=3.0, delta=1e-5, plan=Plan(step, steps=234 * 100), path=path,
                    lease=lease, prefetch=prefetch)
    charges = 0
    for epoch in range(100):
        sigma = 1.1 if epoch < 10 else 0.9
        try:
            for _ in range(234):
                ledger.charge(M.SubsampledGaussian(sigma, q), label="step")
                charges += 1
        except BudgetExhausted:
            break
        ledger.epsilon()
    ledger.guarantee()
    ledger.close()
    return time.perf_counter() - t0, charges


VARIANTS = {"in memory": (False, None, None), "path=, lease=1": (True, 1, None),
            "path= (leases, the default)": (True, None, None),
            "path=, leases, prefetch=True": (True, None, True)}


def one_round(variants: list[str], tmp: str, tag: str) -> list[tuple[float, int]]:
    """(seconds, charges released) of one run of each of ``variants``, in this process,
    after an untimed warm-up (one run in memory, one with ``path=``): a process's first
    run also computes the curves and the δ shares and imports SQLite's side, which later
    runs find cached, so every round times warm runs (review rqs: ``--against`` timed
    each run in a fresh process, cold; in memory took 0.11 to 0.21 s there against
    0.08 s warm, and the ratios to it came out 1.4 to 3.2×)."""
    quick_start(None)
    quick_start(os.path.join(tmp, f"warm{tag}.db"))
    out = []
    for v in variants:
        durable, lease, prefetch = VARIANTS[v]
        path = os.path.join(tmp, f"quick{tag}{lease}{prefetch}.db") if durable else None
        out.append(quick_start(path, lease, prefetch))
    return out


def meter_evaluations(tmp: str, tag: str = "") -> tuple[dict[int, int], int]:
    """({meter evaluations: lease sizings that took that many}, journal charges) of one run
    with ``path=`` (leases, the default): the evaluations of ``meter_from_terms`` in each
    call of ``_lease.meter_room``, the meter cap's search (task qs, review rqs)."""
    from privguard._accounting import _budget, _lease

    real_meter, real_room = _budget.meter_from_terms, _lease.meter_room
    counts: dict[int, int] = {}
    evals = [0]

    def meter(*a: object) -> float:
        evals[0] += 1
        return real_meter(*a)

    def room(*a: object) -> int:
        evals[0] = 0
        n = real_room(*a)
        counts[evals[0]] = counts.get(evals[0], 0) + 1
        return n

    _budget.meter_from_terms, _lease.meter_room = meter, room
    try:
        path = os.path.join(tmp, f"meter{tag}.db")
        quick_start(path)
        ledger = Ledger.open(path)
        leased = len(ledger.history)
        ledger.close()
    finally:
        _budget.meter_from_terms, _lease.meter_room = real_meter, real_room
    return dict(sorted(counts.items())), leased


_LAYOUTS: dict[str, str] = {}


def _layout(checkout: str) -> str:
    """``checkout``'s package as the wheel installs it, copied once per process (its
    ``integrations/`` as ``privguard.integrations``: the bare ``privguard/`` of a checkout
    has no such subpackage, and failed to import beside an installed wheel: CI62)."""
    if checkout not in _LAYOUTS:
        into = tempfile.mkdtemp(prefix="quickstart-cost-")
        atexit.register(shutil.rmtree, into, True)
        _LAYOUTS[checkout] = as_installed(checkout, os.path.join(into, "lib"))
    return _LAYOUTS[checkout]


def in_subprocess(checkout: str, call: str) -> object:
    """``call`` (an expression of this module, ``q``) evaluated in a fresh process with the
    package of ``checkout`` (laid out as installed) first on the path, and run in that
    folder (an editable install's current-directory entry shadowed ``PYTHONPATH``); raises
    unless that package was imported."""
    checkout = os.path.abspath(checkout)
    lib = _layout(checkout)
    code = (f"import sys, json; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import quickstart_cost as q, privguard; print(privguard.__file__); "
            f"print(json.dumps({call}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=lib, capture_output=True,
                          env=dict(os.environ, PYTHONPATH=lib), text=True)
    if done.returncode:
        raise RuntimeError(f"{checkout}: {call} failed:\n{done.stderr}")
    out = done.stdout.splitlines()
    if not os.path.abspath(out[0]).startswith(os.path.join(lib, "privguard") + os.sep):
        raise RuntimeError(f"{checkout}: the package imported was {out[0]}")
    return json.loads(out[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", metavar="DIR", default=None,
                        help="another checkout, run alternately (a process a round)")
    parser.add_argument("--skip-lease-1", action="store_true",
                        help="leave out the variant path=, lease=1 (a commit per charge)")
    parser.add_argument("--meter-evals", action="store_true",
                        help="also count the meter evaluations of each lease's sizing")
    args = parser.parse_args()
    variants = [v for v in VARIANTS if not (args.skip_lease_1 and v == "path=, lease=1")]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = [("", None)] if args.against is None else \
        [("base: ", args.against), ("this: ", here)]
    times: dict[str, list[float]] = {side + v: [] for side, _ in sides for v in variants}
    counts: dict[str, set[int]] = {k: set() for k in times}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side, checkout in sides:
                tag = f"{r}{side[:4]}"
                got = one_round(variants, tmp, tag) if checkout is None else \
                    in_subprocess(checkout, f"q.one_round({variants!r}, {tmp!r}, {tag!r})")
                for v, (t, n) in zip(variants, got):
                    times[side + v].append(t)
                    counts[side + v].add(n)
        evals = {side: meter_evaluations(tmp, side[:4]) if checkout is None
                 else in_subprocess(checkout, f"q.meter_evaluations({tmp!r}, {side[:4]!r})")
                 for side, checkout in sides} if args.meter_evals else {}
    print(f"README quick start; medians (and minima) of {args.rounds} rounds, each after a "
          "warm-up, alternating")
    print("| | charges released | time | vs in memory |\n|---|---|---|---|")
    for side, _ in sides:
        mem = statistics.median(times[side + "in memory"])
        for v in variants:
            t = statistics.median(times[side + v])
            print(f"| {side}{v} | {sorted(counts[side + v])} | {t:.2f} s "
                  f"({min(times[side + v]):.2f} s) | {t / mem:.2f}× |")
    for side, (hist, leased) in evals.items():
        print(f"{side}meter evaluations per lease sizing (evaluations: sizings) "
              f"{ {int(k): c for k, c in hist.items()} }, journal {leased} charges")


if __name__ == "__main__":
    main()
