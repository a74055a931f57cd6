"""The hybrid filter of issue 16 (docs/theory.md §2b): PLD envelope + RDP fallback.

* Monte-Carlo on exact Gaussian losses (q = 1): the whole adaptive
  interaction satisfies the hockey-stick (ε, δ)-DP condition against
  adversaries that stay inside the envelope, leave it, and oscillate — and
  the same check FAILS for three wrong variants (C1 broken, C2 broken, T_A
  inflated by 15%).
* T_A against closed forms (q = 1), dp-accounting's PLD and Opacus' PRV.
* Deviation: leaving the envelope hands the run to the RDP fallback, and the
  total stays within RDP accounting at the full δ.
* The decomposition claim of the proof on random views, batching, state, bad input.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _hybrid_mc import ADVERSARIES, ONLY_INSIDE, Variant, b_cap, hockey_stick, simulate
from opacus.accountants import PRVAccountant
from opacus.accountants.analysis.rdp import get_privacy_spent
from scipy.stats import norm

from privguard import (
    DEFAULT_ORDERS,
    Concentrated,
    InvalidArgumentError,
    LedgerStateError,
    Uniform,
)
from privguard import mechanisms as M
from privguard._accounting import _hybrid as H
from privguard._accounting._filters import DPFilter
from privguard._accounting._hybrid import (
    Envelope,
    HybridFilter,
    HybridState,
    certified_delta,
    envelope_of,
    envelope_steps,
    envelope_steps_in,
)

ORDERS = np.array(DEFAULT_ORDERS)
EPS, DELTA = 3.0, 1e-5
CASES = [(1.0, 0.01), (1.1, 256 / 60000)]


def gaussian_delta(eps: float, mu: float) -> float:
    """δ(ε) of μ-GDP (Dong, Roth & Su 2022, Cor. 2.13)."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def make(eps, delta, step, **kw) -> HybridFilter:
    f = HybridFilter(eps, delta, envelope_of(step), ORDERS, kw.pop("shares", Concentrated()), **kw)
    f.fix(step._rdp_checked(ORDERS))
    return f


class MiniLedger:
    """The ledger's side of the contract: spent = base + n·curve over ALL admitted charges."""

    def __init__(self, filt: HybridFilter) -> None:
        self.f = filt
        self.base = np.zeros(ORDERS.size)
        self.key, self.curve, self.n = None, np.zeros(ORDERS.size), 0
        self.admitted = 0

    def spent_after(self, mech, times=1):
        if mech == self.key:
            return self.base + (self.n + times) * self.curve
        return (self.base + self.n * self.curve) + times * mech._rdp_checked(ORDERS)

    @property
    def spent(self):
        return self.base + self.n * self.curve

    def charge(self, mech, times=1) -> bool:
        ok, state = self.f.decide(self.spent_after(mech, times), mech, times)
        if not ok:
            return False
        self.f.apply(state)
        for _ in range(times):
            if mech == self.key:
                self.n += 1
            else:
                self.base = self.base + self.n * self.curve
                self.key, self.curve, self.n = mech, mech._rdp_checked(ORDERS), 1
        self.admitted += times
        return True

    def run(self, mech) -> int:
        """Charge ``mech`` until refused; return how many were admitted."""
        k = 0
        while self.charge(mech):
            k += 1
        return k


# --------------------------------------------------------------- Monte-Carlo
MC_EPS, MC_DELTA, MC_SIGMA = 2.0, 0.02, 10.0  # T_A = 95 envelope steps, B ~ 43 steps
MC_N = 100_000


@pytest.fixture(scope="module")
def mc_filter() -> HybridFilter:
    return make(MC_EPS, MC_DELTA, M.Gaussian(MC_SIGMA))


@pytest.fixture(scope="module")
def mc_cap(mc_filter) -> float:
    return b_cap(mc_filter)


