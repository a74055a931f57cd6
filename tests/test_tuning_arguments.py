"""Every tuner checks every argument before anything is charged (issue 14, item 3).

Each case must raise InvalidArgumentError naming the argument, charge nothing,
and leave the ledger usable. RayExecutor's arguments: tests/test_ray.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M
from privguard.tuning import (
    Choice,
    DPHyPOSearch,
    Geometric,
    IntUniform,
    LogUniform,
    Poisson,
    ProposeTest,
    RandomSearch,
    SearchSpace,
    SubsetSearch,
    UniformFloat,
)

NAN = math.nan
RUN = M.Gaussian(10.0)
SPACE = {"lr": [0.1, 0.2]}


def ok(params, child):
    return 1.0


def random_search(**kw):
    args = dict(space=SPACE, runs=Poisson(3.0), cost=RUN, progress=False)
    args.update(kw)
    return RandomSearch(args.pop("space"), args.pop("runs"), **args)


def dp_hypo(**kw):
    args = dict(space=SPACE, runs=Geometric(mean=3.0), cost=RUN, progress=False,
                update=lambda h, c: np.ones(len(c)))
    args.update(kw)
    return DPHyPOSearch(args.pop("space"), args.pop("runs"), **args)


def subset(**kw):
    args = dict(tuner=random_search(), q=0.1, final_cost=RUN)
    args.update(kw)
    return SubsetSearch(args.pop("tuner"), args.pop("q"), **args)


def propose(**kw):
    args = dict(candidates=[{"a": 1}, {"a": 2}], epsilon0=0.5, partitions=2, progress=False)
    args.update(kw)
    return ProposeTest(args.pop("candidates"), **args)


def raise_key(params):
    return {}[params["lr"]]


CONSTRUCTORS = [
    # RandomSearch
    (lambda: random_search(seed="abc"), "seed"),
    (lambda: random_search(seed=-1), "seed"),
    (lambda: random_search(seed=1.5), "seed"),
    (lambda: random_search(seed=True), "seed"),
    (lambda: random_search(space={}), "space"),
    (lambda: random_search(space="lr"), "space"),
    (lambda: random_search(space={"lr": []}), "space['lr']"),
    (lambda: random_search(runs=5), "runs"),
    (lambda: random_search(runs=None), "runs"),
    (lambda: random_search(cost=None), "cost"),
    (lambda: random_search(cost="gaussian"), "cost"),
    (lambda: random_search(cost=raise_key), "cost"),
    (lambda: random_search(cost=lambda p: "not a mechanism"), "cost"),
    (lambda: random_search(space={"lr": LogUniform(1e-3, 1.0)}, cost=lambda p: RUN), "cost"),
    (lambda: random_search(mode="best"), "mode"),
    (lambda: random_search(mode=None), "mode"),
    (lambda: random_search(mode=["max"]), "mode"),
    (lambda: random_search(progress="yes"), "progress"),
    (lambda: random_search(progress=None), "progress"),
    # search spaces
    (lambda: UniformFloat("a", 1.0), "low"),
    (lambda: UniformFloat(0.0, NAN), "low, high"),
    (lambda: IntUniform(False, 3), "low, high"),
    (lambda: IntUniform(1.5, 3), "low, high"),
    (lambda: Choice(5), "values"),
    (lambda: Choice("abc"), "values"),
    (lambda: SearchSpace([("lr", 1)]), "space"),
    # DPHyPOSearch
    (lambda: dp_hypo(runs=Poisson(3.0)), "runs"),
    (lambda: dp_hypo(space={"lr": UniformFloat(0.0, 1.0)}), "space"),
    (lambda: dp_hypo(C="2"), "C"),
    (lambda: dp_hypo(C=0.5), "C"),
    (lambda: dp_hypo(C=math.inf), "C"),
    (lambda: dp_hypo(c=2.0), "c"),
    (lambda: dp_hypo(c=0.0), "c"),
    (lambda: dp_hypo(c=None), "c"),
    (lambda: dp_hypo(prior=[1.0]), "prior"),
    (lambda: dp_hypo(prior="ab"), "prior"),
    (lambda: dp_hypo(prior=[0.5, NAN]), "prior"),
    (lambda: dp_hypo(prior=[1.5, -0.5]), "prior"),
    (lambda: dp_hypo(prior=[{"a": 1}, 0.5]), "prior"),
    (lambda: dp_hypo(update="bayes"), "update"),
    (lambda: dp_hypo(update=5), "update"),
    (lambda: dp_hypo(seed="abc"), "seed"),
    (lambda: dp_hypo(mode="top"), "mode"),
    (lambda: dp_hypo(progress=1), "progress"),
    (lambda: dp_hypo(cost=raise_key), "cost"),
    # SubsetSearch
    (lambda: subset(tuner="random"), "tuner"),
    (lambda: subset(tuner=dp_hypo()), "tuner"),
    (lambda: subset(q=0.0), "q"),
    (lambda: subset(q=1.0), "q"),
    (lambda: subset(q="0.1"), "q"),
    (lambda: subset(q=NAN), "q"),
    (lambda: subset(variant=3), "variant"),
    (lambda: subset(variant=True), "variant"),
    (lambda: subset(variant=1.0), "variant"),
    (lambda: subset(variant="1"), "variant"),
    (lambda: subset(final_cost=None), "final_cost"),
    (lambda: subset(final_cost=raise_key), "final_cost"),
    (lambda: subset(extrapolate=5), "extrapolate"),
    (lambda: subset(extrapolate=lambda p, s: 1 / 0), "extrapolate"),
    (lambda: subset(extrapolate=lambda p, s: [p]), "extrapolate"),
    (lambda: subset(seed="abc"), "seed"),
    # ProposeTest
    (lambda: propose(candidates=[]), "candidates"),
    (lambda: propose(candidates="ab"), "candidates"),
    (lambda: propose(candidates=[1, 2]), "candidates"),
    (lambda: propose(candidates=5), "candidates"),
    (lambda: propose(candidates=None), "candidates"),
    (lambda: propose(epsilon0=0.0), "epsilon0"),
    (lambda: propose(epsilon0="1"), "epsilon0"),
    (lambda: propose(epsilon0=NAN), "epsilon0"),
    (lambda: propose(partitions=0), "partitions"),
    (lambda: propose(partitions=1.5), "partitions"),
    (lambda: propose(partitions=True), "partitions"),
    (lambda: propose(granularity=0.0), "granularity"),
    (lambda: propose(granularity=2.0), "granularity"),
    (lambda: propose(lower_bound=1.0), "lower_bound"),
    (lambda: propose(lower_bound=-0.1), "lower_bound"),
    (lambda: propose(seed="abc"), "seed"),
    (lambda: propose(progress="no"), "progress"),
]


@pytest.mark.parametrize("make,name", CONSTRUCTORS)
def test_constructor_arguments(make, name):
    with pytest.raises(InvalidArgumentError) as info:
        make()
    assert info.value.argument == name
    assert name in str(info.value)


def usable(ledger):
    """Nothing was charged, and the ledger still charges."""
    assert ledger.history == ()
    ledger.charge(M.Gaussian(10.0), label="after the refused call")
    assert len(ledger.history) == 1


def unpicklable_free(params, child):
    return 1.0


RUNS = [
    # RandomSearch.run / DPHyPOSearch.run
    *[(lambda L, t=t: t().run(None, L), "objective") for t in (random_search, dp_hypo)],
    *[(lambda L, t=t: t().run(ok, "ledger"), "ledger") for t in (random_search, dp_hypo)],
    *[(lambda L, t=t: t().run(ok, L, label=5), "label") for t in (random_search, dp_hypo)],
    *[(lambda L, t=t: t().run(ok, L, label="\ud800"), "label") for t in (random_search, dp_hypo)],
    *[(lambda L, t=t: t().run(ok, L, backend="dask"), "backend") for t in (random_search, dp_hypo)],
    *[(lambda L, t=t: t().run(ok, L, backend=5), "backend") for t in (random_search, dp_hypo)],
    (lambda L: dp_hypo(update=lambda h, c: 1 / 0).run(ok, L), "update"),
    (lambda L: dp_hypo(update=lambda h, c: np.ones(5)).run(ok, L), "update"),
    (lambda L: dp_hypo(update=lambda h, c: np.full(len(c), NAN)).run(ok, L), "update"),
    # SubsetSearch.run
    (lambda L: subset().run(None, lambda *a: 0, L, 100), "tune_objective"),
    (lambda L: subset().run(lambda *a: 0, None, L, 100), "final_objective"),
    (lambda L: subset().run(lambda *a: 0, lambda *a: 0, None, 100), "ledger"),
    (lambda L: subset().run(lambda *a: 0, lambda *a: 0, L, 0), "n_examples"),
    (lambda L: subset().run(lambda *a: 0, lambda *a: 0, L, "100"), "n_examples"),
    (lambda L: subset().run(lambda *a: 0, lambda *a: 0, L, True), "n_examples"),
    (lambda L: subset().run(lambda *a: 0, lambda *a: 0, L, 100, label=5), "label"),
    # ProposeTest.select / run / aggregate
    (lambda L: propose().select([0.5], L), "utilities"),
    (lambda L: propose().select([0.5, NAN], L), "utilities"),
    (lambda L: propose().select([0.5, 1.5], L), "utilities"),
    (lambda L: propose().select("ab", L), "utilities"),
    (lambda L: propose().select([0.5, 0.5], None), "ledger"),
    (lambda L: propose().select([0.5, 0.5], L, rng=5), "rng"),
    (lambda L: propose().select([0.5, 0.5], L, label=5), "label"),
    (lambda L: propose().run(None, L, 10), "objective"),
    (lambda L: propose().run(lambda p, i: 0.5, None, 10), "ledger"),
    (lambda L: propose().run(lambda p, i: 0.5, L, 0), "n_examples"),
    (lambda L: propose().run(lambda p, i: 0.5, L, 2.5), "n_examples"),
    (lambda L: propose().aggregate(lambda p, i: 0.5, [np.arange(3)]), "parts"),
    (lambda L: propose().aggregate(lambda p, i: 0.5, 5), "parts"),
]


@pytest.mark.parametrize("call,name", RUNS)
def test_run_arguments_are_checked_before_the_charge(call, name):
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    with pytest.raises(InvalidArgumentError) as info:
        call(ledger)
    assert info.value.argument == name
    usable(ledger)


def test_the_issue_case_raises_before_anything_is_charged():
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    with pytest.raises(InvalidArgumentError, match="seed"):
        RandomSearch(SPACE, Poisson(3.0), cost=RUN, seed="abc").run(ok, ledger)
    usable(ledger)


def test_a_cost_function_is_checked_for_every_candidate_up_front():
    calls = []

    def cost(params):
        calls.append(params["lr"])
        return RUN if params["lr"] < 1.0 else None

    with pytest.raises(InvalidArgumentError, match="not a privguard mechanism"):
        RandomSearch({"lr": [0.1, 0.5, 1.0]}, Poisson(3.0), cost=cost)
    assert calls == [0.1, 0.5, 1.0]


def test_refused_bound_runs_nothing_for_every_tuner():
    from privguard import BudgetExhausted

    for tuner in (random_search(), dp_hypo()):
        ran, ledger = [], Ledger(epsilon=0.01, delta=1e-5)
        with pytest.raises(BudgetExhausted):
            tuner.run(lambda p, c: ran.append(1) or 1.0, ledger)
        assert ran == [] and ledger.history == ()
    ran, ledger = [], Ledger(epsilon=0.01, delta=1e-5)
    with pytest.raises(BudgetExhausted):
        subset().run(lambda *a: ran.append(1), lambda *a: ran.append(1), ledger, 100)
    assert ran == [] and ledger.history == ()


def test_an_unusable_ledger_raises_before_anything_runs(tmp_path):
    from privguard import LedgerStateError

    ledger = Ledger(epsilon=50.0, delta=1e-5, path=tmp_path / "closed.db")
    ledger.close()
    for tuner in (random_search(), dp_hypo()):
        ran = []
        with pytest.raises(LedgerStateError):
            tuner.run(lambda p, c: ran.append(1) or 1.0, ledger)
        assert ran == []
    ran = []
    with pytest.raises(LedgerStateError):
        subset().run(lambda *a: ran.append(1), lambda *a: ran.append(1), ledger, 100)
    with pytest.raises(LedgerStateError):
        propose().run(lambda p, i: ran.append(1) or 0.5, ledger, 10)
    assert ran == []
    assert len(Ledger.open(tmp_path / "closed.db").history) == 0
