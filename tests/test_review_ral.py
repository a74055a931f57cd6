"""Review ral: checkpoints of curve version 4 (main before review al) against version 5.

Version 5 changed the truncated negative binomial's tuning bound (``RepeatAndSelect`` with
D_{η,γ}, ``DPHyPO``), ``SubsetTuning`` and ``DeltaReserve``; nothing else. A version-4
checkpoint after one of those is replayed from the genesis (its totals are the older, lower
ones); one after only mechanisms whose curves are the same floats as when version 4 was
written, Poisson random-K tuning and a Gaussian whose 2σ² overflows included (both changed
before version 4: a05d7b9, 2ad6965), is resumed from (docs/theory.md §7, "Resuming from
an older checkpoint").
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_checkpoint_v2_resume import (
    EVERY,
    HUGE_SIGMA,
    NESTED,
    SUBSET,
    TUNER,
    _charges,
    _checkpoint_version,
    _open,
    _todays,
    _write,
    replayed,  # noqa: F401  (a fixture)
)
from test_sqlite import cli_verify

from privguard import Ledger
from privguard import mechanisms as M
from privguard._mechanisms import _base
from privguard._mechanisms import _repeat_select as R
from privguard._stores._resumable import changed
from privguard.tuning import Geometric, TruncatedNegativeBinomial

SGD = M.SubsampledGaussian(1.0, 0.01, steps=1000)
TNB = M.RepeatAndSelect(SGD, TruncatedNegativeBinomial(-0.5, mean=1.01))
HYPO = M.DPHyPO(SGD, Geometric(mean=3.0), C=2.0, c=0.5)
RESERVE = M.DeltaReserve(0.01, 1.1)


@pytest.mark.parametrize("first", [[TUNER], [NESTED], [HUGE_SIGMA]],
                         ids=["poisson", "poisson-nested", "sigma-1e155"])
def test_a_version_4_file_whose_curves_did_not_change_since_is_replayed_since_version_7(
        tmp_path, replayed, first):  # noqa: F811
    # Review ral: a Poisson tuner (or σ ≥ 1e150) before a version-4 checkpoint counts as
    # unchanged (changed(), below); task sr (curve version 7) resumes from no older
    # checkpoint (its spent totals summed to nearest): replayed, to today's floats
    path = str(tmp_path / "v4.db")
    charges = _charges(first=first)
    _write(path, charges, version=4)
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY
    assert np.array_equal(ledger.spent, _todays(charges))  # bit for bit a full replay
    ledger.close()
    assert cli_verify(path)["checkpoints"] == 1  # its snapshot equal to the replay


@pytest.mark.parametrize("first", [[TNB], [HYPO], [RESERVE], [SUBSET],
                                   [M.Composed((M.Gaussian(3.0), TNB))]],
                         ids=["tnb", "dp-hypo", "reserve", "subset", "tnb-nested"])
@pytest.mark.parametrize("version", [2, 3, 4])
def test_an_older_file_with_a_curve_changed_in_version_5_is_replayed(
        tmp_path, replayed, first, version):  # noqa: F811
    path = str(tmp_path / "v4.db")
    charges = _charges(first=first)
    _write(path, charges, version=version)
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY  # from the genesis
    assert np.array_equal(ledger.spent, _todays(charges))
    ledger.close()
    assert cli_verify(path)["checkpoints"] == 1


def _main_tnb_bound(orders, base, runs, log_ratio=0.0):
    """main's (version 4) evaluation of seed 002 Theorem 2, before review al's round-up."""
    theta = runs.eta
    aux = np.min((1 - 1 / orders) * base + math.log(1 / runs.gamma) / orders)
    out = base + (1 + theta) * aux + math.log(runs.mean) / (orders - 1)
    if log_ratio:
        out = out + (orders / (orders - 1) + 1 + theta) * log_ratio
    return out


@pytest.mark.parametrize("tuner", [TNB, HYPO], ids=["tnb", "dp-hypo"])
def test_a_version_4_file_of_the_lower_tnb_totals_opens_with_todays(tmp_path, tuner):
    """Written with main's lower bound and version-4 checkpoints: the file opens with today's
    totals, not the checkpoint's, and verify accepts the old snapshot as a revision up."""
    path = str(tmp_path / "v4.db")
    charges = _charges(first=[tuner])
    saved = R._tnb_bound
    R._tnb_bound = _main_tnb_bound
    _base._cached_curve.cache_clear()
    try:
        _write(path, charges, version=4)
        old = Ledger(epsilon=1e6, delta=1e-5)
        for mechanism, label in charges:
            old.charge(mechanism, label=label)
        old_spent = old.spent
    finally:
        R._tnb_bound = saved
        _base._cached_curve.cache_clear()
    today = _todays(charges)
    assert (old_spent < today).any() and (old_spent <= today).all()
    ledger = Ledger.open(path, read_only=True)
    assert np.array_equal(ledger.spent, today)
    ledger.close()
    assert cli_verify(path)["checkpoints"] == 1


def test_changed_is_per_version():
    from privguard._stores._resumable import RESUMABLE, UNCHANGED_SINCE
    assert set(UNCHANGED_SINCE) == {2, 3, 4, 5} and not RESUMABLE  # none since 7 (task sr)
    poisson = TUNER.to_dict()
    # task lo4 (version 7) rounds the Poisson law's δ̂ up: changed for every older version
    assert all(changed(poisson, v) for v in (2, 3, 4, 5))
    huge = M.Laplace(HUGE_SIGMA.noise_multiplier).to_dict()  # a huge parameter: 2ad6965
    assert changed(huge, 3) and not changed(huge, 4)
    assert changed(HUGE_SIGMA.to_dict(), 4)  # a Gaussian: review radv8 (version 8)
    for mechanism in (TNB, HYPO, RESERVE, SUBSET):
        assert all(changed(mechanism.to_dict(), v) for v in (2, 3, 4))
    # a version this module does not decide for (today's, a newer one, a forged one)
    for version in (1, 6, 7, None, "4", 4.0, True):
        assert changed(M.Laplace(1.0).to_dict(), version)
    assert not changed(M.Laplace(1.0).to_dict(), 4)
    # task sg: the subsampled Gaussian changed in version 6, for every older version
    assert all(changed(SGD.to_dict(), v) for v in (2, 3, 4, 5))
    assert changed({"type": "NewMechanism", "params": {}}, 4)