def test_mc_envelope_count_is_the_closed_form(mc_filter):
    # q = 1: T envelope steps are exactly μ-GDP with μ = √T/σ₀.
    target = mc_filter.delta_a * (1 - H.MARGIN)
    closed = max(t for t in range(1, 10_000)
                 if gaussian_delta(MC_EPS, math.sqrt(t) / MC_SIGMA) <= target)
    assert closed - 1 <= mc_filter.steps_a <= closed


@pytest.mark.parametrize("adversary", sorted(ADVERSARIES))
def test_hybrid_is_eps_delta_dp_against_adaptive_adversaries(adversary, mc_filter, mc_cap):
    v = Variant(mc_filter.steps_a, mc_cap)
    L = simulate(v, ADVERSARIES[adversary], MC_SIGMA, MC_N, seed=5,
                 inside_only=adversary in ONLY_INSIDE)
    hs, tol = hockey_stick(L, MC_EPS)
    assert hs <= MC_DELTA + tol, f"{adversary}: E[(1-e^(ε-L))+] = {hs:.4g} > δ = {MC_DELTA}"


def test_mc_on_plan_is_tight(mc_filter, mc_cap):
    # The plan adversary uses all of A: the statistic sits at δ_A's closed form.
    L = simulate(Variant(mc_filter.steps_a, mc_cap), ADVERSARIES["plan"], MC_SIGMA, MC_N, seed=6,
                 inside_only=True)
    hs, tol = hockey_stick(L, MC_EPS)
    exact = gaussian_delta(MC_EPS, math.sqrt(mc_filter.steps_a) / MC_SIGMA)
    assert abs(hs - exact) <= tol


