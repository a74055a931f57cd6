"""Where attach's per-step time goes, each layer timed in place inside real DP-SGD steps.

``attach_overhead.py`` times the whole step hook in place and its parts called directly
in a tight loop, where they run with warm caches; inside a step (after the backward
pass) the same code costs several times more. Here each layer of the hook (and the skip
counter that runs in Opacus' ``pre_step``) is wrapped with a timer and the issue-26 MLP
(``attach_overhead.make_step``: 20-64-2, batch 128, one thread, one fixed batch) takes
``--steps`` steps: the table gives each layer's median and mean per step over the steps
after the first 200. A layer's time includes the layers it calls (``_charge_step``
includes ``_micro_batches``, ``ledger.charge`` includes ``Accounting.repeat``) and a
wrapper's own cost (well under a microsecond per layer): a diagnosis, not the hook's
cost (``attach_overhead.py`` times that unwrapped).

``--draw`` steps on the batches the Poisson loader draws instead of one fixed batch (a
training loop's steps): the pairing check (``integrations/_forward_pairing.py``, run at
Opacus' clip, before the hook) then compares every clip's rows with the batch delivered,
and the "per draw" rows time attach's work on each batch drawn (task hk4), per call: the
swapped ``__iter__``'s ``next`` runs twice a batch (the loader's, around the batch
counter; the sampler's, around the rate recorded) and includes the draw itself.

Run: python benchmarks/attach_hook_parts.py [--steps 2000] [--variant "attach, in memory"]
     [--draw]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import opacus.optimizers.optimizer as _optimizer  # its `params` property calls this
from attach_overhead import make_step  # benchmarks/ (the script's folder)
from witness_profile import _timed  # a call's time appended to a list

from privguard._accounting._accounting import Accounting
from privguard._ledger._ledger import Ledger
from privguard.integrations import _describe, _drawn_rates, _forward_pairing, _skips
from privguard.integrations.opacus import _ATTACHED, AttachHandle

SKIPPED = 200  # first steps not reported (warm-up)

#: (owner, attribute, row name): the layers timed, in the order they run
LAYERS: list[tuple[Any, str, str]] = [
    (_forward_pairing.PairingCheck, "see", "pairing check at the clip (see)"),
    (_forward_pairing.PairingCheck, "_window", "  the batches delivered (_window)"),
    (_forward_pairing, "held_rows", "  the rows held (held_rows)"),
    (_forward_pairing, "watched", "  Opacus' accumulation still wrapped (watched)"),
    (_forward_pairing, "_every_param_marked", "  the marks (_every_param_marked)"),
    (_optimizer, "params", "Opacus' optimizer.params, per read (every caller)"),
    (_skips.SkipCounter, "_on_check", "skip counter (pre_step)"),
    (_skips, "_bound", "  its clipping bound"),
    (AttachHandle, "_expect_charge", "  _expect_charge"),
    (AttachHandle, "_unhooked_release", "release gate"),
    (AttachHandle, "_hook", "step hook"),
    (AttachHandle, "_charge_step", "  _charge_step"),
    (AttachHandle, "_micro_batches", "    _micro_batches"),
    (_describe, "reported_micro_batches", "      Opacus' accumulated_iterations"),
    (AttachHandle, "_rank_checks", "    _rank_checks"),
    (_forward_pairing.PairingCheck, "check", "      the pairing check's refusal (check)"),
    (AttachHandle, "_sigma_and_bound", "    _sigma_and_bound"),
    (AttachHandle, "_mechanism_for", "    _mechanism_for"),
    (_drawn_rates.DrawnRates, "rate", "      DrawnRates.rate"),
    (Ledger, "charge", "    ledger.charge"),
    (Accounting, "repeat", "      Accounting.repeat"),
    (AttachHandle, "_restart_counts", "    _restart_counts"),
    # per draw (--draw; task hk4): per call, and each wraps the next
    (_describe._Each, "__next__", "per draw: a swapped __iter__'s next (loader's, sampler's)"),
    (_describe.MicroBatchCounter, "_one", "  per draw: the loader's batch counter (_one)"),
    (_drawn_rates.DrawnRates, "_drawn", "  per draw: the rate recorded (DrawnRates._drawn)"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--variant", default="attach, in memory")
    parser.add_argument("--draw", action="store_true",
                        help="step on the loader's batches (default: one fixed batch)")
    args = parser.parse_args()
    times: dict[str, list[int]] = {}
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in LAYERS]
    try:
        for owner, name, row in LAYERS:
            setattr(owner, name, _timed(times.setdefault(row, []), getattr(owner, name)))
        with tempfile.TemporaryDirectory() as tmp:
            step, ledger = make_step(args.variant, tmp, draw=args.draw)
            handle = _ATTACHED[step.optimizer]
            previous = handle._previous_hook
            handle._previous_hook = _timed(times.setdefault(
                "  Opacus' accountant hook (plain Opacus runs it too)", []), previous)
            whole = times.setdefault("the whole step", [])
            for _ in range(args.steps):
                t0 = time.perf_counter_ns()
                step()
                whole.append(time.perf_counter_ns() - t0)
            if ledger is not None:
                ledger.close()
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    batches = "the loader's batches" if args.draw else "one fixed batch"
    print(f"{args.variant}: {args.steps} steps of the issue-26 MLP on {batches}, the first "
          f"{SKIPPED} not reported; per step, µs")
    print("| layer | median | mean |\n|---|---|---|")
    for row, spent in times.items():
        kept = spent[SKIPPED:]
        if kept:
            print(f"| {row} | {statistics.median(kept) / 1e3:,.1f} | "
                  f"{statistics.mean(kept) / 1e3:,.1f} |")


if __name__ == "__main__":
    main()
