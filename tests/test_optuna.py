"""Private tuning in Optuna's terms (issue 29): the bound charged, the samplers covered, the
trial restricted, and nothing but the winner released."""

from __future__ import annotations

import gc
import io
import logging
import math
import re
import traceback
import weakref
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import optuna
import pytest

from privguard import BudgetExhausted, InvalidArgumentError, Ledger
from privguard import mechanisms as M
from privguard.integrations.optuna import (
    DPHyPOSampler,
    PrivateStudyResult,
    TPERule,
    private_optimize,
    rehearse,
)
from privguard.tuning import (
    DPHyPOSearch,
    Geometric,
    Poisson,
    RandomSearch,
    TruncatedNegativeBinomial,
    TuningAborted,
)

COST = M.Gaussian(10.0)
SECRET = "s3cr3t-91ab"
RESULT_FIELDS = {"selected", "best_params", "best_value", "best_user_attrs", "artifact", "cost",
                 "seeded"}


def fresh() -> Ledger:
    return Ledger(epsilon=50.0, delta=1e-5)


def quadratic(trial, child):
    x = trial.suggest_float("x", -1.0, 1.0)
    child.charge(COST)
    return x * x


# --- the bound ---------------------------------------------------------------------------
@pytest.mark.parametrize("runs", [Poisson(6.0), Geometric(mean=5.0),
                                  TruncatedNegativeBinomial(0.5, mean=4.0)])
def test_the_charge_is_random_search_s_bound(runs):
    ledger = fresh()
    private_optimize(quadratic, ledger, runs=runs, cost=COST, progress=False)
    charged = ledger.history[0].mechanism.rdp(ledger.orders)
    reference = RandomSearch({"lr": [0.1, 0.2], "b": [1, 2, 3]}, runs, cost=COST,
                             progress=False).cost(ledger.orders).rdp(ledger.orders)
    assert len(ledger.history) == 1
    np.testing.assert_allclose(charged, reference, rtol=1e-12, atol=0)


def test_the_dp_hypo_charge_is_theorem_1_s_bound():
    space = {"lr": [0.01, 0.1, 1.0], "clip": [0.5, 1.0]}
    runs = Geometric(mean=6.0)
    ledger = fresh()
    sampler = DPHyPOSampler(space, C=2.0, c=0.5, rule=lambda h, x: np.ones(len(x)))
    result = private_optimize(lambda t, c: t.suggest_categorical("lr", space["lr"]), ledger,
                              runs=runs, cost=COST, sampler=sampler, direction="maximize",
                              progress=False)
    reference = DPHyPOSearch(space, runs, cost=COST, C=2.0, c=0.5,
                             update=lambda h, x: np.ones(len(x)), progress=False)
    np.testing.assert_allclose(ledger.history[0].mechanism.rdp(ledger.orders),
                               reference.cost(ledger.orders).rdp(ledger.orders), rtol=1e-12)
    assert result.selected and result.best_value == result.best_params["lr"] in space["lr"]


# --- refusals before any charge ------------------------------------------------------------
class MyRandom(optuna.samplers.RandomSampler):
    pass


REFUSED_SAMPLERS = [
    lambda: optuna.samplers.TPESampler(),
    lambda: optuna.samplers.CmaEsSampler(),
    lambda: optuna.samplers.GPSampler(),
    lambda: optuna.samplers.QMCSampler(),
    lambda: optuna.samplers.GridSampler({"x": [0.0, 1.0]}),
    lambda: optuna.samplers.NSGAIISampler(),
    lambda: optuna.samplers.BruteForceSampler(),
    lambda: MyRandom(),
    lambda: "random",
    lambda: optuna.samplers.PartialFixedSampler({"x": 0.5}, optuna.samplers.RandomSampler()),
]


@pytest.mark.parametrize("make", REFUSED_SAMPLERS)
def test_uncovered_samplers_are_refused_before_any_charge(make):
    ledger = fresh()
    with pytest.raises(InvalidArgumentError) as info:
        private_optimize(quadratic, ledger, runs=Poisson(3.0), cost=COST, sampler=make(),
                         progress=False)
    assert "RandomSampler" in str(info.value) and "DPHyPOSampler" in str(info.value)
    assert not ledger.history and float(ledger.spent.max()) == 0.0


