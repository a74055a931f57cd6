"""The README's quick start in memory and with ``path=`` (leases, and ``lease=1``), in one run.

Issue 26: the quick start with ``path=`` within 1.5× of its in-memory time. The loop
is benchmarks/quickstart_cost.py's (the README's, without its prints). Each round of
in memory and of leases is preceded by an untimed run of the other, so they alternate;
``lease=1`` (a commit per charge, minutes on a loaded disk) runs once, on its own. Ratios
to "in memory" with benchmarks/report.py.

Run: python -m pytest benchmarks/test_bench_quickstart.py --benchmark-only \
        --benchmark-json=bench_quickstart.json
     python benchmarks/report.py bench_quickstart.json
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # pytest's importlib mode
from quickstart_cost import quick_start

VARIANTS = {"in memory": (False, None), "path= (leases, the default)": (True, None),
            "path=, lease=1": (True, 1)}
_FILES = itertools.count()


def _run(tmp: str, variant: str) -> None:
    durable, lease = VARIANTS[variant]
    path = os.path.join(tmp, f"quick{next(_FILES)}.db") if durable else None
    quick_start(path, lease)
    if path is not None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_quick_start(benchmark, tmp_path, variant):
    benchmark.group = "README quick start (ε = 3, 100 epochs of 234 steps, stops at refusal)"
    slow = variant == "path=, lease=1"  # a commit per charge: one round, on its own
    others = [] if slow else [v for v in VARIANTS if v != variant and v != "path=, lease=1"]

    def interleave() -> None:  # an untimed run of each other variant before each round
        for other in others:
            _run(str(tmp_path), other)

    benchmark.pedantic(_run, args=(str(tmp_path), variant), setup=interleave,
                       rounds=1 if slow else 3, iterations=1)
