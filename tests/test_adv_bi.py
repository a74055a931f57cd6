"""Review bi: bad input that escaped as a built-in exception or warning.

Each test failed before its fix (checked against the parent commit): under
``-W error`` numpy's RuntimeWarning escaped from the hybrid filter's PLD for an
absurd σ and q, and from the allocation envelope for ``RandomAllocation(1e308, t)``
(σ₀ = 10³⁰ ran out of memory instead).
"""

from __future__ import annotations

import numpy as np
import pytest

from privguard import InvalidArgumentError, Ledger, Plan
from privguard import mechanisms as M


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("sigma,q", [(1e-300, 1e-300), (1e-300, 1e-8)])
def test_hybrid_refuses_a_step_its_pld_cannot_represent(sigma, q):
    step = M.SubsampledGaussian(sigma, q)
    with pytest.raises(InvalidArgumentError, match="noise_multiplier=1e-300"):
        Ledger(1.0, 1e-5, plan=Plan(step, 3), filter="hybrid")


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("sigma", [1e308, 1e30, 1.0000001e6])
def test_hybrid_allocation_envelope_has_a_largest_sigma(sigma):
    with pytest.raises(InvalidArgumentError, match=r"noise_multiplier >= 0.5 and <= 1e\+06"):
        Ledger(1.0, 1e-5, plan=Plan(M.RandomAllocation(sigma, 2), 3), filter="hybrid")
    # the RDP filter takes it, and the curve itself is warning-free
    ledger = Ledger(1.0, 1e-5, plan=Plan(M.RandomAllocation(sigma, 2), 3))
    ledger.charge(M.RandomAllocation(sigma, 2))
    assert 0.0 < ledger.epsilon() < 0.1


def _subset_search(seed=None):
    from privguard.tuning import Poisson, RandomSearch, SubsetSearch

    step = M.SubsampledGaussian(1.0, 0.05, steps=10)
    tuner = RandomSearch({"lr": [0.1, 0.5]}, Poisson(6.0), cost=step, progress=False, seed=seed)
    return SubsetSearch(tuner, q=0.1, final_cost=step, seed=seed)


def test_subset_search_refuses_a_subset_it_cannot_draw_before_charging():
    ledger = Ledger(8.0, 1e-5)
    ran = []
    with pytest.raises(InvalidArgumentError, match=r"n_examples=1000000000000 .*nothing was "
                                                   r"charged"):
        _subset_search().run(lambda p, c, s: ran.append(1) or 0.0,
                             lambda p, c, i, a: ran.append(2), ledger, 10**12)
    assert not ledger.spent.any() and ran == []
    with pytest.raises(InvalidArgumentError, match="n_examples"):
        _subset_search().rehearse(lambda p, c, s: 0.0, lambda p, c, i, a: None, 10**12)


def test_subset_search_draws_the_same_subset_as_before_the_charge_moved():
    # seeded (tests only): the subset is drawn from the seed's generator, first
    seen = {}

    def tune(params, child, subset):
        seen["subset"] = subset.copy()
        return 1.0

    def final(params, child, idx, artifact):
        seen["final"] = idx.copy()
        return "model"

    result = _subset_search(seed=3).run(tune, final, Ledger(8.0, 1e-5), 50)
    expected = np.random.default_rng(3).random(50) < 0.1
    assert result.trained
    assert np.array_equal(seen["subset"], np.flatnonzero(expected))
    assert np.array_equal(seen["final"], np.flatnonzero(~expected))


def test_plot_prints_the_path_it_wrote(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from privguard._cli._cli import main

    ledger = Ledger(3.0, 1e-5, path=str(tmp_path / "budget.png"))
    ledger.charge(M.SubsampledGaussian(1.1, 0.01), times=3)
    ledger.close()
    before = (tmp_path / "budget.png").read_bytes()
    assert main(["plot", str(tmp_path / "budget.png"), "-o", str(tmp_path / "out"), "--no-prv"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out.png")
    assert (tmp_path / "out.png").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "out").exists()
    # "-o budget" would write budget.png, the ledger's own file: refused, the ledger kept
    assert main(["plot", str(tmp_path / "budget.png"), "-o", str(tmp_path / "budget"),
                 "--no-prv"]) == 2
    assert "the ledger's own file" in capsys.readouterr().err
    assert (tmp_path / "budget.png").read_bytes() == before