@pytest.mark.parametrize("kwargs", [
    {"n_trials": 10}, {"timeout": 60}, {"callbacks": [lambda s, t: None]},
    {"storage": "sqlite:///tuning.db"}, {"study": object()}, {"n_jobs": 4},
    {"catch": (ValueError,)}, {"directions": ["maximize"]}, {"unknown": 1},
    {"pruner": optuna.pruners.MedianPruner()}, {"pruner": optuna.pruners.PercentilePruner(50)},
    {"pruner": optuna.pruners.SuccessiveHalvingPruner()},
    {"pruner": optuna.pruners.HyperbandPruner()},
    {"pruner": optuna.pruners.PatientPruner(None, 2)},
    {"pruner": optuna.pruners.WilcoxonPruner()},
    {"cost": lambda params: COST}, {"cost": 1.0}, {"direction": "max"},
    {"runs": 8}, {"runs": None}, {"cost": None}, {"progress": 1}, {"backend": "dask"},
    {"label": 3}, {"seed": -1},
    {"sampler": DPHyPOSampler({"x": [0.0, 1.0]}, rule=lambda h, x: [1, 1]),
     "runs": Poisson(3.0)},  # DP-HyPO's theorem covers truncated negative binomial T only
])
def test_refused_arguments_charge_nothing(kwargs):
    ledger = fresh()
    args = {"runs": Poisson(3.0), "cost": COST, "progress": False, **kwargs}
    with pytest.raises(InvalidArgumentError):
        private_optimize(quadratic, ledger, **args)
    assert not ledger.history and float(ledger.spent.max()) == 0.0


def test_the_objective_sees_no_study_and_no_number():
    seen = []

    def objective(trial, child):
        for name in ("study", "number", "_trial_id", "system_attrs", "datetime_start"):
            with pytest.raises(AttributeError, match="withheld"):
                getattr(trial, name)
        seen.append(sorted(n for n in dir(type(trial)) if not n.startswith("_")))
        trial.study.stop()  # raises: the trial is ⊥

    result = private_optimize(objective, fresh(), runs=Poisson(5.0), cost=COST, seed=3,
                              progress=False)
    assert seen and not result.selected
    assert seen[0] == ["params", "report", "set_user_attr", "should_prune",
                       "suggest_categorical", "suggest_discrete_uniform", "suggest_float",
                       "suggest_int", "suggest_loguniform", "suggest_uniform", "user_attrs"]
    with pytest.raises(AttributeError, match="withheld"):
        rehearse(objective, cost=COST)


# --- i.i.d. trials -------------------------------------------------------------------------
def first_draws(extra_calls) -> list[float]:
    """Each trial's first suggestion, when each trial also makes ``extra_calls(x)`` more."""
    firsts = []

    def objective(trial, child):
        x = trial.suggest_float("x", 0.0, 1.0)
        firsts.append(x)
        for i in range(extra_calls(x)):  # a data-dependent number of suggest calls
            trial.suggest_float(f"extra{i}", 0.0, 1.0)
        return x

    private_optimize(objective, fresh(), runs=Poisson(20.0), cost=COST, seed=7, progress=False)
    return firsts


def test_suggest_calls_in_one_trial_do_not_shift_the_next_trial_s_draws():
    plain = first_draws(lambda x: 0)
    shifted = first_draws(lambda x: 1 + int(10 * x))
    assert len(plain) > 5 and plain == shifted
    # with Optuna's shared generator, the same calls DO shift the next trial's draws
    def shared(extra):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
        firsts = []

        def objective(trial):
            x = trial.suggest_float("x", 0.0, 1.0)
            firsts.append(x)
            for i in range(extra(x)):
                trial.suggest_float(f"extra{i}", 0.0, 1.0)
            return x

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study.optimize(objective, n_trials=5)
        return firsts

    assert shared(lambda x: 0)[1:] != shared(lambda x: 1 + int(10 * x))[1:]


def test_suggestions_follow_optuna_s_distributions():
    seen = []

    def objective(trial, child):
        lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
        bs = trial.suggest_int("batch", 16, 256, step=16)
        act = trial.suggest_categorical("act", ["relu", "tanh"])
        assert trial.suggest_float("lr", 1e-4, 1.0, log=True) == lr  # same name: same value
        seen.append((lr, bs, act))
        return lr

    private_optimize(objective, fresh(), runs=Poisson(30.0), cost=COST, seed=1, progress=False)
    assert len(seen) > 10
    assert all(1e-4 <= lr <= 1.0 and bs % 16 == 0 and 16 <= bs <= 256 and act in ("relu", "tanh")
               for lr, bs, act in seen)
    assert len({act for *_, act in seen}) == 2 and min(lr for lr, *_ in seen) < 1e-2


