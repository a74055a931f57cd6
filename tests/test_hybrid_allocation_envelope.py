"""The certified random-allocation epoch PLD (issue 27 item 5; docs/theory.md §2b.3).

* the certified loss is stochastically larger than the exact t = 2 loss (one-dimensional
  quadrature) in both directions, and a construction one grid step too optimistic is caught;
* Lemma 2b.4's FFT error bounds hold against exact rational arithmetic;
* Lemma 2b.6's tail values are above mpmath's;
* T_A (epochs) passes its own certified δ and the next epoch does not;
* bad input raises InvalidArgumentError.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import integrate
from scipy.special import ndtr
from test_hybrid_ledger import admitted

from privguard import (
    DEFAULT_ORDERS,
    Concentrated,
    InvalidArgumentError,
    Ledger,
    LedgerStateError,
    Plan,
)
from privguard import mechanisms as M
from privguard._accounting import _allocation_envelope as AE
from privguard._accounting._hybrid import (
    Envelope,
    HybridFilter,
    envelope_of,
    envelope_steps,
    envelope_steps_in,
)

SLOW = pytest.mark.skipif(os.environ.get("CI") != "true" and os.environ.get("PRIVGUARD_SLOW") != "1",
                          reason="slow (set PRIVGUARD_SLOW=1)")


def _pdf(z: float) -> float:
    return math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def exact_tails_t2(sigma: float, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """t = 2: remove P(ℓ > a) = E_Z[P(A > 2e^a − W(Z))], add P(−ℓ > a) = E_Z[P(W < 2e^(−a) − W(Z))]
    (the inner law in closed form; quadrature split at the kink)."""
    s = 1.0 / sigma
    rem, add = [], []
    for a in x:
        y = 2 * math.exp(a)

        def f_rem(z, y=y):
            r = y - math.exp(s * z - s * s / 2)
            return _pdf(z) * (1.0 if r <= 0 else float(ndtr(-(math.log(r) - s * s / 2) / s)))

        y2 = 2 * math.exp(-a)

        def f_add(z, y2=y2):
            r = y2 - math.exp(s * z - s * s / 2)
            return _pdf(z) * (0.0 if r <= 0 else float(ndtr((math.log(r) + s * s / 2) / s)))

        zk = (math.log(y) + s * s / 2) / s
        zk2 = (math.log(y2) + s * s / 2) / s
        rem.append(sum(integrate.quad(f_rem, lo, hi, epsabs=1e-16, epsrel=1e-10, limit=400)[0]
                       for lo, hi in ((-40, zk), (zk, 40))))
        add.append(integrate.quad(f_add, -40, zk2, epsabs=1e-16, epsrel=1e-10, limit=400)[0])
    return np.array(rem), np.array(add)


def pmf_tail(pmf, x: np.ndarray, shift: int = 0) -> np.ndarray:
    """P(ℓ̂ > x) of a DensePLDPmf (its +∞ mass included); ``shift`` moves every loss down."""
    losses = (np.arange(pmf.size) + pmf._lower_loss - shift) * pmf._discretization
    probs = np.asarray(pmf._probs)
    tail = np.concatenate([np.cumsum(probs[::-1])[::-1], [0.0]]) + pmf._infinity_mass
    return tail[np.searchsorted(losses, x, side="right")]


def _check_t2(sigma: float, points: int = 60, tight: float = 1.01) -> None:
    pld = AE.epoch_pld(sigma, 2)
    x = np.linspace(-2.0, 3.0, points) + 1.234e-5
    rem, add = exact_tails_t2(sigma, x)
    cr, ca = pmf_tail(pld._pmf_remove, x), pmf_tail(pld._pmf_add, x)
    assert np.all(cr >= rem * (1 - 1e-9)), np.min(cr / np.maximum(rem, 1e-300))
    assert np.all(ca >= add * (1 - 1e-9)), np.min(ca / np.maximum(add, 1e-300))
    # and tight: within ``tight`` plus the absolute allowances (about 1e-10)
    assert np.all(cr <= rem * tight + 1e-9)
    assert np.all(ca <= add * tight + 1e-9)


@pytest.mark.parametrize("sigma", [2.0, 3.0])
def test_certified_tail_is_above_the_exact_t2_tail(sigma):
    _check_t2(sigma)


@SLOW
@pytest.mark.parametrize("sigma", [0.8, 1.0])
def test_certified_tail_is_above_the_exact_t2_tail_small_sigma(sigma):
    _check_t2(sigma, points=200, tight=1.25)  # coarser lattices at small σ (window caps)


def test_a_loss_one_grid_step_low_is_caught():
    """Negative control: the same check fails when every remove loss is one grid step lower."""
    pld = AE.epoch_pld(2.0, 2)
    x = np.linspace(-2.0, 3.0, 400) + 1.234e-5
    rem, _ = exact_tails_t2(2.0, x)
    low = pmf_tail(pld._pmf_remove, x, shift=1)
    assert np.any(low < rem * (1 - 1e-9))


def _exact_circular_power(ints: list[int], scale: int, n: int, size: int) -> np.ndarray:
    """(x/scale)^{*n} circular, exactly (Python integers), then rounded to float."""
    cur = [0] * size
    cur[0] = 1
    denom = 1
    for _ in range(n):
        nxt = [0] * size
        for i, a in enumerate(cur):
            if a:
                for j, b in enumerate(ints):
                    if b:
                        nxt[(i + j) % size] += a * b
        cur, denom = nxt, denom * scale
    return np.array([float(Fraction(v, denom)) for v in cur])


@pytest.mark.parametrize("n", [2, 5, 9])
def test_fft_power_error_bound_holds_exactly(n):
    rng = np.random.default_rng(n)
    size = 64
    ints = [int(v) for v in rng.integers(0, 2**20, size=12)] + [0] * (size - 12)
    scale = sum(ints)
    x = np.array([v / scale for v in ints])
    approx, err = AE.fft_power(x, n)
    # the exact power of the float vector x (its entries are the floats v/scale, rational)
    fr = [Fraction(float(v)) for v in x]
    denom = math.lcm(*[f.denominator for f in fr])
    exact = _exact_circular_power([int(f * denom) for f in fr], denom, n, size)
    actual = float(np.linalg.norm(approx - exact))
    assert actual <= err
    assert err < 1e-10


def test_fft_convolve_error_bound_holds():
    rng = np.random.default_rng(7)
    a = rng.random(300) / 150
    b = rng.random(200)
    approx, err = AE.fft_convolve(a, b)
    fa, fb = [Fraction(float(v)) for v in a], [Fraction(float(v)) for v in b]
    exact = np.zeros(len(a) + len(b) - 1)
    acc = [Fraction(0)] * len(exact)
    for i, u in enumerate(fa):
        for j, v in enumerate(fb):
            acc[i + j] += u * v
    exact = np.array([float(v) for v in acc])
    assert float(np.max(np.abs(approx - exact))) <= err
    assert err < 1e-11


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 10.0, 80.0])
def test_lattice_tails_are_above_mpmath(sigma):
    """Lemma 2b.6: the tail values the lattices are built from, computed as the module
    computes them (w = g·k, z = (log w − μ)/s), are above mpmath's exact ones."""
    mpmath.mp.dps = 40
    s = 1.0 / sigma
    rng = np.random.default_rng(int(sigma * 10))
    g = 1e-4
    ks = np.unique(np.concatenate([rng.integers(1, 10**8, 40), [1, 2, 10, 10**4]]))
    w = g * ks.astype(float)
    for mu, upper in ((-s * s / 2, True), (-s * s / 2, False), (s * s / 2, True)):
        z = AE._z(w, s, mu)
        got = AE._ndtr(-z if upper else z) * (1 + AE.ndtr_rel(s))
        for wi, gi, ki, zi in zip(w, got, ks, z):
            if abs(zi) > 40:  # the value or its complement is below 1e-300
                continue
            zz = (mpmath.log(mpmath.mpf(int(ki)) * mpmath.mpf(g)) - mu) / s
            exact = mpmath.ncdf(-zz) if upper else mpmath.ncdf(zz)
            if exact > mpmath.mpf("1e-300"):
                assert gi >= exact, (sigma, wi, mu, upper, gi, exact)
                # the allowance is not a fig leaf: the raw error is well below it
                raw = gi / (1 + AE.ndtr_rel(s))
                assert abs(raw / float(exact) - 1) < AE.ndtr_rel(s) / 2


