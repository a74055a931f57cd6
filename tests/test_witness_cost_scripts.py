"""Task wc: the witnesses' cost benchmarks compare whole libraries and attribute the gap.

``benchmarks/witness_cost.py --against-library COMMIT`` times this tree's library against
``COMMIT``'s in one run, each in a worker that imports it laid out as the wheel installs it
(as ``attach_overhead.py --against`` does, review rhk): a worker that imported another
``privguard`` (an installed release) must refuse, not print its times as the library's.
``benchmarks/witness_profile.py --ablate`` splits the paired gap into parts that sum to it.
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
_ROOT = _BENCHMARKS.parent


def _run(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=600)


def test_against_library_times_this_tree_and_the_commit_not_the_installed_privguard(tmp_path):
    installed = tmp_path / "installed" / "privguard"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("raise ImportError('the installed privguard')\n")
    # the commit's library: this tree's files laid out as the wheel (no git needed here)
    code = f"""
import os, shutil, sys
sys.path.insert(0, {str(_BENCHMARKS)!r})
import attach_overhead
import witness_cost

def library_of(commit, into):
    src = os.path.join(into, "commit")
    shutil.copytree({str(_ROOT / "privguard")!r}, os.path.join(src, "privguard"))
    shutil.copytree({str(_ROOT / "integrations")!r},
                    os.path.join(src, "privguard", "integrations"))
    return src

attach_overhead._library_of = library_of
os.environ["PYTHONPATH"] = {str(installed.parent)!r}
sys.argv = ["witness_cost.py", "--against-library", "COMMIT", "--rounds", "3", "--block", "2",
            "--warmup", "2"]
witness_cost.main()
"""
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split(":")[0].strip() for line in done.stdout.splitlines()
            if "witnesses / attach, paired" in line]
    assert rows == ["this tree", "COMMIT"], done.stdout


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
