"""Task adv9: each number privguard prints is the statement its theorem gives, at its δ.

Each test failed before its fix:

1. ``nonadaptive_epsilon()`` of a ledger with no charge (empty, or only refused charges)
   was the conversion of the zero curve, about 0.0035 at δ = 10⁻⁵, and ``privguard
   report`` printed it as the naive ε "as Opacus' RDP accountant": Opacus says 0, and
   nothing released is (0, 0)-DP.
2. After a retarget, attach's warning about ``engine.get_epsilon`` named the retargeted δ,
   chosen after outputs, and called the odometer read there valid under adaptive choices
   (docs/theory.md §4: a running ε is stated at the δ the ledger was created with).
3. A subset-tuning plan printed its whole bound, tuning and final training, as a "tuning
   bound", beside a naive ε of the tuning runs alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from privguard import BudgetExhausted, Ledger
from privguard import mechanisms as M
from privguard._accounting._results import exact, upper
from privguard._mechanisms._curve import RDPCurve
from privguard.tuning import Poisson, RandomSearch, SubsetSearch

DELTA = 1e-5


def _refused_only() -> Ledger:
    ledger = Ledger(1.0, DELTA)
    with pytest.raises(BudgetExhausted):
        ledger.charge(M.Gaussian(0.5))
    return ledger


@pytest.mark.parametrize("make", [lambda: Ledger(delta=DELTA), lambda: Ledger(3.0, DELTA),
                                  _refused_only], ids=["odometer", "filter", "refused-only"])
def test_the_naive_epsilon_of_a_ledger_with_no_charge_is_zero_as_opacus_says(make):
    opacus = pytest.importorskip("opacus.accountants")
    from privguard._cli._report import report

    ledger = make()
    assert len(ledger.history) == 0
    theirs = float(opacus.RDPAccountant().get_epsilon(DELTA))
    assert ledger.nonadaptive_epsilon() == theirs == ledger.epsilon() == 0.0
    assert ledger.nonadaptive_epsilon(1e-3) == 0.0
    assert report(ledger)["naive_epsilon_not_a_guarantee"] == 0.0


def test_the_naive_epsilon_after_one_charge_is_still_the_conversion():
    ledger = Ledger(delta=DELTA)
    ledger.charge(M.SubsampledGaussian(1.0, 0.01, steps=100))
    curve = RDPCurve._trusted(ledger.orders, ledger.spent)
    assert ledger.nonadaptive_epsilon() == curve.epsilon(DELTA) > 0


def test_the_engine_warning_after_a_retarget_states_the_delta_fixed_first(tmp_path):
    pytest.importorskip("opacus")
    from test_opacus_integration import make_private
    from test_review_rnw import _engine_warning

    path = str(tmp_path / "l.db")
    first = Ledger(6.0, 1e-6, path=path)
    first.charge(M.SubsampledGaussian(1.0, 0.02), times=500)
    first.close()
    ledger = Ledger(6.0, 1e-3, path=path, retarget="looser δ, after outputs")
    engine, _model, opt, loader = make_private(accountant="prv")
    _handle, text = _engine_warning(engine, opt, loader, ledger)
    # the δ the ledger was created with, and the running ε there: what guarantee() states
    assert ledger.guarantee().delta == 1e-6
    assert "engine.get_epsilon(1e-06)" in text and "engine.get_epsilon(0.001)" not in text
    assert f"({upper(ledger.epsilon(), '.4g')} now)" in text
    assert f"({upper(ledger.epsilon(1e-3), '.4g')} now)" not in text
    assert "while the filter's guarantee holds" not in text  # the target was changed
    assert engine.get_epsilon(1e-6) == ledger.epsilon()  # what the warning says
    ledger.close()


def test_a_subset_plan_names_the_final_training_and_composes_it_naively():
    per_run = M.SubsampledGaussian(1.0, 0.01, steps=2000)
    final = M.SubsampledGaussian(1.0, 0.01, steps=30_000)
    tuner = RandomSearch({"lr": [0.1, 1.0]}, Poisson(6.0), cost=per_run)
    plan = SubsetSearch(tuner, 0.1, final_cost=final).plan(DELTA)
    text = str(plan)
    assert text.startswith("tuning and final training bound: ε = "), text
    assert "runs and the final training: ε = " in text, text
    grid = plan.orders
    final_alone = RDPCurve._trusted(grid, final.rdp(grid)).epsilon(DELTA)
    runs_alone = tuner.plan(DELTA, grid).naive_epsilon
    # the naive ε composes the same work as the bound: the runs and the final training
    assert plan.naive_epsilon > max(final_alone, runs_alone)
    assert f"at δ = {exact(DELTA)}" in text
    # a random-K plan alone is unchanged: it covers the tuning only
    alone = tuner.plan(DELTA, grid)
    assert str(alone).startswith("tuning bound: ε = ") and not alone.with_final
    assert np.isfinite(plan.naive_epsilon)


def test_the_ledger_repr_names_the_delta_its_odometer_is_stated_at(tmp_path):
    path = str(tmp_path / "l.db")
    first = Ledger(6.0, 1e-6, path=path)
    first.charge(M.Gaussian(5.0))
    first.close()
    ledger = Ledger(6.0, 1e-3, path=path, retarget="looser δ, after outputs")
    text = repr(ledger)
    assert "odometer='mixture' at δ=1e-06" in text and "at δ=0.001" not in text, text
    assert "(ε=6, δ=0.001) filter" in text  # the configuration in force, as it is
    ledger.close()
    assert "odometer='mixture' at δ=1e-05, " in repr(Ledger(3.0, DELTA))
