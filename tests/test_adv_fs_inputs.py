"""Adversarial pass fs: bad input to public helpers raises InvalidArgumentError naming the
argument, never a built-in exception. Each test failed before (the built-in named)."""

from __future__ import annotations

import numpy as np
import pytest

from privguard import DEFAULT_ORDERS, InvalidArgumentError, Ledger, Odometer, RDPCurve
from privguard.tuning import (
    Choice,
    Geometric,
    IntUniform,
    Logarithmic,
    LogUniform,
    Poisson,
    SearchSpace,
    TruncatedNegativeBinomial,
    UniformFloat,
)

NOT_A_GENERATOR = [None, True, 0, np.random.RandomState(0), "rng"]
SPACES = [
    SearchSpace({"x": [1, 2]}),
    SearchSpace({"x": UniformFloat(0.0, 1.0)}),
    SearchSpace({"x": LogUniform(1e-3, 1.0)}),
    SearchSpace({"x": IntUniform(0, 3)}),
]


@pytest.mark.parametrize("rng", NOT_A_GENERATOR, ids=repr)
@pytest.mark.parametrize("space", SPACES, ids=repr)
def test_a_space_draws_only_from_a_numpy_generator(space, rng):
    # AttributeError ('NoneType' object has no attribute 'integers'), or a draw from
    # whatever object had that method
    for draw in (space.sample, space.draw):
        with pytest.raises(InvalidArgumentError, match="rng"):
            draw(rng)


@pytest.mark.parametrize("rng", NOT_A_GENERATOR, ids=repr)
def test_a_dimension_draws_only_from_a_numpy_generator(rng):
    for draw in (Choice([1, 2]).sample, Choice([1, 2]).position, UniformFloat(0.0, 1.0).sample,
                 LogUniform(1e-3, 1.0).sample, IntUniform(0, 3).sample):
        with pytest.raises(InvalidArgumentError, match="rng"):
            draw(rng)


@pytest.mark.parametrize("runs", [Poisson(2.0), Geometric(mean=2.0), Logarithmic(mean=2.0),
                                  TruncatedNegativeBinomial(eta=0.5, mean=3.0)], ids=repr)
@pytest.mark.parametrize("k", [10**400, 2**1100], ids=["1e400", "2^1100"])
def test_a_count_beyond_the_float_range_is_refused_by_the_pmf(runs, k):
    # OverflowError (int too large to convert to float) for 10**400
    with pytest.raises(InvalidArgumentError, match="k="):
        runs.pmf(k)
    assert runs.pmf(2**1000) == 0.0 == runs.pmf(-(10**400)) and 0.0 < runs.pmf(1) < 1.0


@pytest.mark.parametrize("method", [np.array(["improved", "classic"]), np.array([1.0, 2.0]),
                                    {"improved"}, ["improved"]], ids=repr)
def test_a_conversion_method_that_is_not_a_string_is_refused(method):
    # an array raised ValueError (the truth value of an array is ambiguous)
    curve = RDPCurve([2.0, 3.0], [0.1, 0.2])
    for convert in (curve.epsilon, curve.optimal_order, curve.epsilon_and_order):
        with pytest.raises(InvalidArgumentError, match="method"):
            convert(1e-5, method=method)
    with pytest.raises(InvalidArgumentError, match="method"):
        curve.delta(1.0, method=method)


@pytest.mark.parametrize("value", [np.array(["raise", "stop"]), np.array("stop"), ["stop"]],
                         ids=repr)
def test_attach_refuses_an_on_exhausted_that_is_not_a_string(value):
    # an array raised ValueError (the truth value of an array is ambiguous)
    from _tiny_opacus import private_linear

    _, optimizer, loader = private_linear()
    from privguard.integrations.opacus import attach

    ledger = Ledger(epsilon=8.0, delta=1e-5)
    with pytest.raises(InvalidArgumentError, match="on_exhausted"):
        attach(optimizer, ledger, data_loader=loader, on_exhausted=value)
    assert len(ledger.runs) == 0


@pytest.mark.parametrize(("name", "kwargs"), [
    ("epsilon", {"epsilon": -1.0, "delta": 1e-5}),
    ("epsilon", {"epsilon": "1", "delta": 1e-5}),
    ("delta", {"epsilon": 1.0, "delta": 2.0}),
    ("rate_key", {"epsilon": 1.0, "delta": 1e-5, "rate_key": np.array([1, 2])}),
    ("steps_key", {"epsilon": 1.0, "delta": 1e-5, "steps_key": 5}),
], ids=repr)
def test_dpsgd_cost_names_a_bad_argument_when_it_is_built(name, kwargs):
    # accepted before; the tuner that called the cost then refused "cost=<function ...>
    # raised InvalidArgumentError (or TypeError, for an array key)", naming neither
    from privguard.tuning import dpsgd_cost

    with pytest.raises(InvalidArgumentError, match=f"^{name}="):
        dpsgd_cost(**kwargs)


def test_paper_extrapolation_names_a_bad_key_params_scale_or_learning_rate():
    # TypeError ('unhashable type', 'str' * float, 'NoneType' is not iterable), ValueError
    # (dict() of a string) or OverflowError (10**400 * scale) before
    from privguard.tuning import paper_extrapolation

    with pytest.raises(InvalidArgumentError, match=r"^lr_key="):
        paper_extrapolation(lr_key=np.array([1, 2]))
    rule = paper_extrapolation()
    for params, scale, name in [(None, 2.0, "params"), ("ab", 2.0, "params"),
                                ({"lr": "0.1"}, 2.0, r"params\['lr'\]"),
                                ({"lr": 10**400}, 2.0, r"params\['lr'\]"),
                                ({"lr": 1e308}, 10.0, r"params\['lr'\]"),
                                ({"lr": 0.1}, None, "scale"), ({"lr": 0.1}, float("nan"), "scale")]:
        with pytest.raises(InvalidArgumentError, match=f"^{name}="):
            rule(params, scale)
    assert rule({"lr": 0.1, "clip": 1.0}, 4.0) == {"lr": 0.4, "clip": 1.0}
    assert paper_extrapolation("adam")({"lr": 0.1}, 4.0) == {"lr": 0.1}


@pytest.mark.parametrize(("name", "call"), [
    ("weights", lambda o: Odometer(o, weights=np.ones(o.size))),
    ("weights", lambda o: Odometer(o, weights=np.full(o.size, -1.0))),
    ("spent", lambda o: Odometer(o).epsilon(np.full(o.size, np.nan), 1e-5)),
    ("spent", lambda o: Odometer(o).epsilon(np.zeros((2, o.size)), 1e-5)),
], ids=["sum", "negative", "nan", "2-D"])
def test_an_odometer_refusal_names_its_argument_in_a_readable_message(name, call):
    # the whole 157-value array was printed (messages of 750-950 characters)
    with pytest.raises(InvalidArgumentError, match=f"^{name}=") as info:
        call(np.asarray(DEFAULT_ORDERS))
    assert len(str(info.value)) < 300, str(info.value)