# --- failures are ⊥, nothing else leaves ------------------------------------------------
def failing(trial, child):
    kind = trial.suggest_categorical("kind", ["raises", "nan", "overspend", "pruned", "ok"])
    trial.set_user_attr("kind", kind)
    child.charge(COST)
    if kind == "raises":
        raise FloatingPointError(f"diverged {SECRET}")
    if kind == "overspend":
        child.charge(COST)  # refused by the strict child ledger
    if kind == "pruned":
        trial.report(-1.0, 0)
        if trial.should_prune():
            raise optuna.TrialPruned(SECRET)
        return 1e9, SECRET  # never reached: the threshold prunes
    if kind == "nan":
        return math.nan
    return 0.25, "winner-model"


def test_failed_overspent_and_pruned_trials_are_bottom_and_leave_no_trace(caplog):
    caplog.set_level(logging.DEBUG)
    out, err = io.StringIO(), io.StringIO()
    handler_records = []
    handler = logging.Handler()
    handler.emit = handler_records.append  # type: ignore[method-assign]
    optuna_logger = logging.getLogger("optuna")
    optuna_logger.addHandler(handler)
    level = optuna_logger.level
    try:
        with redirect_stdout(out), redirect_stderr(err):
            result = private_optimize(failing, fresh(), runs=Poisson(40.0), cost=COST, seed=2,
                                      direction="maximize",
                                      pruner=optuna.pruners.ThresholdPruner(lower=0.0),
                                      progress=True)
    finally:
        optuna_logger.removeHandler(handler)
    assert optuna_logger.level == level  # restored
    assert set(vars(result)) == RESULT_FIELDS
    assert result.best_params == {"kind": "ok"} and result.best_user_attrs == {"kind": "ok"}
    assert (result.best_value, result.artifact) == (0.25, "winner-model")
    text = out.getvalue() + err.getvalue() + caplog.text + repr(result) + repr(handler_records)
    assert SECRET not in text and "diverged" not in text and "1000000000" not in text


def test_every_trial_bottom_selects_nothing():
    result = private_optimize(lambda t, c: math.nan, fresh(), runs=Poisson(10.0), cost=COST,
                              seed=0, progress=False)
    assert not result.selected and result.best_params is None and result.artifact is None
    assert repr(result) == "PrivateStudyResult(no trial selected)"


def test_optuna_logs_nothing_during_the_run():
    levels = []

    def objective(trial, child):
        logger = optuna.logging.get_logger("optuna.study.study")
        levels.append(logger.getEffectiveLevel())
        logger.info(f"Trial 3 finished with value: 0.97 {SECRET}")
        return 1.0

    handler_records = []
    handler = logging.Handler()
    handler.emit = handler_records.append  # type: ignore[method-assign]
    logging.getLogger("optuna").addHandler(handler)
    try:
        private_optimize(objective, fresh(), runs=Poisson(5.0), cost=COST, seed=4,
                         progress=False)
    finally:
        logging.getLogger("optuna").removeHandler(handler)
    assert levels and min(levels) > logging.CRITICAL and not handler_records


def test_nothing_but_the_winner_is_reachable_from_the_result():
    refs: list[weakref.ref] = []

    class Model:
        def __init__(self, i):
            self.tag = f"model-{i}-{SECRET}"

    def objective(trial, child):
        x = trial.suggest_float("x", 0.0, 1.0)
        model = Model(len(refs))
        refs.append(weakref.ref(model))
        trial.set_user_attr("x_again", x)
        return x, model

    result = private_optimize(objective, fresh(), runs=Poisson(30.0), cost=COST, seed=5,
                              direction="maximize", progress=False)
    gc.collect()
    alive = [r() for r in refs if r() is not None]
    assert len(refs) > 10 and alive == [result.artifact]
    assert result.best_params == {"x": result.best_value} == {"x": result.best_user_attrs["x_again"]}
    # no trial seed, count or number anywhere in what is returned
    reachable = gc.get_referents(*[getattr(result, f) for f in RESULT_FIELDS])
    assert not any(isinstance(o, dict) and any("seed" in str(k) for k in o) for o in reachable)


def test_an_interrupt_leaks_nothing():
    refs: list[weakref.ref] = []
    ledger = fresh()

    class Model:
        def __repr__(self):
            return f"model-{SECRET}"

    def objective(trial, child):
        if len(refs) == 4:
            raise KeyboardInterrupt
        model = Model()
        refs.append(weakref.ref(model))
        return 0.5 + len(refs) / 7919, model

    try:
        private_optimize(objective, ledger, runs=Geometric(mean=50.0), cost=COST, seed=11,
                         progress=False)
    except KeyboardInterrupt as exc:
        caught = exc
    assert type(caught) is KeyboardInterrupt and caught.__context__ is None
    assert len(ledger.history) == 1  # the charge stands
    text = "".join(traceback.TracebackException.from_exception(caught, capture_locals=True)
                   .format())
    for frame, _ in traceback.walk_tb(caught.__traceback__):
        text += "".join(f"{k}={v!r}\n" for k, v in frame.f_locals.items())
    assert SECRET not in text and "7919" not in text and repr(0.5 + 4 / 7919) not in text
    del caught
    gc.collect()
    assert all(r() is None for r in refs)


