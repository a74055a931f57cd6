"""Leftovers of the last closing notes (task lo4): each test fails on the code before,
or pins a behaviour-neutral mend."""

from __future__ import annotations

import numpy as np
import pytest
from _poisson_exact import exact_poisson_curve

from privguard import LedgerStateError
from privguard import mechanisms as M
from privguard._curves import _conversion as conv


def _grid(rng: np.random.Generator):
    orders = np.concatenate([1 + rng.exponential(5, size=20), [1.0000001, 1.5, 2, 64, 1e6]])
    shares = 10 ** rng.uniform(-320, 0, size=orders.size)
    shares[rng.random(orders.size) < 0.2] = 0.0  # zero shares: a = −inf, s = +inf
    return orders, shares


@pytest.mark.parametrize("epsilon", [0.0, 5e-324, 1e-9, 0.7, 8.0, 1e3, 1e308, np.inf])
def test_the_level_below_is_the_level_per_order_lowered_by_its_slack(epsilon):
    # Task lo4: rdp_budget_below restated rdp_budget_per_order's level (ε + a) − b; both
    # now compute it once. Pinned exactly (bit for bit, NaN mapped to −inf): the level is
    # Opacus' inverse of the improved conversion, and the level below is that level
    # lowered by s + SLACK·(|ε| + |level|) (docs/theory.md §1.2).
    rng = np.random.default_rng(4)
    for _ in range(50):
        orders, shares = _grid(rng)
        a, b, s = terms = conv.improved_terms(orders, shares)
        with np.errstate(invalid="ignore", over="ignore"):
            level = (epsilon + a) - b
            level = np.where(np.isnan(level), -np.inf, level)
            below = level - ((s + conv.SLACK * abs(epsilon)) + conv.SLACK * np.abs(level))
        below = np.where(np.isnan(below), -np.inf, below)
        assert conv.rdp_budget_per_order(orders, epsilon, shares).tobytes() == level.tobytes()
        assert conv.rdp_budget_below(orders, epsilon, terms).tobytes() == below.tobytes()
        assert np.all(below <= level)


def _entry(run: str, charges: int, base: int, parents: list[str]) -> dict:
    return {"charges": charges, "checkpoint": {"run": run, "base": base, "from": parents}}


@pytest.mark.parametrize("edit", ["from removed", "base above charges", "none"])
@pytest.mark.parametrize("taken", [True, False])
def test_lineage_checks_each_entry_once_and_still_refuses_an_edited_one(edit, taken):
    # Task lo4: lineage checks each entry's base/from once (check_branches no longer checks
    # the taken ones again). An edited entry refuses whether its run is in the family taken
    # (B resumed A at 4 charges) or outside it (C, of no relation: an edit may disconnect
    # its own run).
    from privguard.integrations._later import lineage

    entries = [("a2", _entry("A", 2, 0, [])), ("a4", _entry("A", 4, 0, [])),
               ("b6", _entry("B", 6, 4, ["A"])), ("c3", _entry("C", 3, 0, []))]
    edited = entries[2 if taken else 3][1]["checkpoint"]
    if edit == "from removed":
        del edited["from"]
    elif edit == "base above charges":
        edited["base"] = 7
    if edit == "none":
        assert [p for p, _ in lineage(entries, {"A"})] == ["a2", "a4", "b6"]
    else:
        with pytest.raises(LedgerStateError, match="edited entry"):
            lineage(entries, {"A"})


@pytest.mark.parametrize("argv", [["--hook-steps", "20"], ["--hook-steps", "0"],
                                  ["--rounds", "0"]])
def test_the_lease_step_profile_refuses_too_few_steps_with_a_usage_error(argv, monkeypatch,
                                                                          capsys):
    # Task lo4: part 3 drops 20 warm-up steps (attach_overhead.hook_cost); --hook-steps 20
    # crashed with StatisticsError ("no median for empty data") after the training began.
    pytest.importorskip("opacus")
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import lease_step_profile as script

    def no_part(*args):
        raise AssertionError("a part ran")

    for part in ("part1", "part2", "part3", "part4"):
        monkeypatch.setattr(script, part, no_part)
    monkeypatch.setattr(sys, "argv", ["lease_step_profile.py", "--only", "3", *argv])
    with pytest.raises(SystemExit) as exit_:
        script.main()
    assert exit_.value.code == 2
    assert f"argument {argv[0]}: must be at least" in capsys.readouterr().err


@pytest.mark.parametrize(("sigma", "q", "mu"), [(0.7, 1e-6, 3.0), (0.7, 1e-6, 1.0),
                                               (0.4, 1e-4, 3.0), (0.7, 1e-7, 0.5)])
def test_poisson_tuning_is_charged_at_least_its_exact_curve_where_delta_hat_cancels(sigma, q,
                                                                                    mu):
    # Task lo4: δ̂ of Theorem 6 was rounded to nearest, and its Bretagnolle–Huber term
    # ½·log1p(−exp(−ε(α))) kept only ~ε(α)/u of its digits for a tiny ε(α) (here the
    # subsampled Gaussian's at the smallest orders, ~10⁻¹²): the charge was up to 2·10⁻¹¹
    # (relative) below the exact curve, far beyond the 2⁻⁴⁸ the bound adds. Now δ̂ is
    # rounded up (_repeat_select._delta_hat).
    from privguard.tuning import Poisson

    orders = np.array([1.1, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 15.0, 20.0, 28.0, 40.0, 64.0])
    base = M.SubsampledGaussian(sigma, q, steps=1).rdp(orders)
    charged = M.RepeatAndSelect(M.SubsampledGaussian(sigma, q, steps=1), Poisson(mu)).rdp(orders)
    exact = exact_poisson_curve(orders, base, mu)
    below = [(float(lam), float((c - e) / e)) for lam, c, e in zip(orders, charged, exact)
             if c < e]
    assert not below


