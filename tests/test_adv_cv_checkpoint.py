"""Task cv: PureDP's curve changed from ε₀ = 40 on (version 5 of the checkpoint curves), so a
version-4 checkpoint after such a charge is not resumed from; others still are
(docs/theory.md §7, "Resuming from an older checkpoint"; privguard/_stores/_resumable.py)."""

from __future__ import annotations

import numpy as np
import pytest
import test_checkpoint_v2_resume as V
from test_checkpoint_v2_resume import (
    EVERY,
    _charges,
    _checkpoint_version,
    _open,
    _todays,
    _write,
)

from privguard import mechanisms as M
from privguard._stores._resumable import changed
from privguard.tuning import Geometric, Poisson, TruncatedNegativeBinomial

replayed = V.replayed  # the fixture: rows replayed on opening

BIG_PURE = M.PureDP(100.0)  # within the ledgers' budget; 1e20 was below the truth (test_adv_cv_curves)


@pytest.mark.parametrize("mechanism", [
    M.PureDP(40.0), BIG_PURE, M.PureDP(1e20), M.Composed((M.Gaussian(2.0), M.PureDP(1e300))),
    M.RepeatAndSelect(M.PureDP(15.0), TruncatedNegativeBinomial(eta=1.0, gamma=0.5)),
    M.DPHyPO(M.PureDP(0.1), Geometric(mean=10.0), C=2.0, c=0.75)])
def test_pure_dp_of_forty_or_a_tuner_over_pure_dp_counts_as_changed(mechanism) -> None:
    assert changed(mechanism.to_dict())


@pytest.mark.parametrize("mechanism, version", [
    (M.PureDP(39.9), 2), (M.PureDP(1.0), 2), (M.PureDP(39.9), 4)])
def test_pure_dp_below_forty_did_not_change(mechanism, version) -> None:
    assert not changed(mechanism.to_dict(), version)


# A tuner over a base other than PureDP is not caught by task cv's rule; since version 7 every
# law of runs counts as changed for every older version (a Poisson law's δ̂ rounded up, task
# lo4; a geometric law's curve changed in version 5, review al).
def test_a_poisson_tuner_changed_in_version_7() -> None:
    assert all(changed(M.RepeatAndSelect(M.Gaussian(2.0), Poisson(mean=3.0)).to_dict(), v)
               for v in (2, 3, 4, 5))


def test_a_geometric_tuner_changed_in_version_5() -> None:
    assert changed(M.RepeatAndSelect(M.Gaussian(2.0), Geometric(mean=3.0)).to_dict(), 4)


def test_a_version_4_checkpoint_after_a_big_pure_dp_charge_is_replayed(tmp_path, replayed):
    path = str(tmp_path / "v4.db")
    charges = _charges(first=[BIG_PURE])
    _write(path, charges, version=4)
    assert _checkpoint_version(path) == 4
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY
    assert np.array_equal(ledger.spent, _todays(charges))
    ledger.close()


def test_a_version_4_checkpoint_of_dp_sgd_is_replayed_since_version_7(tmp_path, replayed):
    path = str(tmp_path / "v4.db")
    charges = _charges(first=[M.PureDP(1.0)])
    _write(path, charges, version=4)
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY  # resumed from before task sr (curve version 7: docs/theory.md §6)
    assert np.array_equal(ledger.spent, _todays(charges))
    ledger.close()


# Review rcv: files as main (before task cv) wrote them, with its PureDP curve from ε₀ = 40 on.
NEAR_ONE = [1.00001, 1.00002, 1.1, 2.0, 8.0, 64.0]  # a grid where main's PureDP(1e20) was low
HUGE_BUDGET = {"epsilon": 1e30, "delta": 1e-5, "orders": NEAR_ONE}
MAIN_PURE_1E20 = 9.999999999936763e+19  # main 73f7c2e's PureDP(1e20).rdp([1.00001])


def _write_as_main(path, charges, version):
    """Write ``charges`` with main's PureDP curve (the stable form at every ε₀) and a
    checkpoint body of ``version``."""
    from privguard._curves import _stable

    saved = _stable.PURE_DP_FLAT
    _stable.PURE_DP_FLAT = float("inf")
    V._base._cached_curve.cache_clear()
    try:
        assert M.PureDP(1e20).rdp(NEAR_ONE)[0] == MAIN_PURE_1E20  # main's value, bit for bit
        _write(path, charges, version=version, config=HUGE_BUDGET)
    finally:
        _stable.PURE_DP_FLAT = saved
        V._base._cached_curve.cache_clear()