def test_an_error_of_the_machinery_is_tuning_aborted():
    class Broken:
        def run(self, tasks, reduce):
            for task in tasks:
                pass
            raise RuntimeError(SECRET)

    with pytest.raises(TuningAborted) as info:
        private_optimize(quadratic, fresh(), runs=Poisson(5.0), cost=COST, backend=Broken(),
                         progress=False)
    assert SECRET not in str(info.value) and info.value.__context__ is None


# --- rehearse ------------------------------------------------------------------------------
def test_rehearse_reraises_and_charges_nothing():
    def typo(trial, child):
        params = {"lr": trial.suggest_float("lr", 1e-3, 1.0)}
        return params["learning_rate"]

    with pytest.raises(KeyError, match="learning_rate"):
        rehearse(typo, cost=COST)
    with pytest.raises(InvalidArgumentError, match=r"cost.*steps=") as info:
        # a step-less cost cannot cover the trial's 50 steps: the child's refusal, explained
        rehearse(lambda t, child: [child.charge(M.SubsampledGaussian(1.0, 0.01))
                                   for _ in range(50)] and 1.0,
                 cost=M.SubsampledGaussian(1.0, 0.01))
    assert isinstance(info.value.__cause__, BudgetExhausted)
    other = Ledger(epsilon=0.01, delta=1e-5)
    with pytest.raises(BudgetExhausted):  # another ledger's refusal is re-raised as it is
        rehearse(lambda t, child: other.charge(COST), cost=COST)
    with pytest.raises(InvalidArgumentError, match="⊥"):
        rehearse(lambda t, child: math.nan, cost=COST)
    with pytest.raises(optuna.TrialPruned):
        rehearse(failing_pruned, cost=COST, pruner=optuna.pruners.ThresholdPruner(lower=0.0))
    ok = rehearse(quadratic, cost=COST)
    assert isinstance(ok, PrivateStudyResult) and ok.selected and set(ok.best_params) == {"x"}
    sampler = DPHyPOSampler({"x": [0.25, 0.5]}, rule=lambda h, x: [1, 1])
    assert rehearse(quadratic, cost=COST, sampler=sampler).best_params["x"] in (0.25, 0.5)
    with pytest.raises(InvalidArgumentError, match="sampler"):
        rehearse(quadratic, cost=COST, sampler=optuna.samplers.TPESampler())


def failing_pruned(trial, child):
    trial.report(-1.0, 0)
    if trial.should_prune():
        raise optuna.TrialPruned()
    return 1.0


# --- DPHyPOSampler -------------------------------------------------------------------------
def test_dp_hypo_sampler_proposes_inside_the_grid_and_the_bounds():
    space = {"lr": [0.01, 0.03, 0.1, 0.3], "width": [32, 64]}
    sampler = DPHyPOSampler(space, C=3.0, c=0.5, rule=lambda h, x: np.eye(len(x))[0] + 1e-9)
    pi = sampler.density([(0, 1.0)])
    prior = np.full(8, 1 / 8)
    assert np.all(pi <= 3.0 * prior + 1e-12) and np.all(pi >= 0.5 * prior - 1e-12)
    assert pi.sum() == pytest.approx(1.0)
    drawn = []

    def objective(trial, child):
        lr = trial.suggest_float("lr", 1e-3, 1.0, log=True)
        width = trial.suggest_categorical("width", [32, 64])
        drawn.append((lr, width))
        return -abs(math.log(lr / 0.1))

    result = private_optimize(objective, fresh(), runs=Geometric(mean=20.0), cost=COST,
                              sampler=sampler, direction="maximize", seed=3, progress=False)
    assert drawn and all(lr in space["lr"] and w in space["width"] for lr, w in drawn)
    # the best drawn run is released (which lr is drawn depends on the draw's random
    # stream, changed by task ul's exact sampler)
    assert result.best_params["lr"] == max((lr for lr, _ in drawn),
                                           key=lambda lr: -abs(math.log(lr / 0.1)))
    # a suggestion outside the grid's values is ⊥
    outside = private_optimize(lambda t, c: t.suggest_float("lr", 0.5, 1.0), fresh(),
                               runs=Geometric(mean=5.0), cost=COST, sampler=sampler, seed=3,
                               progress=False)
    assert not outside.selected


