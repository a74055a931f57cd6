"""Review bx: the public API's edges (0-d arrays, plan horizons, NUL labels).

Each test failed before its fix: a 0-d numpy array was refused where a float is accepted;
a plan beyond 2⁵³ steps made a charge raise ``ValueError: math domain error``; a label
holding NUL broke a PostgreSQL ledger (LedgerStateError, reopen)
instead of being refused before anything was written.
"""

from __future__ import annotations

import numpy as np
import pytest

from privguard import (
    BudgetExhausted,
    InvalidArgumentError,
    Ledger,
    Plan,
)
from privguard import mechanisms as M
from privguard._validation import MAX_STEPS
from privguard.tuning import TruncatedNegativeBinomial

SG = M.SubsampledGaussian(1.1, 0.01)


def test_zero_d_arrays_are_accepted_where_a_number_is():
    # what .mean() of an array or a framework's .numpy() of a scalar tensor gives
    ledger = Ledger(np.array(3.0), np.array(1e-5))
    reference = Ledger(3.0, 1e-5)
    step = M.SubsampledGaussian(np.array(1.1), np.array(0.01), steps=np.array(5))
    assert step == M.SubsampledGaussian(1.1, 0.01, steps=5)
    assert type(step.noise_multiplier) is float and type(step.steps) is int
    assert M.Gaussian(np.array(2, dtype=np.int32)) == M.Gaussian(2.0)
    ledger.charge(step, times=np.array(3, dtype=np.int64))
    reference.charge(M.SubsampledGaussian(1.1, 0.01, steps=5), times=3)
    assert np.array_equal(ledger.spent, reference.spent)
    assert ledger.epsilon(delta=np.array(1e-6)) == reference.epsilon(delta=1e-6)
    assert Ledger.load_state_dict(ledger.state_dict()).epsilon() == ledger.epsilon()
    assert Plan(SG, steps=np.array(100), every=np.array(10)).steps == 100


@pytest.mark.parametrize("bad,name", [
    (lambda: M.Gaussian(np.array(True)), "noise_multiplier"),
    (lambda: M.Gaussian(np.array(np.nan)), "noise_multiplier"),
    (lambda: M.Gaussian(np.array(1 + 0j)), "noise_multiplier"),
    (lambda: M.Gaussian(np.array([1.0])), "noise_multiplier"),
    (lambda: M.Gaussian(np.array("1.0")), "noise_multiplier"),
    (lambda: M.SubsampledGaussian(1.0, 0.01, steps=np.array(2.0)), "steps"),
    (lambda: Ledger(3.0, np.array(0.0)), "delta"),
])
def test_other_arrays_are_still_refused(bad, name):
    with pytest.raises(InvalidArgumentError) as info:
        bad()
    assert info.value.argument == name


@pytest.mark.parametrize("kw,name", [(dict(steps=MAX_STEPS + 1), "plan.steps"),
                                     (dict(steps=10**300), "plan.steps"),
                                     (dict(steps=10, every=MAX_STEPS + 1), "plan.every")])
def test_a_plan_beyond_two_to_the_53_steps_is_refused(kw, name):
    with pytest.raises(InvalidArgumentError) as info:
        Plan(SG, **kw)
    assert info.value.argument == name


@pytest.mark.parametrize("odometer", ["mixture", "paper"])
def test_the_longest_plan_at_the_smallest_delta_charges_without_a_builtin_error(odometer):
    # 10**300 steps used to reach log(0) in the mixture weights at the first charge
    ledger = Ledger(3.0, 1e-290, plan=Plan(SG, steps=MAX_STEPS, every=1), odometer=odometer)
    try:
        ledger.charge(SG)
    except BudgetExhausted:
        assert ledger.history == () and not ledger.spent.any()
    assert np.isfinite(ledger.epsilon()) and ledger.epsilon() >= 0