@pytest.mark.parametrize("variant", ["no-kill (C1)", "B-late (C2)", "T_A+15%"])
def test_mc_has_power_against_wrong_variants(variant, mc_filter, mc_cap):
    t = mc_filter.steps_a
    v = {"no-kill (C1)": Variant(t, mc_cap, kill=False),
         "B-late (C2)": Variant(t, mc_cap, charge_b_always=False),
         "T_A+15%": Variant(math.floor(1.15 * t), mc_cap)}[variant]
    worst = 0.0
    for name, adversary in ADVERSARIES.items():
        L = simulate(v, adversary, MC_SIGMA, MC_N // 2, seed=9, inside_only=name in ONLY_INSIDE)
        hs, tol = hockey_stick(L, MC_EPS)
        worst = max(worst, (hs - tol) / MC_DELTA)
    assert worst > 1.2, f"{variant} was not detected (worst lower bound {worst:.3f}·δ)"


def test_mc_rule_is_the_filters_rule(mc_filter, mc_cap):
    # The vectorised simulation takes the same decisions as HybridFilter itself.
    for name in ("oscillate", "leave-and-return", "exhaust-then-leave"):
        _, log = simulate(Variant(mc_filter.steps_a, mc_cap), ADVERSARIES[name], MC_SIGMA, 20,
                          seed=2, trace=True)
        for run in log:
            ledger = MiniLedger(make(MC_EPS, MC_DELTA, M.Gaussian(MC_SIGMA)))
            assert [ledger.charge(M.Gaussian(s)) for s, _ in run] == [ok for _, ok in run]


# ------------------------------------------------------------- the proof's claim
def test_every_view_is_all_A_or_all_B():
    # docs/theory.md §2b, Claim: on every view either every admitted charge
    # was A-admissible or every one was B-admissible. Random adaptive views,
    # batches of envelope steps, other mechanisms, refusals.
    rng = np.random.default_rng(0)
    step = M.SubsampledGaussian(2.0, 0.1)
    inside = [M.SubsampledGaussian(2.0, 0.1), M.SubsampledGaussian(2.0, 0.1, steps=7),
              M.SubsampledGaussian(2.5, 0.05)]
    outside = [M.SubsampledGaussian(1.5, 0.1), M.SubsampledGaussian(2.0, 0.2), M.Gaussian(6.0),
               M.Laplace(2.0)]
    a_only = b_only = 0
    for view in range(80):
        f = make(1.0, 1e-3, step)  # T_A = 44 envelope steps; B alone affords 18
        ledger = MiniLedger(f)
        flags = []
        p_out = (0.0, 0.005, 0.02, 0.3)[view % 4]
        for _ in range(300):
            menu = outside if rng.random() < p_out else inside
            mech = menu[rng.integers(len(menu))]
            spent_after = ledger.spent_after(mech)
            k = envelope_steps_in(mech, f.envelope)
            a_ok = f.a_alive and k is not None and f.a_count + k <= f.steps_a
            b_ok = f.fallback.admits(spent_after, f.weights)
            if ledger.charge(mech):
                flags.append((a_ok, b_ok))
            else:
                assert not a_ok and not b_ok
        assert all(a for a, _ in flags) or all(b for _, b in flags)
        a_only += any(a and not b for a, b in flags)
        b_only += any(b and not a for a, b in flags)
    assert a_only >= 10 and b_only >= 10  # both kinds of views occur: the check has teeth


def test_outside_charge_kills_A_for_good():
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger = MiniLedger(make(EPS, DELTA, step))
    assert ledger.charge(step, times=10) and ledger.f.a_count == 10
    assert ledger.charge(M.SubsampledGaussian(0.9, 0.01))  # outside, B admits
    assert not ledger.f.a_alive
    before = ledger.f.a_count
    assert ledger.charge(step)  # inside again: now only B decides
    assert not ledger.f.a_alive and ledger.f.a_count == before


def test_a_charge_too_big_for_A_goes_to_B_and_closes_A():
    step = M.SubsampledGaussian(1.0, 0.01)
    f = make(EPS, DELTA, step)
    ledger = MiniLedger(f)
    big = M.SubsampledGaussian(1.0, 0.01, steps=f.steps_a + 1)  # inside, but > T_A at once
    assert not ledger.charge(big)  # B cannot afford it either: refused, A untouched
    assert f.a_alive and f.a_count == 0
    assert ledger.charge(M.SubsampledGaussian(1.0, 0.01, steps=1500))  # A and B both admit
    assert f.a_alive and f.a_count == 1500
    assert not ledger.charge(M.SubsampledGaussian(1.0, 0.01, steps=f.steps_a - 1499))
    assert ledger.charge(M.SubsampledGaussian(1.0, 0.01, steps=f.steps_a - 1500))
    assert f.a_count == f.steps_a and not ledger.charge(step)


def test_k_charges_at_once_equal_k_single_charges():
    rng = np.random.default_rng(1)
    step = M.SubsampledGaussian(1.0, 0.01)
    menu = [step, M.SubsampledGaussian(1.2, 0.01), M.SubsampledGaussian(0.8, 0.01)]
    for _ in range(20):
        one, many = MiniLedger(make(EPS, DELTA, step)), MiniLedger(make(EPS, DELTA, step))
        for _ in range(6):
            mech, k = menu[rng.integers(3)], int(rng.integers(1, 900))
            ok_many, state_many = many.f.decide(many.spent_after(mech, k), mech, k)
            singles = [one.charge(mech) for _ in range(k)]
            assert ok_many == all(singles)
            if ok_many:
                many.charge(mech, k)
                assert state_many == HybridState(one.f.a_count, one.f.a_alive)
                np.testing.assert_array_equal(many.spent, one.spent)
            else:
                break


@pytest.mark.parametrize("per_charge,times", [(1, 50), (3, 10), (3, 7)])
def test_k_charges_crossing_t_a_reach_the_state_of_k_single_charges(per_charge, times):
    # Issue 26: a block of identical inside charges that does not fit in T_A but that B
    # admits closed A with its count unchanged, where single charges raise it to the last
    # charge that fits; a journal row merging them then did not replay to the live state.
    step = M.SubsampledGaussian(1.0, 0.01)
    cheap = M.SubsampledGaussian(3.0, 0.01, steps=per_charge)  # inside; B admits far more
    one, many = (MiniLedger(make(EPS, DELTA, step, steps_a=20)) for _ in range(2))
    one.charge(cheap)
    many.charge(cheap)
    assert all(one.charge(cheap) for _ in range(times))
    assert many.charge(cheap, times)
    assert not one.f.a_alive and one.f.a_count == 20 - 20 % per_charge
    assert HybridState(many.f.a_count, many.f.a_alive) == HybridState(one.f.a_count, False)
    np.testing.assert_array_equal(many.spent, one.spent)


# ------------------------------------------------------------ step counts
@pytest.mark.parametrize("sigma,q", CASES)
def test_on_plan_admits_at_least_97_percent_of_prv(sigma, q):
    step = M.SubsampledGaussian(sigma, q)
    f = make(EPS, DELTA, step)
    total = MiniLedger(f).run(step)
    assert total == f.steps_a and f.a_count == f.steps_a  # B alone allows fewer
    acc = PRVAccountant()
    acc.history = [(sigma, q, math.ceil(total / 0.97) + 1)]
    assert acc.get_epsilon(DELTA) > EPS  # so PRV allows fewer than total/0.97 steps
    # PLD and PRV agree on what T_A steps cost at δ_A (PRV is an estimate ± 0.01).
    acc.history = [(sigma, q, f.steps_a)]
    assert abs(acc.get_epsilon(f.delta_a) - EPS) <= 0.02


@pytest.mark.parametrize("sigma,q", CASES)
def test_T_A_is_the_largest_certified_count(sigma, q):
    env = Envelope(sigma, q)
    t = envelope_steps(env, EPS, 0.9 * DELTA)
    target = 0.9 * DELTA * (1 - H.MARGIN)
    assert certified_delta(env, EPS, t) <= target < certified_delta(env, EPS, t + 1)
    # within 2% below what the same PLD certifies non-adaptively at the full δ
    full = envelope_steps(env, EPS, DELTA)
    assert 0.98 * full <= t < full


@pytest.mark.parametrize("steps", [1, 12, 95, 400])
def test_pld_is_pessimistic_against_the_closed_form(steps):
    # q = 1: the T-fold Gaussian(σ) is μ-GDP with μ = √T/σ; dp-accounting's
    # pessimistic PLD must never be below it, and close to it.
    env = Envelope(10.0, 1.0)
    for eps in (0.5, 1.0, 2.0, 3.0):
        exact = gaussian_delta(eps, math.sqrt(steps) / 10.0)
        pld = certified_delta(env, eps, steps)
        assert exact <= pld <= exact * 1.01 + 1e-12


def test_inside_steps_are_dominated_by_the_envelope_step():
    # Lemma 1, checked numerically on exact hockey-stick divergences (no
    # discretisation), both directions, ε ∈ [−2, 4].
    env = Envelope(1.0, 0.05)
    eps = np.linspace(-2.0, 4.0, 25)
    top = np.array([H._one_step_delta(env, e) for e in eps])
    for sigma, q in [(1.0, 0.05), (1.3, 0.05), (1.0, 0.01), (2.0, 0.001)]:
        d = np.array([H._one_step_delta(Envelope(sigma, q), e) for e in eps])
        assert np.all(d <= top + 1e-15)
    bigger = np.array([H._one_step_delta(Envelope(0.9, 0.05), e) for e in eps])
    assert np.any(bigger > top)  # a smaller σ is not dominated


# --------------------------------------------------------------- deviation
def test_leaving_the_envelope_hands_over_to_rdp_at_full_delta():
    step = M.SubsampledGaussian(1.0, 0.01)
    f = make(EPS, DELTA, step)
    ledger = MiniLedger(f)
    # With the default δ_B = 0.01δ, B alone admits fewer steps than T_A/2 on plan;
    # leave after a quarter so that B has room left.
    half = f.steps_a // 4
    assert ledger.charge(step, times=half)
    off = M.SubsampledGaussian(0.9, 0.02)  # leaves the envelope in σ and q
    spent_at_leave = ledger.spent.copy()
    extra = ledger.run(off)
    assert extra > 0 and not f.a_alive  # B admitted, A closed for good
    # B governs: exactly the charges B alone (at δ_B) admits from there ...
    alone = DPFilter(EPS, f.delta_b, Concentrated(), ORDERS)
    w = alone.resolve_weights(step._rdp_checked(ORDERS))
    curve = off._rdp_checked(ORDERS)
    assert alone.admits(spent_at_leave + extra * curve, w)
    assert not alone.admits(spent_at_leave + (extra + 1) * curve, w)
    # ... and coming back inside does not revive A: B decides those steps too.
    back = ledger.run(step)
    assert not f.a_alive and alone.admits(ledger.spent, w)
    assert not alone.admits(ledger.spent + step._rdp_checked(ORDERS), w)
    assert half + extra + back < f.steps_a
    # ... and RDP accounting at the full δ (Opacus' conversion) stays within ε.
    eps_rdp, _ = get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=ledger.spent, delta=DELTA)
    assert eps_rdp <= EPS