def test_dp_hypo_sampler_in_a_plain_optuna_study():
    sampler = DPHyPOSampler({"x": [0, 1, 2, 3]}, rule=lambda h, x: np.ones(len(x)))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    study.optimize(lambda t: -abs(t.suggest_categorical("x", [0, 1, 2, 3]) - 2), n_trials=12)
    assert {t.params["x"] for t in study.trials} <= {0, 1, 2, 3}


def test_dp_hypo_sampler_checks_its_arguments():
    for kwargs in ({"C": 0.5}, {"c": 1.5}, {"rule": "cma"}, {"prior": [1.0]}):
        with pytest.raises(InvalidArgumentError):
            DPHyPOSampler({"x": [0, 1]}, **kwargs)
    for space in ({}, {"x": []}, {"x": 1.0}, [("x", [1])]):
        with pytest.raises(InvalidArgumentError):
            DPHyPOSampler(space)


def test_tpe_rule_follows_optuna_s_tpe_and_stays_within_the_bounds():
    from privguard.integrations.optuna import TPERule

    grid = {"x": list(range(6))}
    rule = TPERule(grid, n_samples=48, seed=0)
    history = [(i % 6, -abs(i % 6 - 2) + 0.01 * i) for i in range(18)]  # best at x = 2
    weights = rule(history, None)
    assert weights.sum() == 48 and int(np.argmax(weights)) == 2
    assert isinstance(DPHyPOSampler(grid, rule="tpe").rule, TPERule)
    sampler = DPHyPOSampler(grid, C=2.0, c=0.5, rule=TPERule(grid, n_samples=48, seed=1))
    pi = sampler.density(history)
    assert pi[2] == pytest.approx(2.0 / 6) and np.all(pi >= 0.5 / 6 - 1e-12)
    result = private_optimize(lambda t, c: -abs(t.suggest_int("x", 0, 5) - 2), fresh(),
                              runs=Geometric(mean=6.0), cost=COST, sampler=sampler,
                              direction="maximize", seed=1, progress=False)
    assert result.selected and result.best_params["x"] in range(6)


@pytest.mark.parametrize("direction,sign", [("maximize", 1.0), ("minimize", -1.0)])
def test_the_dp_hypo_rule_sees_larger_as_better_in_both_directions(direction, sign):
    seen = []

    def rule(history, coords):
        seen.extend(v for _, v in history)
        return np.ones(len(coords))

    sampler = DPHyPOSampler({"x": [0.25, 0.5]}, rule=rule)
    private_optimize(lambda t, c: t.suggest_float("x", 0.0, 1.0), fresh(),
                     runs=Geometric(mean=8.0), cost=COST, sampler=sampler,
                     direction=direction, seed=2, progress=False)
    values = set(seen) - {0.0}  # (0, 0.0): the rule's check before the charge
    assert values and values <= {sign * 0.25, sign * 0.5}


def test_tuning_plan_is_what_private_optimize_charges():
    from privguard.integrations.optuna import tuning_plan

    runs = Geometric(mean=6.0)
    for sampler in (None, DPHyPOSampler({"x": [0.0, 1.0]}, rule=lambda h, x: [1, 1])):
        ledger = fresh()
        plan = tuning_plan(runs=runs, cost=COST, delta=1e-5, sampler=sampler,
                           orders=ledger.orders)
        private_optimize(lambda t, c: t.suggest_float("x", 0.0, 1.0), ledger, runs=runs,
                         cost=COST, sampler=sampler, progress=False)
        np.testing.assert_allclose(ledger.history[0].mechanism.rdp(ledger.orders), plan.curve,
                                   rtol=1e-12)
    with pytest.raises(InvalidArgumentError):
        tuning_plan(runs=runs, cost=COST, delta=1e-5, sampler=optuna.samplers.TPESampler())


