"""Monte-Carlo simulation of an adaptive adversary against Gaussian mechanisms.

For sensitivity 1 and noise σ, one Gaussian output has privacy loss
N(ρ, 2ρ) under the first dataset, with ρ = 1/(2σ²) (its RDP curve is ρα).
The adversary picks each ρ from its realised loss so far (an adaptive choice
of σ), and stops when it likes. Everything the ledger reports for a run of
Gaussians is a function of R = Σρ (the spent curve is R·α), so we evaluate
the real privguard code once on a fine grid of R and look values up.
"""

from __future__ import annotations

import numpy as np

from privguard import Ledger, Odometer
from privguard import _conversion as conv
from privguard import mechanisms as M


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


def odometer_curve(mode: str, delta: float, grid: np.ndarray) -> np.ndarray:
    """The real ledger's running ε after a Gaussian run of total ρ = R, for each R in grid."""
    ledger = Ledger(delta=delta, odometer=mode)
    spent = grid[:, None] * ledger.orders[None, :]
    return Odometer(ledger.orders, mode).epsilon_batch(spent, delta)


def naive_curve(delta: float, grid: np.ndarray) -> np.ndarray:
    """The improved conversion of the spent curve R·α (NOT a running guarantee)."""
    ledger = Ledger(delta=delta)
    spent = grid[:, None] * ledger.orders[None, :]
    eps = conv.epsilon_per_order(ledger.orders, spent, delta)
    return np.maximum(eps.min(axis=1), 0.0)


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
    losses.
    """
    rng = np.random.default_rng(seed)
    L = np.zeros(n)
    R = np.zeros(n)
    done = np.zeros(n, dtype=bool)
    while not done.all():
        a = ~done
        step = np.minimum(rho * np.where(L[a] > R[a], 4.0, 0.5), cap - R[a])
        L[a] += step + np.sqrt(2 * step) * rng.standard_normal(a.sum())
        R[a] += step
        done[a] = (L[a] > eps_target) | (R[a] >= cap * (1 - 1e-12))
    return L


def run_stopping_adversary(threshold, n: int, steps: int, rho0: float, growth: float,
                           seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Adversary that adapts ρ to its luck and stops at the first L > threshold(R).

    Each step it proposes ρ_t = rho0·growth^t, quadrupled when its loss runs
    ahead of its mean (L > R, a push while lucky) and halved otherwise. Over
    the horizon R grows by about growth^steps. Returns (crossed, L, R).
    """
    rng = np.random.default_rng(seed)
    L = np.zeros(n)
    R = np.zeros(n)
    crossed = np.zeros(n, dtype=bool)
    for t in range(steps):
        active = ~crossed
        if not active.any():
            break
        rho = rho0 * growth**t * np.where(L[active] > R[active], 4.0, 0.5)
        L[active] += rho + np.sqrt(2 * rho) * rng.standard_normal(active.sum())
        R[active] += rho
        crossed[active] = L[active] > threshold(R[active])
    return crossed, L, R
