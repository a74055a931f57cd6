"""How many DP-SGD steps each δ-sharing rule admits, against Opacus' accountant.

Run: python benchmarks/filter_efficiency.py
Prints, for a typical DP-SGD step (σ=1.1, q=0.004 — 256 of 60,000 — and
σ=1.0, q=0.01) at (ε=3, δ=1e-5) on the default 157-order grid, the steps
admitted by: all of δ on the best order (= what Opacus' RDPAccountant
allows on the same grid), the default Concentrated(0.9), and Uniform().
"""

from __future__ import annotations

from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from privguard import DEFAULT_ORDERS, Concentrated, Ledger, Uniform
from privguard import mechanisms as M


def opacus_max_steps(sigma: float, q: float, eps: float, delta: float) -> int:
    """Largest T with Opacus' ε(T) ≤ eps on the default grid (bisection)."""
    orders = list(DEFAULT_ORDERS)
    one = compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)
    ok = lambda t: get_privacy_spent(orders=orders, rdp=one * t, delta=delta)[0] <= eps  # noqa: E731
    lo, hi = 0, 1
    while ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def admitted(ledger: Ledger, step) -> int:
    return int(ledger.remaining(step).repeats)


def main() -> None:
    eps, delta = 3.0, 1e-5
    print(f"(ε={eps}, δ={delta}), {len(DEFAULT_ORDERS)}-order default grid")
    for sigma, q in [(1.1, 256 / 60000), (1.0, 0.01)]:
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


if __name__ == "__main__":
    main()