def test_progress_shows_neither_k_nor_failures():


    def shown(mean, fail):
        def objective(trial, child):
            trial.suggest_float("x", 0.0, 1.0)
            if fail:
                raise RuntimeError(SECRET)
            return 1.0

        err = io.StringIO()
        with redirect_stderr(err):
            private_optimize(objective, fresh(), runs=Poisson(mean), cost=COST, seed=1,
                             progress=True)
        frames = [re.sub(r"\d+:\d+(:\d+)?", "T", f).strip()
                  for f in re.split(r"[\r\n]", err.getvalue())]
        return err.getvalue(), [f for i, f in enumerate(frames) if f and f not in frames[:i]]

    (a, na), (b, nb), (c, nc) = shown(1.0, False), shown(40.0, False), shown(40.0, True)
    assert a and nb == nc  # same public settings: the same frames, whatever failed
    # The meter shown is the public tuning charge, which depends on runs= (its mean), not
    # on K: without it, the frames do not depend on the mean either.
    meterless = [[re.sub(r" \(budget .*? left\)", "", f) for f in n] for n in (na, nb)]
    assert meterless[0] == meterless[1]
    assert any("budget" in f for f in na) and na != nb
    assert all(SECRET not in t and "40" not in t for t in (a, b, c))


def test_a_grid_with_replacement_is_dp_hypo_with_c_equal_1_and_costs_random_k():
    from privguard.integrations.optuna import tuning_plan

    runs, grid = Geometric(mean=5.0), {"x": [1, 2, 3]}
    flat = DPHyPOSampler(grid, C=1.0, c=1.0, rule=lambda h, x: np.ones(len(x)))
    np.testing.assert_array_equal(tuning_plan(runs=runs, cost=COST, delta=1e-5, sampler=flat).curve,
                                  tuning_plan(runs=runs, cost=COST, delta=1e-5).curve)
    assert np.allclose(flat.density([(0, 5.0)]), 1 / 3)


def test_a_dp_hypo_grid_value_must_fit_the_suggestion():
    from privguard.integrations._optuna_trial import PrivateTrial

    trial = PrivateTrial({"n": 2.5, "b": True, "c": "relu"}, fixed=True, pruner=None)
    for call in (lambda: trial.suggest_int("n", 0, 5), lambda: trial.suggest_float("b", 0, 2),
                 lambda: trial.suggest_float("missing", 0, 1),
                 lambda: trial.suggest_categorical("c", ["tanh"])):
        with pytest.raises(ValueError):
            call()
    assert trial.suggest_float("n", 0, 5) == 2.5 and trial.suggest_categorical("c", ["relu"])


def test_an_optuna_style_call_is_refused_with_a_reason_not_a_type_error():
    from privguard.integrations.optuna import tuning_plan

    ledger = fresh()
    with pytest.raises(InvalidArgumentError, match="n_trials"):
        private_optimize(quadratic, ledger, n_trials=20)
    with pytest.raises(InvalidArgumentError, match="runs"):
        private_optimize(quadratic, ledger, cost=COST)
    with pytest.raises(InvalidArgumentError, match="cost"):
        private_optimize(quadratic, ledger, runs=Poisson(3.0))
    with pytest.raises(InvalidArgumentError, match="cost"):
        rehearse(quadratic)
    with pytest.raises(InvalidArgumentError, match="delta"):
        tuning_plan(runs=Poisson(3.0), cost=COST)
    assert not ledger.history


def test_pytest_showlocals_shows_no_trial(tmp_path):
    """The real reporter: `pytest --showlocals` on a run whose executor breaks after every
    trial ran. A control test in the same file shows that the reporter does print locals."""
    import os
    import subprocess
    import sys
    import textwrap

    test_file = tmp_path / "test_leak.py"
    test_file.write_text(textwrap.dedent("""
        from privguard import Ledger, mechanisms as M
        from privguard.integrations.optuna import private_optimize
        from privguard.tuning import Poisson
        from privguard.tuning._executors import SerialExecutor

        class Exploding(SerialExecutor):
            def run(self, tasks, reduce):
                super().run(tasks, reduce)
                raise RuntimeError("executor broke")

        def objective(trial, child):
            i = trial.suggest_int("i", 0, 10**6)
            trial.set_user_attr("tag", "attr" + str(i * 7919))
            return 0.5 + i / 7919, "model" + str(i * 7919)

        def test_study():
            private_optimize(objective, Ledger(epsilon=50.0, delta=1e-5), runs=Poisson(20.0),
                             cost=M.Gaussian(10.0), seed=8, progress=False,
                             backend=Exploding())

        def test_control():
            best_so_far = ("model" + str(3 * 7919), "attr" + str(3 * 7919))
            raise RuntimeError("control")
    """))
    # this process's own path: the installed package (CI's wheel, or an editable install);
    # the source root would shadow it, and privguard.integrations is mapped from integrations/
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--showlocals", "-p",
                           "no:cacheprovider", "-q", str(test_file)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert "2 failed" in out and "TuningAborted" in out
    assert f"model{3 * 7919}" in out and f"attr{3 * 7919}" in out  # the control's locals
    study_part = out[out.index("test_study"):out.index("test_control")]
    assert not re.search(r"(model|attr)\d{3,}", study_part)
    assert not re.search(r"0\.5\d{6,}", study_part)


