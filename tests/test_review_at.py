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
    assert err.value.argument == "tuner"
    assert len(ledger.history) == 0