# --------------------------------------------------------------- state & API
def test_envelope_of_and_steps_in():
    assert envelope_of(M.SubsampledGaussian(1.1, 0.004, steps=3)) == Envelope(1.1, 0.004)
    assert envelope_of(M.Gaussian(2.0)) == Envelope(2.0, 1.0)
    assert envelope_of(M.Laplace(1.0)) is None and envelope_of(M.ZCDP(0.1)) is None
    env = Envelope(1.0, 0.01)
    assert envelope_steps_in(M.SubsampledGaussian(1.0, 0.01, steps=5), env) == 5
    assert envelope_steps_in(M.SubsampledGaussian(1.0, 0.011), env) is None
    assert envelope_steps_in(M.SubsampledGaussian(0.99, 0.01), env) is None
    assert envelope_steps_in(M.Gaussian(5.0), env) is None  # q = 1 > q₀
    assert envelope_steps_in(M.Gaussian(5.0), Envelope(1.0, 1.0)) == 1
    assert envelope_steps_in(M.SubsampledGaussian(5.0, 1.0, steps=2), Envelope(1.0, 1.0)) == 2
    assert envelope_steps_in(M.Composed((M.Gaussian(5.0),)), Envelope(1.0, 1.0)) is None


def test_state_and_config_round_trip():
    step = M.SubsampledGaussian(1.0, 0.01)
    f = make(EPS, DELTA, step)
    ledger = MiniLedger(f)
    ledger.charge(step, times=100)
    ledger.charge(M.SubsampledGaussian(0.8, 0.01))
    g = HybridFilter.from_config(f.config(), ORDERS)
    assert g.config() == f.config() and g.steps_a == f.steps_a == f.config()["steps_a"]
    g.load_state(f.state())
    assert g.state() == f.state() and (g.a_count, g.a_alive) == (100, False)
    import json
    assert json.loads(json.dumps(f.state())) == f.state()
    assert json.loads(json.dumps(f.config())) == f.config()
    assert "hybrid" in f.describe() and f.headroom(ledger.spent).shape == ORDERS.shape