@pytest.mark.parametrize("label", ["a\x00b", "é\x00"])
def test_a_label_with_nul_is_refused_and_charges_nothing(label):
    ledger = Ledger(3.0, 1e-5)
    for call in (lambda: ledger.charge(SG, label=label),
                 lambda: ledger.charge(SG, label=label, times=2)):
        with pytest.raises(InvalidArgumentError) as info:
            call()
        assert info.value.argument == "label" and "NUL" in str(info.value)
    assert ledger.history == () and not ledger.spent.any()
    ledger.charge(SG, label="a b")
    assert len(ledger.history) == 1


def test_a_tuner_label_with_nul_is_refused_before_the_charge():
    from privguard.tuning import Poisson, RandomSearch

    ledger = Ledger(3.0, 1e-5)
    tuner = RandomSearch({"lr": [0.1]}, Poisson(2.0), cost=M.Gaussian(10.0), progress=False)
    with pytest.raises(InvalidArgumentError, match="label"):
        tuner.run(lambda p, c: 1.0, ledger, label="tune\x00")
    assert ledger.history == ()


def test_postgres_ledger_refuses_a_nul_label_and_stays_usable(pg):
    from _pgserver import OWNER

    srv, db, name = pg
    ledger = Ledger(3.0, 1e-5, path=srv.url(OWNER, db, name))
    with pytest.raises(InvalidArgumentError, match="label"):
        ledger.charge(SG, label="a\x00b")
    ledger.charge(SG, label="ok")  # before the fix: LedgerStateError, "reopen the ledger"
    assert [r.label for r in Ledger.open(ledger.path).history] == ["ok"]



def test_a_step_with_an_almost_zero_curve_fixes_the_plan_without_a_numpy_warning():
    # Concentrated's choice of order divided the budget by the plan's curve (~1e-300):
    # "RuntimeWarning: overflow encountered in divide", an exception under -W error
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in (M.PureDP(1e-300), M.Laplace(1e308)):
            ledger = Ledger(1e6, 1e-5)
            ledger.charge(step)
            assert len(ledger.history) == 1 and ledger.budget() is not None


@pytest.mark.parametrize("make,name", [
    (lambda: TruncatedNegativeBinomial(1e6, gamma=0.5), "gamma"),      # γ^(−η) overflows
    (lambda: TruncatedNegativeBinomial(3.0, gamma=1e-103), "gamma"),   # P[K=1] below the floats
    (lambda: TruncatedNegativeBinomial(5000.0, mean=1e5), "mean"),
])
def test_a_runs_distribution_that_cannot_be_sampled_is_refused_before_any_charge(make, name):
    # It was accepted and charged by a tuner; the first draw then raised OverflowError
    # inside the run: TuningAborted, the whole bound spent, no candidate run.
    with pytest.raises(InvalidArgumentError) as info:
        make()
    assert info.value.argument == name and "sampled" in str(info.value)


def test_the_largest_accepted_runs_distributions_sample():
    rng = np.random.default_rng(0)
    for runs in (TruncatedNegativeBinomial(1023.0, gamma=0.5),
                 TruncatedNegativeBinomial(3.0, gamma=1e-102)):
        assert runs.pmf(1) > 0
    k = TruncatedNegativeBinomial(1023.0, gamma=0.5).sample(rng)
    assert 1 <= k < 10_000_000


def test_a_child_without_a_budget_is_refused_not_made_report_only():
    # child(None) built Ledger(rdp_budget=None): a report-only "strict" child that never
    # refused, whatever the candidate charged
    parent = Ledger(3.0, 1e-5)
    with pytest.raises(InvalidArgumentError) as info:
        parent.child(None)
    assert info.value.argument == "budget"
    kid = parent.child(M.Gaussian(10.0))
    assert not kid.can_afford(M.Gaussian(1.0)) and parent.history == ()


@pytest.mark.parametrize("flag", ["yes", "no", 1, 0, None])
def test_open_takes_read_only_as_true_or_false_only(tmp_path, flag):
    path = str(tmp_path / "l.db")
    Ledger(3.0, 1e-5, path=path).charge(SG)
    with pytest.raises(InvalidArgumentError) as info:
        Ledger.open(path, read_only=flag)
    assert info.value.argument == "read_only"
    assert len(Ledger.open(path, read_only=True).history) == 1
