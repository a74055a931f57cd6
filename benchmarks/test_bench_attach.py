"""attach's cost on the issue-26 DP-SGD step (20-64-2 MLP, batch 128, one thread).

Plain Opacus (RDP accountant) against attach with an in-memory ledger and with a
SQLite file, in one run; ratios with benchmarks/report.py. The alternating-medians
table of docs/performance.md comes from benchmarks/attach_overhead.py (same step).

Run: python -m pytest benchmarks/test_bench_attach.py --benchmark-only \
        --benchmark-json=bench_attach.json
     python benchmarks/report.py bench_attach.json
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # pytest's importlib mode
from attach_overhead import VARIANTS, make_step


@pytest.mark.parametrize("variant", VARIANTS)
def test_dp_sgd_step(benchmark, tmp_path, variant):
    benchmark.group = "DP-SGD step, 20-64-2 MLP, batch 128, 1 thread (CPU)"
    step, ledger = make_step(variant, str(tmp_path))
    benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=20)
    if ledger is not None:
        ledger.close()
