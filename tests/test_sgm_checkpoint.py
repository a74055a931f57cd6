"""Task sg: checkpoints of curve version 5 (and older) after a subsampled-Gaussian row.

Task sg keeps Opacus' subsampled-Gaussian values only within 10⁻¹² (was 10⁻⁹) of the
cancellation-free check (privguard/_curves/_sgm.py, docs/theory.md §1.2): values Opacus'
cancellation had put below the truth rose, so a checkpoint written before holds the older,
lower totals. Whether a (σ, q) is affected is not decided from the parameters (not proven),
so every ``SubsampledGaussian`` and ``AccumulatedSubsampledGaussian`` counts as changed for
every older version (privguard/_stores/_resumable.py; docs/theory.md §7): the file replays
its journal from the genesis, and a writable open writes a fresh checkpoint (task ckw).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from test_checkpoint_v2_resume import replayed  # noqa: F401  (a fixture)
from test_sqlite import cli_verify

from privguard import Ledger
from privguard import mechanisms as M
from privguard._stores import _rows
from privguard._stores._resumable import changed
from privguard.tuning import Geometric, Poisson

OLD_V5 = Path(__file__).parent / "data" / "ledger-curves5-e0b2a80.db"
"""Written by privguard main e0b2a80 (checkpoints of curve version 5) itself:
``python scripts/make_curves5_fixture.py tests/data/ledger-curves5-e0b2a80.db /tmp/sg-base``
with a worktree of main at /tmp/sg-base (the script's docstring). 530 charges: DP-SGD at
(σ, q) = (10, 10⁻³) and (1.1, 4·10⁻³), every 23rd a Laplace or a Gaussian; one
checkpoint, at row 512."""

ROWS = 531  # the genesis' fix row and 530 charges


def _charges():
    """The fixture's charges (scripts/make_curves5_fixture.py)."""
    steps = [M.SubsampledGaussian(10.0, 1e-3), M.SubsampledGaussian(1.1, 4e-3)]
    others = [M.Laplace(50.0), M.Gaussian(30.0)]
    return [(others[(i // 23) % 2], "o") if i % 23 == 22 else (steps[i % 2], "ab"[i % 2])
            for i in range(530)]


def _todays():
    ledger = Ledger(epsilon=1e4, delta=1e-5)
    for mechanism, label in _charges():
        ledger.charge(mechanism, label=label)
    return ledger.spent


def _versions(path):
    conn = sqlite3.connect(path)
    try:
        return [json.loads(s)["curves"] for (s,) in
                conn.execute("SELECT snapshot FROM checkpoints ORDER BY entries")]
    finally:
        conn.close()


def _open(path, replayed, read_only=True):  # noqa: F811
    replayed[0] = 0
    ledger = Ledger.open(path, read_only=read_only)
    return ledger, replayed[0]


def test_a_version_5_file_main_wrote_replays_to_the_higher_spend(tmp_path, replayed):  # noqa: F811
    path = str(tmp_path / "v5.db")
    shutil.copy(OLD_V5, path)
    assert _versions(path) == [5]
    ledger, rows = _open(path, replayed)
    spent = ledger.spent
    ledger.close()
    assert rows == ROWS  # from the genesis: DP-SGD rows before the checkpoint
    assert np.array_equal(spent, _todays())  # today's curves, bit for bit
    with pytest.MonkeyPatch.context() as patch:  # what resuming from it would have held
        patch.setattr(_rows, "changed", lambda data, version=2: False)
        patch.setattr(_rows, "RESUMABLE", frozenset({5}))  # none since version 7 (task sr)
        ledger, forced_rows = _open(path, replayed)
        forced = ledger.spent
        ledger.close()
    assert forced_rows <= ROWS - 512 + 1
    assert np.all(forced <= spent) and np.any(forced < spent)  # main's totals were lower
    assert cli_verify(path)["checkpoints"] == 1  # the old snapshot accepted as a revision up


def test_a_writable_open_writes_a_checkpoint_of_todays_version_then_resumes(tmp_path,
                                                                           replayed):  # noqa: F811
    path = str(tmp_path / "v5.db")
    shutil.copy(OLD_V5, path)
    ledger, rows = _open(path, replayed, read_only=False)
    ledger.close()
    assert rows == ROWS and _versions(path)[-1] == _rows.CHECKPOINT_CURVES == 8
    ledger, rows = _open(path, replayed)
    assert rows <= 1 and np.array_equal(ledger.spent, _todays())
    ledger.close()


@pytest.mark.parametrize("mechanism", [
    M.SubsampledGaussian(1.0, 0.01),
    M.AccumulatedSubsampledGaussian(1.0, 0.01, 1),
    M.AccumulatedSubsampledGaussian(1.0, 0.01, 4),
    M.RepeatAndSelect(M.SubsampledGaussian(1.0, 0.01, steps=100), Poisson(0.5)),
    M.RepeatAndSelect(M.SubsampledGaussian(1.0, 0.01, steps=100), Geometric(mean=3.0)),
    M.Composed((M.Gaussian(2.0), M.SubsampledGaussian(1.0, 0.01))),
], ids=["sgm", "accumulated-1", "accumulated-4", "poisson-tuner", "tnb-tuner", "composed"])
@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_the_subsampled_gaussian_changed_for_every_older_version(mechanism, version) -> None:
    assert changed(mechanism.to_dict(), version)
    assert changed({"plan": {"step": mechanism.to_dict(), "steps": 10, "every": None}}, version)


@pytest.mark.parametrize("mechanism", [
    M.Laplace(1.0), M.PureDP(50.0), M.RepeatAndSelect(M.Laplace(2.0), Geometric(mean=3.0)),
    M.DeltaReserve(0.01, 1.1),
], ids=["laplace", "pure-50", "tnb-laplace", "reserve"])
def test_version_5_types_other_than_the_subsampled_gaussian_are_resumed_from(mechanism) -> None:
    """Version 5 wrote review al's and task cv's curves as they are today. (A tuner over a
    ``PureDP`` base is not among them: task ul rounded its pure-ε corollary up in version 6,
    so it counts as changed for version 5 too: tests/test_ul_pure_dp.py; nor is the
    Gaussian, ``RandomAllocation`` or zCDP, rounded up in version 8 by review radv8:
    tests/test_lo9_gaussian_up_resumable.py.)"""
    assert not changed(mechanism.to_dict(), 5)
    assert changed(M.RepeatAndSelect(M.PureDP(1.0), Poisson(0.5)).to_dict(), 5)


def test_pre_sg_computes_the_curve_of_before_task_sg_outside_the_cache() -> None:
    """``_legacy.pre_sg`` (a fix entry main derived, checked on load): Opacus' value kept
    within 10⁻⁹ as before (9.2·10⁻¹⁰ below the truth here), today's curve outside it, and
    the older one never cached for ordinary callers."""
    from opacus.accountants.analysis.rdp import compute_rdp

    from privguard._curves import _legacy

    opacus = float(compute_rdp(q=0.01, noise_multiplier=1e3, steps=1, orders=[56.0])[0])
    today = float(M.SubsampledGaussian(1e3, 0.01).rdp([56.0])[0])
    with _legacy.pre_sg():
        assert _legacy.active()
        assert float(M.SubsampledGaussian(1e3, 0.01).rdp([56.0])[0]) == opacus
    with _legacy.pre_flat():  # before task cv: before task sg too
        assert float(M.SubsampledGaussian(1e3, 0.01).rdp([56.0])[0]) == opacus
    assert float(M.SubsampledGaussian(1e3, 0.01).rdp([56.0])[0]) == today > opacus