@pytest.mark.parametrize("first", [[M.PureDP(1e20)], [M.Gaussian(3.0), M.PureDP(1e20)],
                                   [M.Composed((M.Gaussian(2.0), M.PureDP(1e20)))]],
                         ids=["plan", "after-plan", "nested-plan"])
def test_a_file_main_wrote_after_a_huge_pure_dp_opens_and_replays(tmp_path, replayed, first):
    """Its fix row holds mixture weights derived from main's PureDP curve (another
    data-independent choice, accepted as the pre-e08c1f5 ones are): cv refused the file as
    'a forged or foreign fix entry' when the plan held PureDP(1e20). Its version-4 checkpoint
    holds main's lower totals (6.3e-12 relative at 1.00001): replayed, not resumed."""
    path = str(tmp_path / "main.db")
    charges = _charges(first=first)
    _write_as_main(path, charges, version=4)
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY  # from the genesis
    assert np.array_equal(ledger.spent, _todays(charges, HUGE_BUDGET))
    assert ledger.spent[0] > MAIN_PURE_1E20
    ledger.close()
    assert V.cli_verify(path)["checkpoints"] == 1  # privguard verify: the old checkpoint checked


def test_the_pre_cv_curve_stays_out_of_the_cache() -> None:
    from privguard._curves import _legacy

    with _legacy.pre_flat():
        assert M.PureDP(1e20).rdp(NEAR_ONE)[0] == MAIN_PURE_1E20
    assert M.PureDP(1e20).rdp(NEAR_ONE)[0] == 1e20


def test_a_server_ledger_main_wrote_after_a_huge_pure_dp_opens_and_replays(pg, replayed):
    import _pgserver

    server, db, name = pg
    url = server.url(_pgserver.OWNER, db, name)
    charges = _charges(first=[M.PureDP(1e20)])
    _write_as_main(url, charges, version=4)
    ledger, rows = _open(url, replayed, False)
    assert rows > EVERY
    assert np.array_equal(ledger.spent, _todays(charges, HUGE_BUDGET))
    ledger.charge(M.PureDP(1e20), label="x")  # and it goes on charging
    ledger.close()
    plain = server.url(_pgserver.OWNER, db, name + "d")
    charges = _charges(first=[M.PureDP(1.0)])
    _write_as_main(plain, charges, version=4)
    ledger, rows = _open(plain, replayed, False)
    assert rows > EVERY  # unchanged rows, but version 4 < 7 (task sr): replayed
    assert np.array_equal(ledger.spent, _todays(charges, HUGE_BUDGET))
    ledger.close()


def test_a_state_dict_and_pickle_main_wrote_after_a_huge_pure_dp_load() -> None:
    import pickle

    from privguard import Ledger
    from privguard._curves import _stable

    saved = _stable.PURE_DP_FLAT
    _stable.PURE_DP_FLAT = float("inf")  # main's curve (see _write_as_main)
    V._base._cached_curve.cache_clear()
    try:
        old = Ledger(**HUGE_BUDGET)
        old.charge(M.PureDP(1e20), label="x")
        old.charge(M.Gaussian(2.0), label="y")
        state, blob = old.state_dict(), pickle.dumps(old)
    finally:
        _stable.PURE_DP_FLAT = saved
        V._base._cached_curve.cache_clear()
    today = Ledger(**HUGE_BUDGET)
    today.charge(M.PureDP(1e20), label="x")
    today.charge(M.Gaussian(2.0), label="y")
    assert state["spent"][0] < today.spent[0]  # main's lower total, recorded
    for loaded in (Ledger.load_state_dict(state), pickle.loads(blob)):
        assert np.array_equal(loaded.spent, today.spent)  # replayed with today's curves


def test_the_resumable_threshold_is_the_curves_one() -> None:
    """_resumable restates PURE_DP_FLAT to stay free of the curves: a lower threshold in
    _stable alone would change PureDP(35)'s curve while its rows still resumed."""
    from privguard._curves import _stable
    from privguard._stores import _resumable

    assert _resumable.PURE_DP_FLAT == _stable.PURE_DP_FLAT
    assert changed(M.PureDP(_stable.PURE_DP_FLAT).to_dict())
    assert not changed(M.PureDP(float(np.nextafter(_stable.PURE_DP_FLAT, 0))).to_dict())