def test_the_released_winner_meets_the_charged_bound_exactly():
    """tests/test_tuning_release.py's exact check, through Optuna's API: each trial is a
    0.1-DP randomized response of a private bit (⊥ when it answers 1, its second charge refused
    by the child), K ~ Geometric(mean 50); the law of the release, enumerated over K, has
    hockey-stick δ = 0 at the ε private_optimize charges."""
    from test_tuning_release import EPS0, KEEP, hockey_stick, laws

    from privguard import RDPCurve

    rng = np.random.default_rng(0)

    def objective(trial, child):
        trial.suggest_float("x", 0.0, 1.0)
        child.charge(M.PureDP(EPS0))
        if (1 if rng.random() < KEEP else 0) == 1:
            child.charge(M.PureDP(EPS0))  # refused: ⊥
        return 1.0

    runs, ledger = Geometric(mean=50.0), Ledger(epsilon=1.0, delta=1e-5)
    private_optimize(objective, ledger, runs=runs, cost=M.PureDP(EPS0), progress=False)
    charged = ledger.history[0].mechanism
    eps = RDPCurve(ledger.orders, charged.rdp(ledger.orders)).epsilon(1e-5)
    assert eps == pytest.approx(0.3129, abs=1e-4)
    winner_d, winner_d2 = laws(runs, KEEP)[0], laws(runs, 1 - KEEP)[0]
    assert hockey_stick(winner_d, winner_d2, eps) == 0.0


# --- adversarial review (adv29) ------------------------------------------------------------
def test_no_warning_of_any_trial_reaches_the_caller():
    # A warning is output about a trial that may not win; under an "always" filter the count
    # of Optuna's step warnings (one per trial) was K, and a data-dependent one told a loser's
    # secret. Warnings are discarded for the duration of the run and inside every trial.
    import warnings

    def objective(trial, child):
        child.charge(COST)
        x = trial.suggest_float("x", 0.0, 1.0, step=0.3)  # Optuna warns: 1.0 is not on the grid
        warnings.warn(f"loser's secret {SECRET}")
        return x

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = private_optimize(objective, fresh(), runs=Poisson(8.0), cost=COST, seed=3,
                                  progress=False)
    assert result.selected and caught == []


def test_no_warning_of_a_dp_hypo_rule_reaches_the_caller():
    import warnings

    def rule(history, coords):
        warnings.warn(f"history {history} {SECRET}")  # the rule sees every non-⊥ value
        return np.ones(len(coords))

    sampler = DPHyPOSampler({"a": [1, 2, 3]}, rule=rule)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        private_optimize(lambda t, c: float(t.suggest_categorical("a", [1, 2, 3])), fresh(),
                         runs=Geometric(mean=6.0), cost=COST, sampler=sampler, seed=1,
                         progress=False)
    assert not [w for w in caught if SECRET in str(w.message)]


class MyDPHyPO(DPHyPOSampler):
    def _tuner(self, runs, cost, mode, seed, progress):  # charges a bound for another law
        return RandomSearch(self.space, Poisson(1.0), cost=cost, mode=mode, progress=False)


def test_a_subclass_of_dp_hypo_sampler_is_refused_before_any_charge():
    ledger = fresh()
    with pytest.raises(InvalidArgumentError, match="subclass") as info:
        private_optimize(quadratic, ledger, runs=Geometric(mean=4.0), cost=COST,
                         sampler=MyDPHyPO({"x": [0.0, 1.0]}, rule=lambda h, x: [1, 1]),
                         progress=False)
    assert "DPHyPOSampler" in str(info.value)
    assert not ledger.history and float(ledger.spent.max()) == 0.0


@pytest.mark.parametrize("argument, value", [
    ("sampler", optuna.samplers.RandomSampler), ("sampler", DPHyPOSampler),
    ("pruner", optuna.pruners.ThresholdPruner)])
def test_a_class_instead_of_an_instance_is_refused_naming_it(argument, value):
    ledger = fresh()
    with pytest.raises(InvalidArgumentError, match="an instance") as info:
        private_optimize(quadratic, ledger, runs=Poisson(3.0), cost=COST, progress=False,
                         **{argument: value})
    assert info.value.args and value.__name__ in str(info.value)
    assert not ledger.history


