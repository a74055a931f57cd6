"""Review rhk3 of task hk3: ``benchmarks/attach_overhead.py`` could not see the loop checks.

Its plain Opacus stepped in the process that attached (the pairing check's wrap of Opacus'
accumulation is process-wide, so plain Opacus ran it too), its "hook off" still ran the
pairing check at the clip, and it trained on one fixed batch, so the check returned before
comparing anything: the on/off and on/plain ratios left part of attach's cost out.
``--apart`` steps plain Opacus in a worker process that never imports privguard, in turns
with attach's worker, both on the Poisson loader's batches.
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


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ),
                          capture_output=True, text=True, timeout=600)


def test_apart_times_attach_against_plain_opacus_in_a_process_without_privguard(tmp_path):
    # each worker checks itself: the plain one exits if privguard was imported or Opacus'
    # accumulation wrapped, attach's if its pairing check compared no clip (a fixed batch)
    code = f"""
import sys
sys.path.insert(0, {str(_BENCHMARKS)!r})
import attach_overhead as bench

assert "privguard" not in sys.modules, "the benchmark imports privguard before attaching"
results = bench.apart(1, bench.CHUNK, ["plain Opacus", "attach, in memory"])
(attach, plain, ratio, means), = results["attach, in memory"]
assert attach > 0 and plain > 0 and ratio == attach / plain and means > 0
assert len(results["plain Opacus"]) == 1  # the control: a second plain worker
"""
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines()
            if line.startswith("| ") and "µs" in line]
    assert rows == ["plain Opacus", "attach, in memory"], done.stdout


def test_the_plain_worker_refuses_a_process_that_imported_privguard(tmp_path):
    code = f"""
import sys
sys.path.insert(0, {str(_BENCHMARKS)!r})
import attach_overhead as bench

bench._require_plain()
print("plain", flush=True)
import privguard.integrations.opacus
bench._require_plain()
"""
    done = _run(code, tmp_path)
    assert done.stdout.splitlines() == ["plain"], (done.stdout, done.stderr[-2000:])
    assert done.returncode != 0 and "not plain Opacus" in done.stderr


def test_the_plain_worker_refuses_opacus_accumulation_wrapped(tmp_path):
    # the wrap without privguard in sys.modules (a copy of the library imported under
    # another name, say): still not plain Opacus
    code = f"""
import sys
sys.path.insert(0, {str(_BENCHMARKS)!r})
import attach_overhead as bench
from privguard.integrations import _forward_pairing

assert _forward_pairing.watch_opacus()
for name in [m for m in sys.modules if m.split(".")[0] == "privguard"]:
    del sys.modules[name]
bench._require_plain()
"""
    done = _run(code, tmp_path)
    assert done.returncode != 0 and "not plain Opacus" in done.stderr, done.stderr[-2000:]


def test_draw_steps_on_the_loaders_batches_so_the_pairing_check_compares(tmp_path):
    # the fixed batch (the default, kept for the numbers docs cite) counts no batch: the
    # check never compares; --draw's steps do
    code = f"""
import sys
sys.path.insert(0, {str(_BENCHMARKS)!r})
import attach_overhead as bench
from privguard.integrations.opacus import _ATTACHED

for draw in (False, True):
    step, _ = bench.make_step("attach, in memory", {str(tmp_path)!r}, draw=draw)
    for _ in range(3):
        step()
    print(draw, _ATTACHED[step.optimizer].pairing._counted)
"""
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["False False", "True True"], done.stdout


def test_interleaved_plain_opacus_steps_without_the_pairing_wrap(tmp_path):
    # the wrap of Opacus' accumulation is process-wide: hk3's plain Opacus steps ran it
    code = f"""
import sys
sys.path.insert(0, {str(_BENCHMARKS)!r})
import attach_overhead as bench
from opacus.grad_sample import grad_sample_module as gsm
from privguard.integrations import _forward_pairing

step, _ = bench.make_step("attach, in memory", {str(tmp_path)!r}, draw=True)
plain, _ = bench.make_step("plain Opacus", {str(tmp_path)!r}, draw=True)
seen = []

def spied():
    seen.append(_forward_pairing.watched())
    plain()

def attached():
    seen.append(("attach", _forward_pairing.watched()))
    step()

attached.optimizer = step.optimizer
bench._interleave(attached, spied, 3)
print(seen.count(False), seen.count(("attach", True)), _forward_pairing.watched())
"""
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3", "6", "True"], done.stdout


def test_interleaved_on_drawn_batches_runs_no_step_with_the_hook_off(tmp_path):
    # an "off" step on a drawn batch counts that batch in the next charged step's window
    # (two micro-batches: another mechanism every step, no fast path, a lease per step)
    code = f"""
import math, sys
sys.path.insert(0, {str(_BENCHMARKS)!r})
import attach_overhead as bench

bench.DRAW["draw"] = True
step, _ = bench.make_step("attach, in memory", {str(tmp_path)!r})
plain, _ = bench.make_step("plain Opacus", {str(tmp_path)!r})
calls = []

def attached():
    calls.append(1)
    step()

attached.optimizer = step.optimizer
on, off, pl, means = bench._interleave(attached, plain, 4)
print(len(calls), math.isnan(off), math.isnan(means), on > 0 and pl > 0)
"""
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["4", "True", "True", "True"], done.stdout