def test_delta_hat_is_at_or_above_its_exact_value_on_random_and_edge_curves():
    # Task lo4: δ̂ (at ε̂ = log(1 + 1/(λ−1)), which the theorem needs exactly or below) is
    # at or above the exact minimum over the grid, in 50 digits: curves from 10⁻³⁰⁰ to 10³,
    # orders to 10⁴ (the conversion's terms (α−1)·ε(α) cancel to a small log δ), a zero.
    import mpmath as mp

    from privguard._mechanisms._repeat_select import _delta_hat

    rng = np.random.default_rng(7)
    for trial in range(30):
        orders = np.sort(1 + 10 ** rng.uniform(-3, 4, size=12))
        base = np.sort(10 ** rng.uniform(-300 if trial % 3 == 0 else -14, 3, size=12))
        if trial == 5:
            base[0] = 0.0
        got = _delta_hat(orders, base)
        with mp.workdps(50):
            a = [mp.mpf(float(x)) for x in orders]
            b = [mp.mpf(float(x)) for x in base]
            kl = min(mp.log(-mp.expm1(-x)) / 2 if x > 0 else -mp.inf for x in b)
            for lam, d in zip(a, got):
                eh = mp.log1p(1 / (lam - 1))
                log_d = min([(x - 1) * (y - eh) - mp.log(x) + (x - 1) * mp.log1p(-1 / x)
                             for x, y in zip(a, b)] + [kl])
                assert mp.mpf(float(d)) >= min(mp.exp(log_d), 1), (trial, float(lam))


def _float64_step(a, g, sigma, scale=64.0):
    from types import SimpleNamespace

    from privguard.integrations._witnesses import Witnesses

    opt = SimpleNamespace(params=[SimpleNamespace(grad=g, summed_grad=a, dtype=a.dtype)],
                          max_grad_norm=1.0, noise_multiplier=sigma, loss_reduction="mean",
                          expected_batch_size=int(scale), accumulated_iterations=1)
    return Witnesses(opt, None, false_alarm=1e-10, noise=True)


@pytest.mark.parametrize("seed", [5, 9, 10, 13])
def test_a_float64_step_without_noise_is_not_passed_on_its_squares_underflow(seed):
    # Task lo4: float64 entries ~10⁻¹⁵⁹ have squares below 2⁻¹⁰²² (subnormal), rounded by up
    # to 2⁻¹⁰⁷⁵ absolute either way; ‖a‖² − 2s⟨a, g⟩ + s²‖g‖² of a step with no noise at all
    # (g = a/s exactly) came out positive, read as noise σC = 3·10⁻¹⁶² (its square > 0, so
    # wr's guard let it through), and the step passed the noise test. Refused now: the
    # squares' underflow allowance is at least σC√d/16 there (docs/theory.md §16.1).
    torch = pytest.importorskip("torch")
    from privguard import PipelineMismatchError

    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(64, generator=gen, dtype=torch.float64) * 1e-159
    w = _float64_step(a, a / 64.0, 3e-162)
    with pytest.raises(PipelineMismatchError, match="too small to be measured"):
        w._check_noise(3e-162, 64)


@pytest.mark.parametrize("noise", [True, False])
def test_above_the_underflow_guard_float64_steps_are_judged_by_the_noise_test(noise):
    # Just above the guard (σC = 10⁻¹⁴⁸, s = 64) the underflow allowance does not blind the
    # test: a step without noise is refused by it, a correct one passes.
    torch = pytest.importorskip("torch")
    from privguard import PipelineMismatchError

    gen = torch.Generator().manual_seed(3)
    a = torch.randn(400, generator=gen, dtype=torch.float64) * 1e-159
    z = torch.randn(400, generator=gen, dtype=torch.float64) * 1e-148 if noise else 0.0
    w = _float64_step(a, (a + z) / 64.0, 1e-148)
    if noise:
        w._check_noise(1e-148, 64)
        assert w.failure is None and w.noise_checks == 1
    else:
        with pytest.raises(PipelineMismatchError, match="P\\(this little noise"):
            w._check_noise(1e-148, 64)


def test_a_float64_clipped_sum_over_its_bound_is_not_hidden_by_its_squares_underflow():
    # Task lo4: entries 10⁻¹⁶³ square to 0 in float64, so ‖a‖ read 0 and a clipped sum 10⁷
    # times over B·C (C = 10⁻¹⁷⁰, noise σC = 10⁻¹⁴⁸) passed the clipping check. The bound on
    # ‖a‖ now adds the squares' underflow (fail closed: a float64 step with B·C ≲ 10⁻¹⁵²
    # is refused whatever its clipped sum).
    torch = pytest.importorskip("torch")
    from privguard import PipelineMismatchError

    gen = torch.Generator().manual_seed(4)
    a = torch.full((64,), 1e-163, dtype=torch.float64)
    z = torch.randn(64, generator=gen, dtype=torch.float64) * 1e-148
    w = _float64_step(a, (a + z) / 64.0, 1e22)
    w.optimizer.max_grad_norm = 1e-170
    with pytest.raises(PipelineMismatchError) as info:
        w._check_noise(1e22, 64)
    assert info.value.witness == "clipping"
