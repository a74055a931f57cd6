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
@pytest.mark.parametrize("sigma", [1e308, 1e30, 1.0000001e12])
def test_hybrid_allocation_envelope_has_a_largest_sigma(sigma):
    with pytest.raises(InvalidArgumentError, match=r"noise_multiplier >= 0.5 and <= 1e\+12"):
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


# -- item 5: the keys of a 0.1 state's filter and of every event kind --------------------
def _v1(edit):
    import hashlib
    import json
    from pathlib import Path

    from privguard._stores._integrity import canonical

    state = json.loads((Path(__file__).parent / "data" / "state-0.1.json").read_text())
    edit(state)
    body = {k: v for k, v in state.items() if k != "checksum"}
    state["checksum"] = hashlib.sha256(canonical(body)).hexdigest()  # 0.1's checksum
    return state


@pytest.mark.parametrize("edit, message", [
    # loaded before the fix
    (lambda s: s["config"]["filter"].__setitem__("zz", 1), "0.1's filter configuration"),
    (lambda s: s["filter_state"].__setitem__("zz", 1), "filter_state must be a dict"),
    (lambda s: s.__setitem__("filter_state", {}), "filter_state must be a dict"),
    # refused before too, for another reason; now by the key check
    (lambda s: s["config"]["filter"].pop("delta"), "0.1's filter configuration"),
    (lambda s: s["config"]["filter"].__setitem__("kind", "strict"), "0.1's filter config"),
])
def test_a_0_1_state_with_other_filter_keys_never_loads(edit, message):
    from privguard import LedgerStateError

    assert Ledger.load_state_dict(_v1(lambda s: None)).epsilon() > 0
    with pytest.raises(LedgerStateError, match=message):
        Ledger.load_state_dict(_v1(edit))


def _resealed(state):
    from privguard._stores._integrity import Integrity

    body = {k: v for k, v in state.items() if k != "checksum"}
    state["checksum"] = Integrity.from_environment().digest("state", body)
    return state


@pytest.mark.parametrize("edit", [lambda b: b.__setitem__("zz", 1),
                                  lambda b: b.pop("pid" if "pid" in b else "records")])
def test_an_event_with_other_keys_never_loads(tmp_path, edit):
    import copy

    from privguard import LedgerStateError

    path = tmp_path / "r.db"
    ledger = Ledger(3.0, 1e-5, path=path)
    ledger.charge(M.SubsampledGaussian(1.0, 0.01))
    ledger.close()
    ledger = Ledger(4.0, 1e-5, path=path, retarget="approved")
    state = ledger.state_dict()
    ledger.close()
    assert Ledger.load_state_dict(_resealed(copy.deepcopy(state))).target == (4.0, 1e-5)
    bad = copy.deepcopy(state)
    edit(next(e[1] for e in bad["journal"] if e[0] == "event" and e[1]["event"] == "retarget"))
    with pytest.raises(LedgerStateError, match="a retarget event with the keys"):
        Ledger.load_state_dict(_resealed(bad))
    # a 0.1 state's migrate event, written by load and kept in the next state_dict
    migrated = Ledger.load_state_dict(_v1(lambda s: None)).state_dict()
    edit(migrated["journal"][1][1] if migrated["journal"][0][0] == "fix"
         else migrated["journal"][0][1])
    with pytest.raises(LedgerStateError, match="a migrate event with the keys"):
        Ledger.load_state_dict(_resealed(migrated))


# -- item 6: the sweep's finds ----------------------------------------------------------
def test_a_subnormal_sample_rate_is_charged_not_an_overflow():
    # Plan.read_every took ceil(1/q): inf for q = 5e-324, OverflowError on every charge
    ledger = Ledger(3.0, 1e-5)
    ledger.charge(M.SubsampledGaussian(1.0, 5e-324), times=3)
    assert ledger.epsilon() >= 0.0
    assert Plan(M.SubsampledGaussian(1.0, 5e-324)).read_every == 2**53


@pytest.mark.parametrize("listeners", [np.array(0.5), np.array(3)])
def test_listeners_that_are_not_an_iterable_are_refused_by_name(listeners):
    with pytest.raises(InvalidArgumentError, match="listeners="):
        Ledger(3.0, 1e-5, listeners=listeners)


@pytest.mark.parametrize("kwargs, name", [({"steps": 0}, "steps"), ({"canaries": 0}, "canaries")])
def test_the_audit_command_refuses_zero_steps_or_canaries(kwargs, name):
    # `privguard audit --steps 0` ran the default 600 steps (`steps or default`)
    pytest.importorskip("opacus")
    pytest.importorskip("sklearn")
    from privguard.audit import demo_audit

    with pytest.raises(InvalidArgumentError, match=f"{name}=0"):
        demo_audit(quick=True, **kwargs)


@pytest.mark.parametrize("call", ["expected_quantile", "prob_top"])
def test_utility_functions_refuse_what_is_not_a_distribution_of_k(call):
    from privguard import tuning as T

    args = (5.0,) if call == "expected_quantile" else (5.0, 0.1)
    with pytest.raises(InvalidArgumentError, match=r"runs=5\.0"):  # was AttributeError
        getattr(T, call)(*args)
    assert 0 < getattr(T, call)(T.Poisson(5.0), *args[1:]) < 1


@pytest.mark.filterwarnings("error")
def test_calibration_names_the_unreachable_target_and_a_huge_slope_is_warning_free():
    from privguard.tuning import calibrate_noise_multiplier, calibrate_tuning_noise

    with pytest.raises(InvalidArgumentError, match="epsilon=1e-300 is invalid: is not reach"):
        calibrate_noise_multiplier(0.01, 100, epsilon=1e-300, delta=1e-5)
    with pytest.raises(InvalidArgumentError, match="rdp_slope=1e-300 is invalid"):
        calibrate_noise_multiplier(0.01, 100, rdp_slope=1e-300)
    from privguard.tuning import Poisson

    with pytest.raises(InvalidArgumentError, match="epsilon=1e-300 is invalid"):
        calibrate_tuning_noise(0.01, 100, Poisson(5.0), 1e-300, 1e-5)
    # c·α overflows for c = 1e308: every σ fits, the smallest the search tries comes back
    assert calibrate_noise_multiplier(0.01, 100, rdp_slope=1e308) < 2.5e-3
