"""Monte-Carlo of the hybrid filter on exact Gaussian losses (q = 1, issue 16).

The envelope is Gaussian(σ₀). Every step is a Gaussian with ρ = 1/(2σ²); its
privacy loss under the first dataset is N(ρ, 2ρ), so the realised loss L of
the whole adaptive interaction is the sum over admitted steps, and the
hockey-stick E[(1 − e^(ε − L))₊] is exactly the δ(ε) of the interaction.

Part B's decision on a Gaussian-only run is a function of R = Σρ (its spent
curve is R·α): we find the largest R the real DPFilter admits by bisection
on ``DPFilter.admits`` and compare. Part A and the combination are the real
``privguard._accounting._hybrid.admission_rule``, vectorised over runs; the wrong variants
below change exactly one thing each.
"""

from __future__ import annotations

import math

import numpy as np

from privguard._accounting._hybrid import HybridFilter, admission_rule

INSIDE, OUTSIDE = 0, 1


def b_cap(hybrid: HybridFilter) -> float:
    """Largest Σρ part B of ``hybrid`` admits for a Gaussian-only run (bisection)."""
    f, w, orders = hybrid.fallback, hybrid.fallback.weights, hybrid.orders
    lo, hi = 0.0, 1.0
    while f.admits(hi * orders, w):
        lo, hi = hi, 2 * hi
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f.admits(mid * orders, w) else (lo, mid)
    return lo


class Variant:
    """The hybrid rule, or a deliberately wrong one.

    ``kill``: an admitted charge without A kills A (C1). ``charge_b_always``:
    part B is charged for every admitted step (C2); otherwise only for the
    steps A did not admit (B charged only after A dies). ``steps_a``: T_A.
    """

    def __init__(self, steps_a: int, cap: float, *, kill: bool = True,
                 charge_b_always: bool = True) -> None:
        self.steps_a, self.cap, self.kill, self.charge_b_always = steps_a, cap, kill, charge_b_always

    def step(self, st: dict, inside: np.ndarray, rho: np.ndarray) -> np.ndarray:
        """Decide one proposal per run in ``st`` (arrays), update ``st``, return admitted."""
        b_ok = st["RB"] + rho <= self.cap
        admitted, alive, count = admission_rule(st["alive"], st["count"],
                                                np.where(inside, 1, -1), b_ok, self.steps_a)
        a_ok = count != st["count"]  # A admitted (each inside charge is one step here)
        if not self.kill:
            alive = st["alive"]
        st["alive"], st["count"] = alive, count
        st["R"] = st["R"] + np.where(admitted, rho, 0.0)
        b_charged = admitted if self.charge_b_always else (admitted & ~a_ok)
        st["RB"] = st["RB"] + np.where(b_charged, rho, 0.0)
        return admitted


# ------------------------------------------------------------- adversaries
# policy(L, R, t, half, refused_in, refused_out) -> (kind, rho_multiplier)
# rho_multiplier scales ρ₀ = 1/(2σ₀²); inside steps use multipliers ≤ 1
# (σ ≥ σ₀), outside steps 4 (σ = σ₀/2). A run ends when both kinds it would
# still try have been refused.

def plan(L, R, t, half, rin, rout):
    return np.full(L.shape, INSIDE), np.ones(L.shape)


def adaptive_inside(L, R, t, half, rin, rout):
    # full envelope steps while lucky (loss ahead of its mean), half steps otherwise
    return np.full(L.shape, INSIDE), np.where(L > R, 1.0, 0.5)


