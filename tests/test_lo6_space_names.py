"""A search space's names are strings, as Optuna's ``suggest_*`` takes them (task lo6)."""

from __future__ import annotations

import numpy as np
import pytest

from privguard import InvalidArgumentError
from privguard import mechanisms as M
from privguard.tuning import Poisson, RandomSearch, SearchSpace

BAD = [1, None, ("lr",), b"lr", 1.5]


@pytest.mark.parametrize("name", BAD, ids=repr)
def test_a_name_that_is_not_a_string_is_refused(name):
    with pytest.raises(InvalidArgumentError, match="space") as info:
        SearchSpace({"clip": [1.0], name: [0.1, 0.3]})
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("name", BAD[:3], ids=repr)
def test_a_tuner_refuses_it_when_built(name):
    with pytest.raises(InvalidArgumentError, match="space"):
        RandomSearch({name: [1, 2]}, Poisson(4.0), cost=M.Gaussian(10.0), progress=False)


def test_string_names_and_a_str_subclass_are_taken():
    space = SearchSpace({"lr": [0.1, 0.3], np.str_("clip"): 1.0})
    assert sorted(space.sample(np.random.default_rng(0))) == ["clip", "lr"]
