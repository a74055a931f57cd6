"""Review radv8 (checkpoint curves version 8) rounded up the Gaussian's α/(2σ²) and zCDP's
ρα: ``Gaussian``, ``ZCDP``, ``RandomAllocation`` (and the subsampled Gaussian at q = 1 and
``AccumulatedSubsampledGaussian``, changed since task sg anyway) no longer give the floats
an older checkpoint was written with. ``_resumable.changed`` must say so for every older
version it decides for, so that an entry added to ``RESUMABLE`` later cannot resume such a
checkpoint as unchanged (task lo9)."""

from __future__ import annotations

import pytest

from privguard import mechanisms as M
from privguard._stores._resumable import UNCHANGED_SINCE, changed

RAISED = [M.Gaussian(1.0), M.ZCDP(0.1), M.RandomAllocation(1.0, 100),
          M.SubsampledGaussian(1.0, 1.0), M.AccumulatedSubsampledGaussian(1.0, 1.0, 1),
          M.Composed((M.Laplace(1.0), M.ZCDP(0.1)))]


@pytest.mark.parametrize("version", sorted(UNCHANGED_SINCE))
@pytest.mark.parametrize("mechanism", RAISED, ids=lambda m: type(m).__name__)
def test_the_curves_rounded_up_in_version_8_count_as_changed(mechanism, version):
    assert changed(mechanism.to_dict(), version)
    assert changed({"plan": {"step": mechanism.to_dict(), "steps": 10, "every": None}}, version)


@pytest.mark.parametrize("version", sorted(UNCHANGED_SINCE))
def test_a_curve_version_8_left_alone_still_counts_as_unchanged(version):
    assert not changed(M.Composed((M.Laplace(1.0), M.PureDP(0.5))).to_dict(), version)