def test_a_version_4_server_ledger_is_replayed_as_a_file(pg, replayed):  # noqa: F811
    import _pgserver

    server, db, name = pg
    for suffix, first in (("p", [TUNER]), ("t", [TNB]), ("r", [RESERVE])):
        url = server.url(_pgserver.OWNER, db, name + suffix)
        charges = _charges(first=first)
        _write(url, charges, version=4)
        ledger, rows = _open(url, replayed, False)
        assert rows > EVERY  # task sr (curve version 7): no older checkpoint resumed from
        assert np.array_equal(ledger.spent, _todays(charges))
        ledger.close()


@pytest.mark.parametrize("share", [5e-324, 1e-320, 3e-310, 1e-300, 2.5e-308])
@pytest.mark.parametrize("low", [1.1, 2.0, 1e3, 1e6])
def test_a_subnormal_delta_reserve_level_is_not_below_its_exact_value(share, low):
    # review al's × (1 + 2⁻⁵⁰) replaced a nextafter: a level in the subnormal range came out
    # below −log(1−r)/(α₀−1), to 0 for r = 5e-324 (main's nextafter had kept it above)
    import mpmath

    with mpmath.workdps(60):
        exact = -mpmath.log1p(-mpmath.mpf(share)) / (mpmath.mpf(low) - 1)
        assert mpmath.mpf(M.DeltaReserve(share, low).level) >= exact


DATA = Path(__file__).parent / "data"
OLD_V4 = DATA / "ledger-curves4-73f7c2e.db"
"""Written by privguard main 73f7c2e (checkpoints of curve version 4) itself, not by today's
code told to say version 4: ``Ledger(epsilon=1e4, delta=1e-5, lease=8)``, 530 charges,
DP-SGD at five σ on labels r0-r2 and, every 23rd charge, one of Laplace, PureDP, ZCDP,
RepeatAndSelect(DP-SGD, Poisson(3)), a Composed holding RepeatAndSelect(Gaussian,
Poisson(0.5)), an accumulated and an allocated Gaussian and Gaussian(1e155); one checkpoint,
at row 512. ``OLD_V4_TNB``: the same, with RepeatAndSelect(DP-SGD, D_{−0.5, γ}, E[K] = 1.01)
as the 4th charge."""
OLD_V4_TNB = DATA / "ledger-curves4-73f7c2e-tnb.db"


def _state_of(path, replayed, resumable=True):  # noqa: F811
    import contextlib

    from privguard._stores import _rows
    with contextlib.ExitStack() as stack:
        if not resumable:
            patch = stack.enter_context(pytest.MonkeyPatch.context())
            patch.setattr(_rows, "_older_resumable", lambda *args: False)
        ledger, rows = _open(path, replayed, True)
        out = (rows, ledger.state_dict(), ledger.spent_curve.epsilons, ledger.epsilon())
        ledger.close()
    return out


def _replayed_and_forced(fixture, tmp_path, replayed):  # noqa: F811
    """A copy of ``fixture`` (version-4 checkpoint): replayed from the genesis, and what
    resuming from its checkpoint would have held (spent totals and ε of both), its path."""
    path = str(tmp_path / "old.db")
    shutil.copy(fixture, path)
    assert _checkpoint_version(path) == 4
    rows, _, spent, eps = _state_of(path, replayed)
    assert rows == 531
    with pytest.MonkeyPatch.context() as patch:  # what resuming from it would have held
        from privguard._stores import _rows
        patch.setattr(_rows, "changed", lambda data, version=2: False)
        patch.setattr(_rows, "RESUMABLE", frozenset({4}))  # none since version 7 (task sr)
        forced_rows, _, forced, forced_eps = _state_of(path, replayed)
    assert forced_rows <= 531 - 512 + 1
    assert forced_eps <= eps
    return np.asarray(spent), np.asarray(forced), path


def test_a_version_4_file_main_wrote_is_replayed_and_its_dp_sgd_totals_are_not_above(
        tmp_path, replayed):  # noqa: F811
    """A file main itself wrote, Poisson tuning and σ = 1e155 before its checkpoint: resumed
    from between review ral and task sg, with its whole state and ε bit for bit those of a
    replay. Its DP-SGD rows changed since (task sg, curve version 6): replayed from the
    genesis now; resuming from it would have held main's totals, nowhere above today's."""
    spent, forced, path = _replayed_and_forced(OLD_V4, tmp_path, replayed)
    assert np.all(forced <= spent)
    assert cli_verify(path)["checkpoints"] == 1  # the old snapshot a revision up


def test_a_version_4_file_main_wrote_with_a_tnb_tuner_is_replayed_above_its_totals(
        tmp_path, replayed):  # noqa: F811
    """Its checkpoint holds main's lower truncated-negative-binomial totals (review al):
    the file is replayed from the genesis, to today's curve, above the checkpoint's."""
    spent, forced, path = _replayed_and_forced(OLD_V4_TNB, tmp_path, replayed)
    assert np.all(forced <= spent) and np.any(forced < spent)
    assert cli_verify(path)["checkpoints"] == 1  # the old snapshot a revision up