def test_inflated_or_corrupt_state_fails_closed():
    step = M.SubsampledGaussian(1.0, 0.01)
    f = make(EPS, DELTA, step)
    cfg = dict(f.config(), steps_a=f.steps_a + 1)
    with pytest.raises(LedgerStateError):
        HybridFilter.from_config(cfg, ORDERS)
    with pytest.raises(LedgerStateError):
        HybridFilter.from_config(dict(f.config(), kind="dp"), ORDERS)
    for bad in [{"a_count": f.steps_a + 1, "a_alive": True, "weights": None},
                {"a_count": -1, "a_alive": True, "weights": None},
                {"a_count": 3, "a_alive": 1, "weights": None},
                {"a_count": 3, "a_alive": True, "weights": [2.0] * ORDERS.size},
                {"a_count": 3, "a_alive": True},
                "nope"]:
        with pytest.raises(LedgerStateError):
            f.load_state(bad)
    assert (f.a_count, f.a_alive) == (0, True)  # nothing loaded
    with pytest.raises(LedgerStateError):
        f.apply(HybridState(f.steps_a + 1, True))
    f.apply(HybridState(5, False))
    for backwards in (HybridState(4, False), HybridState(5, True)):
        with pytest.raises(LedgerStateError):
            f.apply(backwards)
    unfixed = HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), ORDERS, Concentrated())
    with pytest.raises(LedgerStateError):
        unfixed.decide(np.zeros(ORDERS.size), step, 1)
    with pytest.raises(LedgerStateError):
        f.decide(np.zeros(3), step, 1)