def test_tpe_rule_refuses_options_tpe_does_not_take():
    # A bad option made every update raise, so DP-HyPO silently fell back to the prior.
    with pytest.raises(InvalidArgumentError, match="tpe_options"):
        TPERule({"a": [1, 2]}, n_startup=3)


def test_a_trial_cannot_charge_the_parent_ledger_it_captured():
    # A trial that charged the parent (captured in a closure) added one journal entry per
    # trial: len(ledger.history) - 1 was K. While the trials run the parent refuses
    # everything, so such a trial is ⊥ and the journal holds the tuning bound only.
    ledger = fresh()
    reads = []

    def objective(trial, child):
        child.charge(COST)
        try:
            reads.append(ledger.epsilon())
        except Exception:
            pass
        ledger.charge(M.Gaussian(1000.0), label="inside a trial")
        return trial.suggest_float("x", 0.0, 1.0)

    result = private_optimize(objective, ledger, runs=Poisson(6.0), cost=COST, seed=7,
                              progress=False)
    assert not result.selected and not reads
    assert [r.label for r in ledger.history] == ["optuna tuning"]
    ledger.charge(M.Gaussian(1000.0), label="after")  # released when the call returns
    assert len(ledger.history) == 2


def test_the_parent_ledger_is_released_after_an_interrupt():
    ledger = fresh()

    def objective(trial, child):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        private_optimize(objective, ledger, runs=Geometric(mean=50.0), cost=COST, seed=11,
                         progress=False)
    assert ledger.epsilon() > 0 and len(ledger.history) == 1


def test_the_dp_hypo_sampler_the_caller_keeps_is_unchanged_by_the_run():
    # The caller holds the sampler (and its rule): nothing of the trials may be cached there.
    import pickle

    space = {"a": [1, 2, 3], "b": ["x", "y"]}
    sampler = DPHyPOSampler(space, rule=TPERule(space, n_samples=4))
    before = pickle.dumps(sampler)
    private_optimize(lambda t, c: float(t.suggest_categorical("a", [1, 2, 3])), fresh(),
                     runs=Geometric(mean=8.0), cost=COST, sampler=sampler, seed=2,
                     direction="maximize", progress=False)
    assert pickle.dumps(sampler) == before


@pytest.mark.parametrize("space", [{1: [0.1, 0.2]}, {"a": [math.nan, 1.0]},
                                   {"a": [1.0, math.inf]}, {"a": [[1], [2]]}])
def test_a_dp_hypo_grid_no_suggestion_can_match_is_refused_before_any_charge(space):
    # A non-string name can never be suggested, a NaN/inf value never fits a suggestion, an
    # unhashable value is not a categorical choice: every trial would be ⊥ after the charge.
    with pytest.raises(InvalidArgumentError, match="search_space"):
        DPHyPOSampler(space, rule=lambda h, x: np.ones(len(x)))


@pytest.mark.parametrize("call, argument", [
    (lambda t: t.suggest_float(3, 0.0, 1.0), "name"),
    (lambda t: t.suggest_float("x", 1.0, 0.0), "suggest_float"),
    (lambda t: t.suggest_float("x", math.nan, 1.0), "suggest_float"),
    (lambda t: t.suggest_int("i", 0, 10, step=-1), "suggest_int"),
    (lambda t: t.suggest_categorical("c", []), "choices"),
    (lambda t: (t.suggest_float("x", 0.0, 1.0), t.suggest_float("x", 0.0, 2.0)), "name"),
    (lambda t: t.set_user_attr(None, 1), "key"),
    (lambda t: t.report(0.5, -1), "step"),
    (lambda t: t.report("high", 0), "value"),
    (lambda t: t.report(None, 0), "value"),
])
def test_a_trial_s_bad_input_is_invalid_argument_error_naming_it(call, argument):
    # The restricted trial is public API: no built-in exception escapes it (rehearse shows it).
    from privguard.integrations._optuna_trial import SEED_KEY
    from privguard.integrations.optuna import PrivateTrial

    trial = PrivateTrial({SEED_KEY: 1}, fixed=False, pruner=None)
    with pytest.raises(InvalidArgumentError, match=argument):
        call(trial)


def test_a_dp_hypo_trial_s_unknown_name_is_invalid_argument_error():
    from privguard.integrations.optuna import PrivateTrial

    trial = PrivateTrial({"lr": 0.1}, fixed=True, pruner=None)
    with pytest.raises(InvalidArgumentError, match="search_space"):
        trial.suggest_float("clip", 0.0, 1.0)
    with pytest.raises(InvalidArgumentError, match="lr"):
        trial.suggest_float("lr", 0.5, 1.0)
