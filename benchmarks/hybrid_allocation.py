"""Numbers for docs/theory.md §2b.2: random allocation and the hybrid filter.

Run: ``python benchmarks/hybrid_allocation.py``. For each plan
``RandomAllocation(σ, t)`` and target (ε, δ = 1e-5), prints the epochs admitted
on plan by the RDP filter (a real ledger, ``filter="rdp"``, the default);
T_A of the one sound envelope privguard can certify today, the Gaussian cap
(every epoch is dominated by N(1, σ²) against N(0, σ²), §2b.2 (b); part A at
δ_A = 0.99δ, as ``filter="hybrid"`` would run it); and, as a reference that
is NOT a bound for random allocation (§2b.2 (a)), dp-accounting's pessimistic
PLD count of Poisson steps at q = 1/t, in epochs of t steps at the full δ.
The hybrid filter is refused for these plans (no certified PLD of the
epoch's pair); the second column is what building the Gaussian-cap envelope
would have given.
"""

from __future__ import annotations

from privguard import Ledger, Plan
from privguard import mechanisms as M
from privguard._accounting._hybrid import DEFAULT_SHARE_A, Envelope, envelope_steps

DELTA = 1e-5
CASES = [(1.0, 2, 8.0), (5.0, 2, 1.0), (5.0, 2, 3.0), (1.0, 3, 4.0), (1.0, 10, 8.0),
         (1.0, 100, 3.0), (2.0, 100, 1.0), (1.0, 1000, 2.0)]


def main() -> None:
    print("sigma t eps | RDP filter (epochs) | Gaussian-cap envelope T_A | "
          "Poisson q=1/t PLD, epochs (reference, not a bound)")
    for sigma, t, eps in CASES:
        step = M.RandomAllocation(sigma, t)
        n_rdp = Ledger(eps, DELTA, plan=Plan(step, 1)).remaining(step).repeats
        cap = envelope_steps(Envelope(sigma, 1.0), eps, DEFAULT_SHARE_A * DELTA)
        poisson = envelope_steps(Envelope(sigma, 1.0 / t), eps, DELTA) / t
        print(f"{sigma:g} {t} {eps:g} | {n_rdp} | {cap} | {poisson:.1f}")


if __name__ == "__main__":
    main()