def test_defaults_and_explicit_parameters():
    f = HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), ORDERS, Uniform())
    assert f.delta_a == pytest.approx(0.99 * DELTA) and f.delta_a + f.delta_b <= DELTA
    assert f.weights is not None  # Uniform needs no plan: fixed at once
    g = HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), ORDERS, Uniform(), delta_a=0.5 * DELTA,
                     steps_a=1000)
    assert g.steps_a == 1000 and g.delta_b == pytest.approx(0.5 * DELTA)
    assert HybridFilter(EPS, DELTA, Envelope(1.0, 1.0), ORDERS, Uniform()).steps_a == 0


@pytest.mark.parametrize("call,name", [
    (lambda: Envelope(0.0, 0.01), "noise_multiplier"),
    (lambda: Envelope(-1.0, 0.01), "noise_multiplier"),
    (lambda: Envelope(1.0, 0.0), "sample_rate"),
    (lambda: Envelope(1.0, 1.5), "sample_rate"),
    (lambda: envelope_steps(Envelope(1.0, 0.01), 0.0, 1e-5), "epsilon"),
    (lambda: envelope_steps(Envelope(1.0, 0.01), 3.0, 1.0), "delta_a"),
    (lambda: envelope_steps((1.0, 0.01), 3.0, 1e-5), "envelope"),
    (lambda: HybridFilter(0.0, DELTA, Envelope(1.0, 0.01), ORDERS, Uniform()), "epsilon"),
    (lambda: HybridFilter(EPS, 1.0, Envelope(1.0, 0.01), ORDERS, Uniform()), "delta"),
    (lambda: HybridFilter(EPS, 0.0, Envelope(1.0, 0.01), ORDERS, Uniform()), "delta"),
    (lambda: HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), ORDERS, Uniform(), delta_a=DELTA),
     "delta_a"),
    (lambda: HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), ORDERS, Uniform(), delta_a=0.0),
     "delta_a"),
    (lambda: HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), ORDERS, Uniform(), delta_a=2e-5),
     "delta_a"),
    (lambda: HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), ORDERS, Uniform(), steps_a=10**6),
     "steps_a"),
    (lambda: HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), ORDERS, Uniform(), steps_a=-1),
     "steps_a"),
    (lambda: HybridFilter(EPS, DELTA, M.Gaussian(1.0), ORDERS, Uniform()), "envelope"),
    (lambda: HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), ORDERS, "uniform"), "shares"),
    (lambda: HybridFilter(EPS, DELTA, Envelope(1.0, 0.01), [0.5], Uniform()), "orders"),
    (lambda: envelope_of("SubsampledGaussian(1, 0.01)"), "step"),
    (lambda: envelope_steps_in(None, Envelope(1.0, 0.01)), "mechanism"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert info.value.argument == name


def test_bad_charge_changes_nothing():
    step = M.SubsampledGaussian(1.0, 0.01)
    f = make(EPS, DELTA, step)
    for bad in [("not a mechanism", 1), (step, 0), (step, 1.5)]:
        with pytest.raises(InvalidArgumentError):
            f.decide(np.zeros(ORDERS.size), *bad)
    assert (f.a_count, f.a_alive) == (0, True)


def test_dp_accounting_is_imported_only_when_T_A_is_computed():
    import subprocess
    import sys

    probe = ("import sys, privguard._accounting._hybrid as H; a = 'dp_accounting' in sys.modules; "
             "H.envelope_steps(H.Envelope(5.0, 1.0), 1.0, 0.01); "
             "print(a, 'dp_accounting' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
