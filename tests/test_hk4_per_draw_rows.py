"""Task hk4: attach's per-draw work (issue 26) timed where it runs and on its own.

``benchmarks/attach_hook_parts.py --draw`` gives rows for the work attach does on each
batch the Poisson loader draws (the swapped ``__iter__``'s ``next``, the loader's batch
counter, the drawn rate recorded); on one fixed batch the loader draws nothing and the
rows are left out. ``benchmarks/attach_per_draw.py`` times ``next()`` of two loaders made
alike, one attached, in turns.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("opacus")

_BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
_PER_DRAW = ["per draw: a swapped __iter__'s next (loader's, sampler's)",
             "per draw: the loader's batch counter (_one)",
             "per draw: the rate recorded (DrawnRates._drawn)"]


def _rows(script: str, *args: str, cwd: Path) -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, str(_BENCHMARKS / script), *args], cwd=cwd,
                          env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {cells[0]: cells[1:] for cells in
            ([c.strip() for c in line.strip("|").split("|")]
             for line in done.stdout.splitlines() if line.startswith("| "))}


def test_hook_parts_times_the_per_draw_work_when_the_loop_draws(tmp_path):
    drawn = _rows("attach_hook_parts.py", "--steps", "205", "--draw", cwd=tmp_path)
    for row in _PER_DRAW:
        assert row in drawn, sorted(drawn)
        assert all(float(v.replace(",", "")) > 0 for v in drawn[row]), drawn[row]
    fixed = _rows("attach_hook_parts.py", "--steps", "205", cwd=tmp_path)
    assert not set(_PER_DRAW) & set(fixed)  # one fixed batch: nothing drawn, no row
    assert "step hook" in fixed


def test_per_draw_script_prints_a_round_each(tmp_path):
    rows = _rows("attach_per_draw.py", "--draws", "20", "--rounds", "2", cwd=tmp_path)
    assert [r for r in rows if r.isdigit()] == ["1", "2"], rows
