"""How many DP-SGD steps each filter admits, against Opacus' accountants.

Run: python benchmarks/filter_efficiency.py
Prints, for a typical DP-SGD step (σ=1.1, q=0.004 — 256 of 60,000 — and
σ=1.0, q=0.01) at (ε=3, δ=1e-5) on the default 157-order grid:

1. the RDP filter's δ-sharing rules (docs/theory.md §2): all of δ on the best
   order (= what Opacus' RDPAccountant allows on the same grid), the default
   Concentrated(0.9), and Uniform();
2. the hybrid filter (docs/theory.md §2b, issue 16) on plan, against
   non-adaptive accounting: Opacus' PRV accountant (its default), dp-accounting's
   pessimistic PLD, non-adaptive RDP (Opacus' RDPAccountant) and today's RDP
   filter (default shares); with its T_A, the total it admits, and both as %
   of PRV and of RDP, and what its fallback (part B) alone would admit. The
   non-adaptive rows are not valid under adaptivity; the filter rows are;
3. how the hybrid's split δ = δ_A + δ_B trades steps on plan (T_A) against
   what the fallback alone admits (a run that leaves the envelope at once).
"""

from __future__ import annotations

import time

import numpy as np
from opacus.accountants import PRVAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from privguard import DEFAULT_ORDERS, Concentrated, Ledger, Plan, Uniform
from privguard import mechanisms as M
from privguard._accounting import _hybrid as H
from privguard._accounting._hybrid import HybridFilter, envelope_of


def largest(ok, start: int = 1) -> int:
    """Largest T ≥ 0 with ok(T), for ok monotone (galloping, then bisection)."""
    if not ok(start):
        lo, hi = 0, start
    else:
        lo, hi = start, 2 * start
        while ok(hi):
            lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def opacus_max_steps(sigma: float, q: float, eps: float, delta: float) -> int:
    """Largest T with Opacus' RDP ε(T) ≤ eps on the default grid."""
    orders = list(DEFAULT_ORDERS)
    one = compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)
    return largest(lambda t: get_privacy_spent(orders=orders, rdp=one * t, delta=delta)[0] <= eps,
                   1000)


def prv_max_steps(sigma: float, q: float, eps: float, delta: float) -> int:
    """Largest T with Opacus' PRV accountant (its default; eps_error 0.01) at ε(T) ≤ eps."""
    acc = PRVAccountant()

    def ok(t: int) -> bool:
        acc.history = [(sigma, q, t)]
        return acc.get_epsilon(delta) <= eps

    return largest(ok, 1000)


def pld_max_steps(sigma: float, q: float, eps: float, delta: float) -> int:
    """Largest T with dp-accounting's pessimistic PLD δ(ε) ≤ delta (no margin)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pld = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q)
    return largest(lambda t: pld.self_compose(t).get_delta_for_epsilon(eps) <= delta, 1000)


def admitted(ledger: Ledger, step, cap: int | None = None) -> int:
    n = int(ledger.remaining(step).repeats)
    return n if cap is None else min(n, cap)


def hybrid_on_plan(step, eps: float, delta: float) -> tuple[HybridFilter, int, float]:
    """The hybrid filter for ``step`` as plan, and how many plan steps it admits in a row.

    Counted with decide(times=k), which is the same decision as k single
    charges (tests/test_hybrid.py::test_k_charges_at_once_equal_k_single_charges).
    """
    orders = np.array(DEFAULT_ORDERS)
    start = time.process_time()
    f = HybridFilter(eps, delta, envelope_of(step), orders, Concentrated())
    seconds = time.process_time() - start
    curve = step._rdp_checked(orders)
    f.fix(curve)
    total = largest(lambda k: f.decide(k * curve, step, k)[0], max(1, f.steps_a))
    return f, total, seconds


def print_error_terms(f: HybridFilter, step, eps: float) -> None:
    """The numbers behind T_A (docs/theory.md §2b, "Certifying T_A")."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    env, t = f.envelope, f.steps_a
    composed = H._one_step_pld(env).self_compose(t, tail_mass_truncation=H.TAIL_MASS)
    plain = float(composed.get_delta_for_epsilon(eps))
    allowance = H.ROUNDOFF_FACTOR * H._negative_mass(composed)
    finer = pld_lib.from_gaussian_mechanism(
        env.noise_multiplier, sampling_prob=env.sample_rate,
        value_discretization_interval=H.DISCRETISATION / 5).self_compose(t)
    acc = PRVAccountant()
    acc.history = [(env.noise_multiplier, env.sample_rate, t)]
    print(f"  at T_A: PLD δ = {plain:.5e} (interval {H.DISCRETISATION:g}); "
          f"{float(finer.get_delta_for_epsilon(eps)):.5e} (interval {H.DISCRETISATION / 5:g})")
    print(f"          round-off allowance {allowance:.1e}; target δ_A(1 − {H.MARGIN:g}) = "
          f"{f.delta_a * (1 - H.MARGIN):.5e}; PRV ε(T_A, δ_A) = {acc.get_epsilon(f.delta_a):.4f}"
          " (an upper estimate, eps_error 0.01)")


