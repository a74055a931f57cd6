"""The cost of the pairing check's wrap of Opacus' accumulation, per call (task hk3).

``integrations/_forward_pairing.py`` wraps Opacus' ``create_or_accumulate_grad_sample``
once per process; Opacus calls it once per parameter per ``backward()``. Here the wrap is
put around a stand-in with Opacus' signature that does nothing, so the difference between
the two is the wrapper's own work. Medians of ``--rounds`` rounds of ``--calls`` calls each,
the wrapped and the bare stand-in alternating. To compare two libraries, run it with each
first on ``PYTHONPATH``, laid out as the wheel installs it (``_installed_layout.as_installed``).

Run: python benchmarks/pairing_wrap_cost.py [--rounds 21] [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from opacus.grad_sample import grad_sample_module as gsm

from privguard.integrations import _forward_pairing


def stand_in(*, param: Any, grad_sample: Any, max_batch_len: Any) -> None:
    """Opacus' signature (1.4-1.6), no work."""


def per_call(fn: Any, param: Any, calls: int) -> float:
    """Nanoseconds a call of ``fn`` as Opacus calls it, over ``calls`` calls."""
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn(param=param, grad_sample=1, max_batch_len=128)
    return (time.perf_counter_ns() - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    saved = gsm.create_or_accumulate_grad_sample
    gsm.create_or_accumulate_grad_sample = stand_in
    try:
        _forward_pairing.watch_opacus()
        wrapped = gsm.create_or_accumulate_grad_sample
        assert wrapped is not stand_in
        param = torch.nn.Parameter(torch.zeros(3))
        times: dict[str, list[float]] = {"wrapped": [], "bare": []}
        for _ in range(args.rounds):
            times["wrapped"].append(per_call(wrapped, param, args.calls))
            times["bare"].append(per_call(stand_in, param, args.calls))
    finally:
        gsm.create_or_accumulate_grad_sample = saved
    w, b = (statistics.median(times[k]) for k in ("wrapped", "bare"))
    print(f"wrapped {w:.0f} ns, bare {b:.0f} ns: the wrapper {w - b:.0f} ns a call")


if __name__ == "__main__":
    main()