def leave_and_return(L, R, t, half, rin, rout):
    # the plan until a lucky streak (L > R + √(2R)) after T_A/8 steps, or T_A/4 at
    # the latest (B must still be alive to leave); outside until refused; inside again
    lucky = (t >= half // 4) & (L > R + np.sqrt(2 * R))
    out = ((t >= half // 2) | lucky | (t > 0) & (R > 0) & rin) & ~rout
    return np.where(out, OUTSIDE, INSIDE), np.where(out, 4.0, 1.0)


def oscillate(L, R, t, half, rin, rout):
    # outside when lucky, inside otherwise; the other kind once one is refused
    out = np.where(rin, True, np.where(rout, False, L > R))
    return np.where(out, OUTSIDE, INSIDE), np.where(out, 4.0, 1.0)


def exhaust_then_leave(L, R, t, half, rin, rout):
    out = rin
    return np.where(out, OUTSIDE, INSIDE), np.where(out, 4.0, 1.0)


def outside_then_inside(L, R, t, half, rin, rout):
    out = ~rout
    return np.where(out, OUTSIDE, INSIDE), np.where(out, 4.0, 1.0)


ADVERSARIES = {
    "plan": plan,
    "adaptive-inside": adaptive_inside,
    "leave-and-return": leave_and_return,
    "oscillate": oscillate,
    "exhaust-then-leave": exhaust_then_leave,
    "outside-then-inside": outside_then_inside,
}
ONLY_INSIDE = {"plan", "adaptive-inside"}


def simulate(variant: Variant, policy, sigma0: float, n: int, seed: int,
             *, inside_only: bool = False, trace: bool = False):
    """Run ``n`` independent interactions; return the realised losses L (and a trace).

    The trace (small n only) lists, per run, the proposals (σ, admitted).
    """
    rng = np.random.default_rng(seed)
    rho0 = 1.0 / (2 * sigma0**2)
    st = {"alive": np.ones(n, dtype=bool), "count": np.zeros(n, dtype=np.int64),
          "R": np.zeros(n), "RB": np.zeros(n)}
    L = np.zeros(n)
    rin = np.zeros(n, dtype=bool)
    rout = np.zeros(n, dtype=bool) | inside_only
    t = np.zeros(n, dtype=np.int64)
    half = variant.steps_a // 2
    log: list[list[tuple[float, bool]]] = [[] for _ in range(n)] if trace else []
    limit = 10 * (variant.steps_a + variant.cap / rho0 + 10)
    for _ in range(int(limit)):
        active = np.flatnonzero(~(rin & rout))
        if active.size == 0:
            break
        sub = {k: v[active] for k, v in st.items()}
        kind, mult = policy(L[active], st["R"][active], t[active], half, rin[active], rout[active])
        mult = np.where(kind == INSIDE, np.minimum(mult, 1.0), mult)
        sigma = sigma0 / np.sqrt(mult)
        rho = 1.0 / (2 * sigma**2)  # as Gaussian(σ).rdp computes it
        admitted = variant.step(sub, kind == INSIDE, rho)
        for k in st:
            st[k][active] = sub[k]
        draws = rng.standard_normal(active.size)
        L[active] += np.where(admitted, rho + np.sqrt(2 * rho) * draws, 0.0)
        t[active] += admitted
        # A refused kind stays refused: A's answer to an inside step does not
        # depend on ρ, B's only grows stricter, and each kind has one largest ρ.
        refused = ~admitted
        rin[active] |= refused & (kind == INSIDE)
        rout[active] |= refused & (kind == OUTSIDE)
        if trace:
            for j, i in enumerate(active):
                log[i].append((float(sigma[j]), bool(admitted[j])))
    else:  # pragma: no cover - the bound above is generous
        raise AssertionError("simulation did not terminate")
    return (L, log) if trace else L


def hockey_stick(L: np.ndarray, eps: float) -> tuple[float, float]:
    """E[(1 − e^(ε − L))₊] and a 4-standard-error tolerance (CLT)."""
    x = np.maximum(0.0, -np.expm1(eps - L))
    return float(x.mean()), 4.0 * float(x.std(ddof=1)) / math.sqrt(x.size)


def report(n: int = 100_000) -> None:
    """Print the statistic for the hybrid and three wrong variants against every adversary.

    Run: python tests/_hybrid_mc.py  (the setting of tests/test_hybrid.py; docs/theory.md §2b)
    """
    from privguard import DEFAULT_ORDERS, Concentrated
    from privguard import mechanisms as M
    from privguard._accounting._hybrid import envelope_of

    eps, delta, sigma0 = 2.0, 0.02, 10.0
    step = M.Gaussian(sigma0)
    f = HybridFilter(eps, delta, envelope_of(step), np.array(DEFAULT_ORDERS), Concentrated())
    f.fix(step.rdp(DEFAULT_ORDERS))
    cap, t = b_cap(f), f.steps_a
    print(f"q0 = 1, σ0 = {sigma0}, ε = {eps}, δ = {delta}: T_A = {t}, "
          f"B alone affords Σρ = {cap:.4f} = {cap * 2 * sigma0**2:.1f} envelope steps; {n} runs")
    print("E[(1 - e^(ε-L))+] / δ  (± 4 standard errors)")
    variants = {"hybrid": Variant(t, cap),
                "C1 broken (no kill)": Variant(t, cap, kill=False),
                "C2 broken (B late)": Variant(t, cap, charge_b_always=False),
                "T_A + 15%": Variant(math.floor(1.15 * t), cap)}
    print(f"{'adversary':22s}" + "".join(f"{name:>26s}" for name in variants))
    for name, adversary in ADVERSARIES.items():
        cells = []
        for v in variants.values():
            L = simulate(v, adversary, sigma0, n, seed=5, inside_only=name in ONLY_INSIDE)
            hs, tol = hockey_stick(L, eps)
            cells.append(f"{hs / delta:8.3f} ± {tol / delta:.3f}" + (" FAIL" if hs > delta + tol
                                                                    else "     "))
        print(f"{name:22s}" + "".join(f"{c:>26s}" for c in cells))


if __name__ == "__main__":
    report()
