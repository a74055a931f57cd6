"""Task cv: PureDP's curve changed from ε₀ = 40 on (version 5 of the checkpoint curves), so a
version-4 checkpoint after such a charge is not resumed from; others still are
(docs/theory.md §7, "Resuming from an older checkpoint"; privguard/_stores/_resumable.py)."""

from __future__ import annotations

import numpy as np
import pytest
import test_checkpoint_v2_resume as V
from test_checkpoint_v2_resume import (
    EVERY,
    RESUMED,
    _charges,
    _checkpoint_version,
    _open,
    _todays,
    _write,
)

from privguard import mechanisms as M
from privguard._stores._resumable import changed
from privguard.tuning import Geometric, TruncatedNegativeBinomial

replayed = V.replayed  # the fixture: rows replayed on opening

BIG_PURE = M.PureDP(100.0)  # within the ledgers' budget; 1e20 was below the truth (test_adv_cv_curves)


@pytest.mark.parametrize("mechanism", [
    M.PureDP(40.0), BIG_PURE, M.PureDP(1e20), M.Composed((M.Gaussian(2.0), M.PureDP(1e300))),
    M.RepeatAndSelect(M.PureDP(15.0), TruncatedNegativeBinomial(eta=1.0, gamma=0.5)),
    M.DPHyPO(M.PureDP(0.1), Geometric(mean=10.0), C=2.0, c=0.75)])
def test_pure_dp_of_forty_or_a_tuner_over_pure_dp_counts_as_changed(mechanism) -> None:
    assert changed(mechanism.to_dict())


@pytest.mark.parametrize("mechanism", [M.PureDP(39.9), M.PureDP(1.0),
                                       M.RepeatAndSelect(M.Gaussian(2.0), Geometric(mean=3.0))])
def test_pure_dp_below_forty_did_not_change(mechanism) -> None:
    assert not changed(mechanism.to_dict())


def test_a_version_4_checkpoint_after_a_big_pure_dp_charge_is_replayed(tmp_path, replayed):
    path = str(tmp_path / "v4.db")
    charges = _charges(first=[BIG_PURE])
    _write(path, charges, version=4)
    assert _checkpoint_version(path) == 4
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY
    assert np.array_equal(ledger.spent, _todays(charges))
    ledger.close()


def test_a_version_4_checkpoint_of_dp_sgd_is_resumed_from(tmp_path, replayed):
    path = str(tmp_path / "v4.db")
    charges = _charges(first=[M.PureDP(1.0)])
    _write(path, charges, version=4)
    ledger, rows = _open(path, replayed, True)
    assert rows <= RESUMED
    assert np.array_equal(ledger.spent, _todays(charges))
    ledger.close()