def main() -> None:
    eps, delta = 3.0, 1e-5
    cases = [(1.1, 256 / 60000), (1.0, 0.01)]
    print(f"(ε={eps}, δ={delta}), {len(DEFAULT_ORDERS)}-order default grid")
    print("\n1. RDP filter, δ-sharing rules")
    for sigma, q in cases:
        step = M.SubsampledGaussian(sigma, q)
        t_opacus = opacus_max_steps(sigma, q, eps, delta)
        rows = {
            "Concentrated(0.9) (default)": Ledger(eps, delta, plan=step),
            "Uniform()": Ledger(eps, delta, shares=Uniform()),
            "Concentrated(1.0) (all δ on the plan's best order)":
                Ledger(eps, delta, plan=step, shares=Concentrated(1.0)),
        }
        print(f"σ={sigma}, q={q:.5f}: Opacus RDPAccountant allows T = {t_opacus}")
        for name, ledger in rows.items():
            t = admitted(ledger, step)
            print(f"  {name:52s} admits {t:6d} = {t / t_opacus:6.1%}")

    print("\n2. Hybrid filter on plan (δ_A = 0.99δ, the default) against non-adaptive accounting")
    for sigma, q in cases:
        step = M.SubsampledGaussian(sigma, q)
        prv = prv_max_steps(sigma, q, eps, delta)
        pld = pld_max_steps(sigma, q, eps, delta)
        rdp = opacus_max_steps(sigma, q, eps, delta)
        today = admitted(Ledger(eps, delta, plan=step), step)
        f, total, seconds = hybrid_on_plan(step, eps, delta)
        curve = step._rdp_checked(f.orders)
        fallback = largest(lambda k: f.fallback.admits(k * curve, f.weights), 1000)
        print(f"σ={sigma}, q={q:.5f}:")
        rows = [("Opacus PRV (non-adaptive, Opacus' default)", prv),
                ("dp-accounting PLD, pessimistic (non-adaptive)", pld),
                ("RDP, Opacus RDPAccountant (non-adaptive)", rdp),
                ("RDP filter, Concentrated(0.9) (today's default)", today),
                (f"hybrid filter: T_A (PLD at δ_A={f.delta_a:g})", f.steps_a),
                ("hybrid filter: total admitted on plan", total),
                (f"  its fallback B alone (RDP filter at δ_B={f.delta_b:g})", fallback)]
        for name, t in rows:
            print(f"  {name:50s} {t:6d}  {t / prv:6.1%} of PRV  {t / rdp:6.1%} of RDP")
        print(f"  (T_A computed in {seconds:.2f} s CPU at filter construction)")
        print_error_terms(f, step, eps)

    print("\n3. The hybrid filter's split of δ: on plan (T_A) against the fallback alone")
    for sigma, q in cases:
        step = M.SubsampledGaussian(sigma, q)
        curve = step._rdp_checked(np.array(DEFAULT_ORDERS))
        prv = prv_max_steps(sigma, q, eps, delta)
        rdp = opacus_max_steps(sigma, q, eps, delta)
        print(f"σ={sigma}, q={q:.5f} (PRV {prv}, RDP {rdp}):")
        for share in (0.5, 0.8, 0.9, 0.95, 0.99):
            f = HybridFilter(eps, delta, envelope_of(step), np.array(DEFAULT_ORDERS),
                             Concentrated(), delta_a=share * delta)
            f.fix(curve)
            b = largest(lambda k, f=f: f.fallback.admits(k * curve, f.weights), 1000)
            print(f"  δ_A = {share:4.2f}δ: T_A = {f.steps_a:6d} ({f.steps_a / prv:6.1%} of PRV), "
                  f"fallback alone {b:6d} ({b / rdp:6.1%} of RDP)")

    print("\n4. Opacus' make_private_with_epsilon (PRV calibration) with a ledger at the same")
    print("   target and the plan: planned steps admitted by each filter")
    from opacus.accountants.utils import get_noise_multiplier

    for q, steps, target in ((256 / 60000, 64, 3.0), (0.01, 64, 3.0), (1 / 16, 32, 4.0),
                             (0.01, 2000, 3.0), (256 / 60000, 14000, 3.0)):
        sigma = get_noise_multiplier(target_epsilon=target, target_delta=delta, sample_rate=q,
                                     steps=steps, accountant="prv")
        step = M.SubsampledGaussian(sigma, q)
        plan = Plan(step, steps)
        counts = {name: admitted(Ledger(target, delta, plan=plan, filter=kind), step, steps)
                  for name, kind in (("rdp", "rdp"), ("hybrid", "hybrid"))}
        f09 = HybridFilter(target, delta, envelope_of(step), np.array(DEFAULT_ORDERS),
                           Concentrated(), delta_a=0.9 * delta)
        print(f"  q={q:.5f}, {steps} steps, ε={target:g} (PRV σ={sigma:.4f}): "
              f"rdp {counts['rdp']} ({counts['rdp'] / steps:.1%}), "
              f"hybrid {counts['hybrid']} ({counts['hybrid'] / steps:.1%}); "
              f"with δ_A = 0.9δ it would be {min(f09.steps_a, steps)} "
              f"({min(f09.steps_a, steps) / steps:.1%})")


if __name__ == "__main__":
    main()