def test_t_a_passes_its_own_delta_and_the_next_epoch_does_not():
    sigma, t, eps, delta_a = 2.0, 10, 2.0, 0.99e-5
    e = AE.envelope_epochs(sigma, t, eps, delta_a)
    assert e >= 1
    target = delta_a * (1 - AE.MARGIN)
    assert AE.certified_epoch_delta(sigma, t, eps, e) <= target
    assert AE.certified_epoch_delta(sigma, t, eps, e + 1) > target


@pytest.mark.parametrize("args, name", [((0.3, 10), "noise_multiplier"), ((2.0, 1), "steps"),
                                        ((2.0, 0), "steps"), ((float("nan"), 10), "noise_multiplier"),
                                        ((2.0, 10**6), "steps"), ((2.0, 2.5), "steps")])
def test_bad_input(args, name):
    with pytest.raises(InvalidArgumentError) as info:
        AE.epoch_pld(*args)
    assert name in str(info.value)
    with pytest.raises(InvalidArgumentError):
        AE.envelope_epochs(2.0, 10, -1.0, 1e-5)


# ------------------------------------------------------------ the hybrid filter
ORDERS = np.array(DEFAULT_ORDERS)
SIGMA, T, EPS, DELTA = 2.0, 10, 2.0, 1e-5  # T_A = 8 epochs, the RDP filter 7 (docs/theory.md §2b.3)
EPOCH = M.RandomAllocation(SIGMA, T)
ENV = Envelope(SIGMA, 1.0, 1, T)


