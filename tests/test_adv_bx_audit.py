"""Review bx: audit_opacus checks build, loss and seed before it builds or trains anything.

Before the fix ``audit_opacus(0, steps=10)`` raised ``TypeError: 'int' object is not
callable``; ``loss=0`` and ``seed=-1`` were found only after ``build()`` had run (a
TypeError in training, numpy's ValueError for the seed); a pipeline whose 4th item is
not a loss was refused as "not a Poisson-sampling loader" or failed in training.
"""

from __future__ import annotations

import pytest

from privguard import InvalidArgumentError
from privguard.audit import audit_opacus


@pytest.mark.parametrize("kwargs,name", [
    (dict(build=0), "build"),
    (dict(build="model"), "build"),
    (dict(loss=0), "loss"),
    (dict(loss="cross_entropy"), "loss"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(seed=True), "seed"),
])
def test_bad_arguments_are_refused_before_build_runs(kwargs, name):
    calls = []
    build = kwargs.pop("build", lambda: calls.append(1))
    with pytest.raises(InvalidArgumentError) as info:
        audit_opacus(build, steps=10, **kwargs)
    assert info.value.argument == name
    assert calls == []


def test_a_pipeline_whose_fourth_item_is_not_a_loss_is_refused_naming_it():
    with pytest.raises(InvalidArgumentError, match="loss that is not callable") as info:
        audit_opacus(lambda: (None, None, None, 5), steps=10)
    assert info.value.argument == "build"
