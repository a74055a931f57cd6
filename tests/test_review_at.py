"""Review at: the tuners and their Optuna/Ray integrations, adversarially (main)."""

from __future__ import annotations

import pytest

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M
from privguard.tuning import Geometric, RandomSearch, SubsetSearch

RUN = M.Gaussian(50.0)


def test_subset_search_refuses_an_unsampleable_runs_law_before_its_charge():
    # Geometric(mean=1e6) has P[K > 10^7] ~ e^-10: RandomSearch.run refuses it before its
    # charge; SubsetSearch charged its whole plan first and then the inner run raised
    # (TuningAborted), the plan spent and nothing run
    tuner = RandomSearch({"lr": [0.1, 0.5]}, Geometric(mean=1e6), cost=RUN, progress=False)
    search = SubsetSearch(tuner, q=0.1, final_cost=RUN, variant=1)
    ledger = Ledger(epsilon=1e6, delta=1e-5)
    with pytest.raises(InvalidArgumentError) as err:
        search.run(lambda p, c, i: 1.0, lambda p, c, i, a: None, ledger, 100)
    assert err.value.argument == "tuner.runs"
    assert len(ledger.history) == 0


def test_an_optuna_style_one_argument_objective_is_refused_before_the_charge():
    # Optuna's objective(trial): called as objective(trial, child) every trial raised
    # TypeError, was ⊥, and the whole bound was spent for "no winner"
    pytest.importorskip("optuna")
    from privguard.integrations.optuna import private_optimize

    ledger = Ledger(epsilon=10.0, delta=1e-5)
    with pytest.raises(InvalidArgumentError) as err:
        private_optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), ledger,
                         runs=Geometric(mean=3.0), cost=RUN, progress=False)
    assert err.value.argument == "objective" and "(trial, child_ledger)" in str(err.value)
    assert len(ledger.history) == 0


@pytest.mark.parametrize("objective", [lambda params: 1.0, lambda params, child, extra: 1.0])
def test_a_tuner_refuses_an_objective_of_the_wrong_shape_before_the_charge(objective):
    ledger = Ledger(epsilon=10.0, delta=1e-5)
    tuner = RandomSearch({"lr": [0.1, 0.5]}, Geometric(mean=3.0), cost=RUN, progress=False)
    with pytest.raises(InvalidArgumentError) as err:
        tuner.run(objective, ledger)
    assert err.value.argument == "objective"
    assert len(ledger.history) == 0


def test_objectives_of_the_right_shape_in_any_form_still_run():
    import functools

    ledger = Ledger(epsilon=10.0, delta=1e-5)
    tuner = RandomSearch({"lr": [0.1, 0.5]}, Geometric(mean=3.0), cost=RUN, progress=False)

    class Objective:
        def __call__(self, params, child, scale=1.0):
            return scale * params["lr"]

    for objective in (Objective(), functools.partial(lambda s, p, c: s * p["lr"], 2.0),
                      lambda *args: args[0]["lr"]):
        assert tuner.run(objective, ledger).selected


def test_a_private_trial_offers_optuna_s_own_trial_api():
    # trial.params, trial.user_attrs and Optuna 5's deprecated suggest_* raised a built-in
    # AttributeError: every trial using them was ⊥ in a real run, the bound spent
    pytest.importorskip("optuna")
    from privguard.integrations.optuna import private_optimize, rehearse

    def objective(trial, child):
        x = trial.suggest_uniform("x", 0.0, 1.0)
        y = trial.suggest_loguniform("y", 1e-3, 1.0)
        z = trial.suggest_discrete_uniform("z", 0.0, 1.0, 0.25)
        trial.set_user_attr("note", "mine")
        assert trial.params == {"x": x, "y": y, "z": z}
        assert trial.user_attrs == {"note": "mine"}
        trial.params["x"] = -1.0  # a copy, as Optuna's
        assert trial.params["x"] == x and z in (0.0, 0.25, 0.5, 0.75, 1.0)
        return x + y + z

    shown = rehearse(objective, cost=RUN)
    assert set(shown.best_params) == {"x", "y", "z"}
    ledger = Ledger(epsilon=10.0, delta=1e-5)
    result = private_optimize(objective, ledger, runs=Geometric(mean=3.0), cost=RUN,
                              progress=False)
    assert result.selected and result.best_user_attrs == {"note": "mine"}


def test_a_private_trial_withholds_constraints_with_a_reason():
    pytest.importorskip("optuna")
    from privguard.integrations.optuna import rehearse

    def objective(trial, child):
        trial.set_constraint("c", 0.0)
        return 1.0

    with pytest.raises(AttributeError, match="withheld by privguard: constraints"):
        rehearse(objective, cost=RUN)