def test_envelope_of_an_epoch_and_what_is_inside():
    assert envelope_of(EPOCH) == ENV == envelope_of(M.RandomAllocation(SIGMA, T, epochs=5))
    assert envelope_of(M.RandomAllocation(0.4, T)) is None  # below the built range
    assert envelope_of(M.RandomAllocation(SIGMA, 20_000)) is None
    assert envelope_steps_in(M.RandomAllocation(2.5, T, epochs=3), ENV) == 3
    outside = [M.RandomAllocation(1.99, T),  # less noise
               M.RandomAllocation(SIGMA, T + 1), M.RandomAllocation(SIGMA, T - 1),  # another t
               M.SubsampledGaussian(SIGMA, 1 / T), M.Gaussian(10.0), M.Laplace(1.0)]
    assert [envelope_steps_in(m, ENV) for m in outside] == [None] * len(outside)
    # a Poisson envelope holds no epoch
    assert envelope_steps_in(EPOCH, Envelope(SIGMA, 1.0)) is None


def test_a_hybrid_ledger_admits_at_least_the_rdp_filters_epochs_on_plan():
    hybrid = Ledger(EPS, DELTA, plan=Plan(EPOCH, 1), filter="hybrid")
    flt = hybrid._acc.filter
    assert flt.kind == "hybrid" and flt.envelope == ENV
    assert flt.steps_a == envelope_steps(ENV, EPS, flt.delta_a) == AE.envelope_epochs(
        SIGMA, T, EPS, flt.delta_a)
    # T_A's composed δ, both directions, is within δ_A
    assert AE.certified_epoch_delta(SIGMA, T, EPS, flt.steps_a) <= flt.delta_a
    n = admitted(hybrid, EPOCH)
    assert n == flt.steps_a and flt.a_alive and flt.a_count == n
    rdp = admitted(Ledger(EPS, DELTA, plan=Plan(EPOCH, 1)), EPOCH)
    assert n > rdp  # §2b.3's table: the PLD is better here


