"""Monte-Carlo simulation of an adaptive adversary against Gaussian mechanisms.

For sensitivity 1 and noise σ, one Gaussian output has privacy loss
N(ρ, 2ρ) under the first dataset, with ρ = 1/(2σ²) (its RDP curve is ρα).
The adversary picks each ρ from its realised loss so far (an adaptive choice
of σ), and stops when it likes. Everything an odometer reports for a run of
Gaussians is a function of R = Σρ (the spent curve is R·α), so we evaluate
the real privguard code once on a fine geometric grid of R and look values
up: at the grid point just below R for a bound we claim is valid (the
adversary then crosses at least as often as against the exact value) and
just above R for one we claim is NOT valid (it crosses at most as often).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from privguard import DEFAULT_ORDERS, Ledger, Plan
from privguard import mechanisms as M
from privguard._accounting._odometer import Odometer, _mixture_epsilon, mixture_weights
from privguard._curves import _conversion as conv

# The odometer experiment (issue 15 item 5): δ = 0.01, 200,000 runs of 1,000
# adaptive steps; the spent ρ grows at least 1,000× over every run that
# does not stop. The plan the "mixture, plan" odometer declares: 1,000 steps
# of ρ0, read every 10 steps (the adversary reads after EVERY step).
DELTA, RUNS, STEPS, RHO0, PLAN_EVERY = 1e-2, 200_000, 1_000, 0.01, 10
STRATEGIES = ("plan", "ahead", "aim")
VALID = ("mixture, plan", "mixture, no plan", "mixture, uniform", "paper", "tight")
INVALID = ("naive conversion", "improved conversion in the mixture")
# the adaptive strategies choose ρ in [ρ0/2, 8ρ0] and start at ρ0/2
RHO_LO, RHO_HI = RHO0 / 2, 8 * RHO0


def r_grid(lo: float, hi: float, ratio: float = 1.0005) -> np.ndarray:
    return np.exp(np.arange(np.log(lo), np.log(hi) + np.log(ratio), np.log(ratio)))


def lookup_lower(grid: np.ndarray, values: np.ndarray, r: np.ndarray) -> np.ndarray:
    """values at the largest grid point <= r (a lower bound for non-decreasing values)."""
    idx = np.searchsorted(grid, r, side="right") - 1
    return np.where(idx >= 0, values[np.clip(idx, 0, None)], -np.inf)


def lookup_upper(grid: np.ndarray, values: np.ndarray, r: np.ndarray) -> np.ndarray:
    """values at the smallest grid point >= r (an upper bound for non-decreasing values)."""
    idx = np.searchsorted(grid, r, side="left")
    return np.where(idx < grid.size, values[np.clip(idx, None, grid.size - 1)], np.inf)


@dataclasses.dataclass(frozen=True)
class Bound:
    """A running ε as a function of R on a geometric grid; ``valid`` picks the lookup side."""

    grid: np.ndarray
    values: np.ndarray
    valid: bool

    def __post_init__(self) -> None:
        assert np.all(np.diff(self.values) >= 0), "a running ε must not decrease as R grows"

    def slopes(self, h: int = 8) -> np.ndarray:
        """dε/dR at each grid point by a difference over ±h points (the "aim" adversary's estimate)."""
        i = np.clip(np.arange(self.grid.size), h, self.grid.size - 1 - h)
        return (self.values[i + h] - self.values[i - h]) / (self.grid[i + h] - self.grid[i - h])


def lower_index(grid: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Index of the largest point of the geometric ``grid`` that is <= r (grid[0] <= r < grid[-1])."""
    log_ratio = math.log(grid[1] / grid[0])
    i = np.clip(np.floor(np.log(r / grid[0]) / log_ratio).astype(np.int64), 0, grid.size - 2)
    i -= grid[i] > r  # fix the rounding of the formula
    i += grid[i + 1] <= r
    return i


def improved_in_mixture_curve(orders: np.ndarray, weights: np.ndarray, delta: float,
                              grid: np.ndarray) -> np.ndarray:
    """KNOWN WRONG: the mixture solved with the improved conversion at each order.

    Per order the improved conversion (formulas.md §1) is
    S(α) + (log(1/(w_α δ)) − log α)/(α−1) + log((α−1)/α), i.e. the classic
    term with w_α replaced by w_α·α·(α/(α−1))^(α−1) > w_α: the real
    solver, fed those inflated weights (total mass > 1). Not a tail bound.
    """
    with np.errstate(divide="ignore"):
        log_w = np.log(weights) + np.log(orders) + (orders - 1) * np.log(orders / (orders - 1))
    return _mixture_epsilon(grid[:, None] * orders[None, :], log_w, orders - 1.0, delta)


def naive_curve(delta: float, grid: np.ndarray, orders: np.ndarray | None = None) -> np.ndarray:
    """The improved conversion of the spent curve R·α (NOT a running guarantee)."""
    orders = np.array(DEFAULT_ORDERS) if orders is None else orders
    eps = conv.epsilon_per_order(orders, grid[:, None] * orders[None, :], delta)
    return np.maximum(eps.min(axis=1), 0.0)


def odometer_bounds(delta: float = DELTA, ratio: float = 1.001) -> dict[str, Bound]:
    """Every construction of the experiment, evaluated by the real code on a grid of R."""
    orders = np.array(DEFAULT_ORDERS)
    grid = r_grid(RHO_LO / 5, RHO_HI * STEPS * 1.25, ratio)
    spent = grid[:, None] * orders[None, :]
    step = M.ZCDP(rho=RHO0)
    w_plan = mixture_weights(orders, Plan(step, steps=STEPS, every=PLAN_EVERY), delta)
    weights = {"mixture, plan": w_plan,
               "mixture, no plan": mixture_weights(orders, Plan(step), delta),
               "mixture, uniform": mixture_weights(orders, None, delta)}
    out = {name: Bound(grid, Odometer(orders, "mixture", weights=w).epsilon_batch(spent, delta), True)
           for name, w in weights.items()}
    for mode in ("paper", "tight"):
        out[mode] = Bound(grid, Odometer(orders, mode).epsilon_batch(spent, delta), True)
    out["naive conversion"] = Bound(grid, naive_curve(delta, grid, orders), False)
    out["improved conversion in the mixture"] = Bound(
        grid, improved_in_mixture_curve(orders, w_plan, delta, grid), False)
    return out


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Fraction of runs whose loss ever exceeded each bound, and the spend's growth."""

    crossed: dict[str, float]
    runs: int
    growth: float  # min over runs that never crossed of R_final / R_after_first_step


def run_adversary(strategy: str, bounds: dict[str, Bound], seed: int, runs: int = RUNS,
                  steps: int = STEPS) -> Outcome:
    """An adaptive adversary that stops at its first loss above the running ε.

    Strategies: ``"plan"`` — ρ0 every step, as planned; ``"ahead"`` — 8ρ0
    when its loss is above its mean (L > R, a push while lucky), ρ0/2
    otherwise; ``"aim"`` — each step aimed at the boundary: with gap
    g = ε(R) − L and k = dε/dR − 1 (the boundary outruns the mean by k per
    unit of ρ), the one-step crossing probability P(√(2ρ)Z > g + kρ) is
    largest at ρ = g/k; it takes that, clipped to [ρ0/2, 8ρ0] (8ρ0 where the
    boundary is flat), starting at ρ0/2. "aim" depends on the bound, so it
    plays against exactly one.

    The bound is read after every step. A run that crossed is stopped:
    continuing its path cannot change whether it crossed, so the simulation
    keeps all runs in the arrays and only ORs the crossings (the same
    outcome, without gathers).
    """
    if strategy not in STRATEGIES:
        raise ValueError(strategy)
    if strategy == "aim" and len(bounds) != 1:
        raise ValueError("the aim strategy plays against one bound at a time")
    grid = next(iter(bounds.values())).grid
    assert grid[0] <= RHO_LO and grid[-1] > steps * RHO_HI, "the grid must cover every R"
    names = list(bounds)
    values = np.stack([bounds[k].values for k in names])
    upper = np.array([not bounds[k].valid for k in names])[:, None]
    floor = values.min(axis=0)  # <= every bound at the lower index, so at the index used
    if strategy == "aim":  # its step rule, tabulated on the grid: ρ = clip(gap·inv_k + flat)
        k = bounds[names[0]].slopes() - 1.0
        inv_k = np.where(k > 0, 1.0 / np.where(k > 0, k, 1.0), 0.0)
        flat = np.where(k > 0, 0.0, np.inf)
    rng = np.random.default_rng(seed)
    L = np.zeros(runs)
    R = np.zeros(runs)
    i = np.zeros(runs, dtype=np.int64)
    crossed = np.zeros((len(names), runs), dtype=bool)
    first = None
    for t in range(steps):
        if strategy == "plan":
            rho = RHO0
        elif strategy == "ahead":
            rho = np.where(L > R, RHO_HI, RHO_LO)
        elif t == 0:
            rho = RHO_LO
        else:
            rho = np.clip((values[0, i] - L) * inv_k[i] + flat[i], RHO_LO, RHO_HI)
        L += rho + np.sqrt(2 * rho) * rng.standard_normal(runs, dtype=np.float32)
        R += rho
        if first is None:
            first = R.copy()
        if strategy == "plan":  # R is the same in every run: one threshold per bound
            j = int(lower_index(grid, R[:1])[0])
            up = j + (grid[j] < R[0])
            crossed |= L[None, :] > np.where(upper[:, 0], values[:, up], values[:, j])[:, None]
            continue
        i = lower_index(grid, R)
        near = np.flatnonzero(L > floor[i])  # the only runs that can be above any bound
        if near.size:
            ii = i[near]
            thresholds = np.where(upper, values[:, ii + (grid[ii] < R[near])], values[:, ii])
            crossed[:, near] |= L[near][None, :] > thresholds
    never = ~crossed.any(axis=0)
    growth = float(np.min(R[never] / first[never])) if never.any() else math.nan
    return Outcome({k: float(c.mean()) for k, c in zip(names, crossed)}, runs, growth)


def binomial_tolerance(p: float, n: int, z: float = 4.0) -> float:
    """z standard errors of a binomial proportion p over n runs."""
    return z * math.sqrt(p * (1 - p) / n)


def filter_rho_cap(ledger: Ledger) -> float:
    """Largest total ρ a fresh filter admits in one Gaussian charge (bisection on can_afford)."""
    lo, hi = 0.0, 1.0
    while ledger.can_afford(M.ZCDP(rho=hi)):
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ledger.can_afford(M.ZCDP(rho=mid)) else (lo, mid)
    return lo


def run_filter_adversary(cap: float, eps_target: float, n: int, rho: float, seed: int
                         ) -> np.ndarray:
    """Adaptive adversary under a filter that caps Σρ at ``cap``.

    It quadruples its step while its loss runs ahead of the mean, halves it
    otherwise, is refused any step past the cap (it then takes exactly what
    is left), and stops at the first moment L > eps_target. Returns the final
    losses. Finished runs are dropped from the working arrays (in order, so
    the random draws are exactly those of a full-array mask).
    """
    rng = np.random.default_rng(seed)
    out = np.zeros(n)
    idx = np.arange(n)
    L = np.zeros(n)
    R = np.zeros(n)
    while idx.size:
        step = np.minimum(rho * np.where(L > R, 4.0, 0.5), cap - R)
        L += step + np.sqrt(2 * step) * rng.standard_normal(idx.size)
        R += step
        done = (L > eps_target) | (R >= cap * (1 - 1e-12))
        if done.any():
            out[idx[done]] = L[done]
            keep = ~done
            idx, L, R = idx[keep], L[keep], R[keep]
    return out