@pytest.mark.parametrize("inner_kind", ["random", "propose"])
def test_a_nested_tuner_shows_and_logs_nothing_per_candidate(inner_kind, capsys, caplog):
    # a candidate that runs a tuner (progress=True, the default) drew that tuner's
    # progress bar and logged "charged the tuning bound" once per candidate: privguard's
    # own output counted K
    import logging

    from privguard.tuning import ProposeTest

    inner = RandomSearch({"lr": [0.1, 0.5]}, Geometric(mean=2.0), cost=M.Gaussian(100.0))
    propose = ProposeTest([{"lr": 0.1}, {"lr": 0.5}], epsilon0=0.01, partitions=2)

    def objective(params, child):
        if inner_kind == "random":
            return inner.run(lambda q, c: q["lr"], child).score
        return propose.select([0.2, 0.9], child).rounds

    outer = RandomSearch({"arch": [1, 2]}, Geometric(mean=20.0),
                         cost=M.PureDP(5.0) if inner_kind == "propose" else inner.cost(),
                         progress=False)
    with caplog.at_level(logging.INFO, logger="privguard"):
        outer.run(objective, Ledger(epsilon=1e6, delta=1e-5))
    assert len([r for r in caplog.records if "charged the tuning bound" in r.message]) == 1
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_candidate_cannot_charge_the_ledger_the_tuner_charged():
    # Only the Optuna integration held the parent: a RandomSearch, DP-HyPO or subset
    # candidate that charged the ledger it captured added one journal entry per candidate,
    # so len(ledger.history) - 1 was K
    from privguard.tuning import DPHyPOSearch

    def charging(ledger):
        def objective(params, child, *rest):
            ledger.charge(M.Gaussian(1000.0), label="inside a candidate")
            return 1.0
        return objective

    random_ledger, hypo_ledger, subset_ledger = (Ledger(epsilon=1e3, delta=1e-5)
                                                 for _ in range(3))
    tuner = RandomSearch({"lr": [0.1, 0.5]}, Geometric(mean=5.0), cost=RUN, progress=False)
    assert not tuner.run(charging(random_ledger), random_ledger).selected
    hypo = DPHyPOSearch({"lr": [0.1, 0.5]}, Geometric(mean=5.0), cost=RUN,
                        update=lambda h, x: [1.0, 1.0], progress=False)
    assert not hypo.run(charging(hypo_ledger), hypo_ledger).selected
    search = SubsetSearch(tuner, q=0.5, final_cost=RUN)
    assert not search.run(charging(subset_ledger), charging(subset_ledger), subset_ledger,
                          10).selected
    for ledger in (random_ledger, hypo_ledger, subset_ledger):
        assert len(ledger.history) == 1
        ledger.charge(RUN)  # released when the run returns


@pytest.mark.parametrize("wrap", [lambda v: [v], lambda v: (v,)])
def test_a_one_element_value_is_the_trial_s_value_as_in_optuna(wrap):
    # Optuna's single-objective study takes return [loss]; privguard made it no score, so
    # every trial was ⊥ and the bound spent for no winner
    pytest.importorskip("optuna")
    from privguard.integrations.optuna import private_optimize, rehearse

    def objective(trial, child):
        return wrap(trial.suggest_float("x", 0.0, 1.0))

    assert rehearse(objective, cost=RUN).best_value is not None
    result = private_optimize(objective, Ledger(epsilon=10.0, delta=1e-5),
                              runs=Geometric(mean=3.0), cost=RUN, progress=False)
    assert result.selected and 0.0 <= result.best_value <= 1.0


def test_optuna_s_study_direction_is_taken_as_create_study_takes_it():
    optuna = pytest.importorskip("optuna")
    from privguard.integrations.optuna import private_optimize

    def objective(trial, child):
        return trial.suggest_categorical("x", [1.0, 2.0])

    for direction, best in ((optuna.study.StudyDirection.MAXIMIZE, 2.0),
                            (optuna.study.StudyDirection.MINIMIZE, 1.0)):
        result = private_optimize(objective, Ledger(epsilon=100.0, delta=1e-5),
                                  runs=Geometric(mean=30.0), cost=RUN, direction=direction,
                                  seed=1, progress=False)
        assert result.best_value == best
    with pytest.raises(InvalidArgumentError) as err:
        private_optimize(objective, Ledger(epsilon=100.0, delta=1e-5), runs=Geometric(mean=3.0),
                         cost=RUN, direction=optuna.study.StudyDirection.NOT_SET)
    assert err.value.argument == "direction"


def test_optuna_s_no_op_defaults_are_taken_and_the_rest_still_refused():
    # n_jobs=1, timeout=None, callbacks=None... ported from a study.optimize call ask for
    # nothing, and were refused as if they asked for a count or a storage
    pytest.importorskip("optuna")
    from privguard.integrations.optuna import private_optimize

    def objective(trial, child):
        return trial.suggest_float("x", 0.0, 1.0)

    no_ops = {"n_trials": None, "timeout": None, "callbacks": None, "storage": None,
              "study_name": None, "load_if_exists": False, "n_jobs": 1,
              "gc_after_trial": False, "show_progress_bar": False, "directions": None}
    ledger = Ledger(epsilon=10.0, delta=1e-5)
    assert private_optimize(objective, ledger, runs=Geometric(mean=3.0), cost=RUN,
                            progress=False, **no_ops).selected
    for name, value in (("n_jobs", True), ("n_jobs", 1.0), ("catch", ()), ("n_trials", 0),
                        ("load_if_exists", 0), ("callbacks", [print])):
        ledger = Ledger(epsilon=10.0, delta=1e-5)
        with pytest.raises(InvalidArgumentError) as err:
            private_optimize(objective, ledger, runs=Geometric(mean=3.0), cost=RUN,
                             progress=False, **{name: value})
        assert err.value.argument == name and not ledger.history


def test_an_executor_class_instead_of_an_instance_is_refused_naming_it():
    # backend=SerialExecutor (the class): its unbound prepare(objective) raised a built-in
    # TypeError from run()
    from privguard.tuning._executors import SerialExecutor

    ledger = Ledger(epsilon=10.0, delta=1e-5)
    tuner = RandomSearch({"lr": [0.1, 0.5]}, Geometric(mean=3.0), cost=RUN, progress=False)
    with pytest.raises(InvalidArgumentError) as err:
        tuner.run(lambda p, c: 1.0, ledger, backend=SerialExecutor)
    assert err.value.argument == "backend" and "instance" in str(err.value)
    assert not ledger.history