def test_an_off_plan_epoch_closes_part_a_and_b_decides():
    ledger = Ledger(EPS, DELTA, plan=Plan(EPOCH, 1), filter="hybrid")
    flt = ledger._acc.filter
    ledger.charge(EPOCH)
    ledger.charge(M.RandomAllocation(3.0, T))  # more noise, same t: inside
    assert flt.a_count == 2 and flt.a_alive
    with pytest.warns(UserWarning, match="left the plan"):
        ledger.charge(M.RandomAllocation(SIGMA, 2 * T))  # another t: outside
    assert not flt.a_alive and flt.a_count == 2
    # from now on only the RDP fallback at δ_B decides
    b_alone = Ledger(EPS, flt.delta_b, plan=Plan(EPOCH, 1))
    assert admitted(ledger, EPOCH) <= admitted(b_alone, EPOCH)


def test_an_epoch_with_less_noise_closes_part_a():
    ledger = Ledger(EPS, DELTA, plan=Plan(EPOCH, 1), filter="hybrid")
    flt = ledger._acc.filter
    with pytest.warns(UserWarning, match="left the plan"):
        ledger.charge(M.RandomAllocation(0.9 * SIGMA, T))  # σ < σ₀: outside, B admits it
    assert not flt.a_alive and flt.a_count == 0
    # a further on-plan epoch is B's to decide, never A's again
    ledger.charge(EPOCH)
    assert not flt.a_alive and flt.a_count == 0


def test_hybrid_plans_of_random_allocation_outside_the_built_range_are_refused():
    for step in (M.RandomAllocation(0.4, T), M.RandomAllocation(SIGMA, 20_000)):
        with pytest.raises(InvalidArgumentError, match=r"filter.*only for noise_multiplier"):
            Ledger(EPS, DELTA, plan=Plan(step, 1), filter="hybrid")


def test_allocation_envelope_dicts_round_trip_and_old_ones_load():
    assert ENV.to_dict() == {"noise_multiplier": SIGMA, "sample_rate": 1.0,
                             "allocation_steps": T}
    assert Envelope.from_dict(ENV.to_dict()) == ENV
    old = {"noise_multiplier": 1.1, "sample_rate": 0.004}  # as written before this change
    assert Envelope(1.1, 0.004).to_dict() == old and Envelope.from_dict(old) == Envelope(1.1, 0.004)
    for bad in ({**old, "allocation_steps": 10}, {**ENV.to_dict(), "allocation_steps": 0},
                {**ENV.to_dict(), "allocation_steps": 1}, {**ENV.to_dict(), "allocation_steps": 2.5},
                {**ENV.to_dict(), "allocation_steps": True}, {**ENV.to_dict(), "micro_batches": 2},
                {**ENV.to_dict(), "noise_multiplier": 0.3}):
        with pytest.raises(InvalidArgumentError):
            Envelope.from_dict(bad)


def test_an_allocation_hybrid_state_round_trips(tmp_path):
    f = HybridFilter(EPS, DELTA, ENV, ORDERS, Concentrated())
    f.fix(EPOCH._rdp_checked(ORDERS))
    again = HybridFilter.from_config(f.config(), ORDERS)
    assert again.envelope == ENV and again.steps_a == f.steps_a
    forged = f.config()
    forged["steps_a"] = f.steps_a + 1  # more epochs than certified
    with pytest.raises(LedgerStateError):
        HybridFilter.from_config(forged, ORDERS)
    ledger = Ledger(EPS, DELTA, plan=Plan(EPOCH, 1), filter="hybrid", path=tmp_path / "a.db")
    for _ in range(3):
        ledger.charge(EPOCH)
    ledger.close()
    opened = Ledger.open(tmp_path / "a.db")
    assert opened._acc.filter.envelope == ENV
    assert opened._acc.filter.a_count == 3 and opened._acc.filter.a_alive
    copy = Ledger.load_state_dict(opened.state_dict())
    assert copy._acc.filter.a_count == 3 and copy._acc.filter.envelope == ENV
    assert admitted(copy, EPOCH) == f.steps_a - 3


