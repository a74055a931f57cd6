"""Task wc: the witnesses' cost benchmarks compare whole libraries and attribute the gap.

``benchmarks/witness_cost.py --against-library COMMIT`` times this tree's library against
``COMMIT``'s in one run, each in a worker that imports it laid out as the wheel installs it
(as ``attach_overhead.py --against`` does, review rhk): a worker that imported another
``privguard`` (an installed release) must refuse, not print its times as the library's.
``benchmarks/witness_profile.py --ablate`` splits the paired gap into parts that sum to it.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("opacus")

_BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
_ROOT = _BENCHMARKS.parent


def _library_of(commit: str, into: str) -> str:
    """``commit``'s library for the test: this tree's files laid out as the wheel (no git)."""
    src = os.path.join(into, "commit")
    shutil.copytree(_ROOT / "privguard", os.path.join(src, "privguard"))
    shutil.copytree(_ROOT / "integrations", os.path.join(src, "privguard", "integrations"))
    return src


def test_against_library_times_this_tree_and_the_commit_not_the_installed_privguard(
        tmp_path, monkeypatch, capsys):
    installed = tmp_path / "installed" / "privguard"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("raise ImportError('the installed privguard')\n")
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    attach_overhead = importlib.import_module("attach_overhead")
    witness_cost = importlib.import_module("witness_cost")
    monkeypatch.setattr(attach_overhead, "_library_of", _library_of)
    monkeypatch.setenv("PYTHONPATH", str(installed.parent))  # first for the workers
    monkeypatch.setattr(sys, "argv", ["witness_cost.py", "--against-library", "COMMIT",
                                      "--rounds", "3", "--block", "2", "--warmup", "2"])
    witness_cost.main()
    out = capsys.readouterr().out
    rows = [line.split(":")[0].strip() for line in out.splitlines()
            if "witnesses / attach, paired" in line]
    assert rows == ["this tree", "COMMIT"], out


def test_the_worker_refuses_a_library_it_did_not_import(tmp_path):
    done = subprocess.run(
        [sys.executable, str(_BENCHMARKS / "witness_cost.py"), "--worker",
         str(tmp_path / "elsewhere")],
        input="", capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert "not from" in done.stderr and str(tmp_path / "elsewhere") in done.stderr


def test_the_ablation_parts_sum_to_the_whole_gap(tmp_path):
    done = subprocess.run(
        [sys.executable, str(_BENCHMARKS / "witness_profile.py"), "--ablate", "--steps", "5"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()[1:]
    parts = [float(line.split()[-1]) for line in lines[:-1]]
    whole = float(lines[-1].split()[2])
    assert len(parts) == 5, done.stdout
    assert sum(parts) == pytest.approx(whole, abs=0.2), done.stdout  # rounded to 0.1 µs each