def test_the_budget_meter_of_part_a_counts_epochs():
    """docs/theory.md §12 with §2b.3: part A's meter is the PLD ε at δ_A of its epochs."""
    ledger = Ledger(EPS, DELTA, plan=Plan(EPOCH, 1), filter="hybrid")
    flt = ledger._acc.filter
    metered = []
    for _ in range(flt.steps_a):
        ledger.charge(EPOCH)
        metered.append(ledger.budget())
    assert all(b.part == "hybrid: PLD on plan" for b in metered)
    spent = [b.spent for b in metered]
    assert spent == sorted(spent) and 0 < spent[0] and spent[-1] <= EPS
    # the meter at T_A epochs is the epoch PLD's own ε at δ_A (capped at the target)
    composed = AE.epoch_pld(SIGMA, T).self_compose(flt.steps_a, tail_mass_truncation=AE.TAIL_MASS)
    assert spent[-1] == pytest.approx(min(EPS, composed.get_epsilon_for_delta(flt.delta_a)))


@pytest.mark.parametrize("t0", [1, 10_001])
def test_an_allocation_envelope_out_of_range_names_allocation_steps(t0):
    # Review rz: the range check named "steps", not the argument the caller passed.
    from privguard._accounting._hybrid import Envelope

    with pytest.raises(InvalidArgumentError, match=rf"^allocation_steps={t0} is invalid"):
        Envelope(1.0, 1.0, allocation_steps=t0)


def test_describe_counts_part_a_in_epochs_for_an_allocation_plan():
    ledger = Ledger(EPS, DELTA, plan=Plan(EPOCH, 1), filter="hybrid")
    flt = ledger._acc.filter
    ledger.charge(EPOCH)
    assert f"{flt.steps_a - 1} of {flt.steps_a} epochs left" in flt.describe()
    assert "envelope steps" not in flt.describe()


def test_certified_epoch_delta_refuses_more_epochs_than_the_search_reaches():
    # (a composition of 10⁹ epochs raised MemoryError: a built-in exception)
    with pytest.raises(InvalidArgumentError, match=rf"^epochs=1000000000 is invalid: .*<= "
                                                   rf"{AE.MAX_EPOCHS}"):
        AE.certified_epoch_delta(SIGMA, T, EPS, 10**9)


def _prototype():
    """benchmarks/allocation_pld_prototype.py, the checks docs/theory.md §2b.3 cites."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks",
                        "allocation_pld_prototype.py")
    spec = importlib.util.spec_from_file_location("allocation_pld_prototype", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv", [[], ["--bogus"], ["--validate", "--sigmas", "0"],
                                  ["--validate", "--mc-epochs", "-1"]])
def test_the_prototype_refuses_arguments_it_cannot_honour(argv, capsys):
    # Task lo: the script ignored its arguments (none, --validate, or anything: the same run)
    with pytest.raises(SystemExit) as exc:
        _prototype().main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_the_prototype_runs_the_checks_it_is_given(capsys):
    _prototype().main(["--validate", "--sigmas", "2", "--mc-epochs", "1000"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("sigma=")]
    assert [row.split(":")[0] for row in rows] == ["sigma=2.0", "sigma=2.0"]  # t = 2, t = 10
    assert "(1e+03 epochs)" in out
    assert all(row.count("violations 0") == 2 for row in rows)
