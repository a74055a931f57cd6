"""Prototype (not in the package): a PLD envelope for one epoch of random allocation.

Run: ``nice -n 10 python benchmarks/allocation_pld_prototype.py [--validate]``.

docs/theory.md §2b.2: one epoch of ``RandomAllocation(σ, t)`` (σ ≥ σ₀, same t,
any adaptivity) is dominated by P = (1/t) Σ_i N(e_i, σ²I_t) against
Q = N(0, σ²I_t) (Lemma 2b.2), and E epochs by (P^⊗E, Q^⊗E) and its swap.
With L = log dP/dQ, H_{e^ε}(P^⊗E‖Q^⊗E) = E_P[(1 − e^{ε − Σ_j L_j})₊] (L_j iid
under P) and H_{e^ε}(Q^⊗E‖P^⊗E) = E_Q[(1 − e^{ε + Σ_j L_j})₊] (the loss is −L
under Q). (1 − e^{ε − s})₊ is non-decreasing in s and the usual stochastic
order is kept by sums of independent terms, so ANY discrete loss that is
stochastically larger than the true one (per epoch, per direction) gives an
upper bound on both hockey-sticks after composition. This script builds such
a loss on a grid of width h with an infinite-loss atom:

* remove, under P (condition on x's step being 1, by symmetry):
  L = log((A + B)/t), A = exp(s²/2 + sZ₁), B = Σ_{i=2..t} W_i,
  W_i = exp(sZ_i − s²/2), s = 1/σ. W is rounded UP onto the lattice g
  (exact lattice PMF from the normal CDF; W > w_cap goes to +∞), the t − 1
  copies are convolved by FFT on a window [b_lo, b_hi) (mass outside the
  window bounded by Chernoff on the lattice PMF, sent to +∞; the FFT wraps
  only non-negative mass into the window), the sum is rounded UP again to
  the coarser lattice G, and P(A + B > x) is bounded at x = mG by one more
  convolution with the exact tail of A sampled at nG (n ≥ 1) — the tail at
  x ∈ [mG, (m+1)G) is at most the one at mG.
* add, under Q: −L = −log((1/t) Σ_{i=1..t} W_i); W rounded DOWN onto g
  (W > w_cap is set to w_cap, also a rounding down), t copies convolved as
  above; P(−L > a) = P(Σ W < t e^{−a}) ≤ P(Σ Ŵ < t e^{−a}) + mass below the
  window (Chernoff).
* from the tail bounds U(a_j) ≥ P(loss > a_j) at the grid a_j = j·h, made
  non-increasing by a running max from the right, the PMF puts
  U(a_j) − U(a_{j+1}) at a_{j+1}, 1 − U(a_lo) at a_lo and U(a_hi) at +∞: its
  tail at every x is ≥ the true tail at x.
* FFT round-off: ROUNDOFF_FACTOR × the negative mass of every FFT output is
  added to the tail (the same empirical allowance as §2b's T_A).

Composed with dp-accounting's DensePLDPmf (pessimistic; its self_compose
puts truncated upper-tail mass at +∞), δ = max over the two directions.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
from scipy import fft as sfft
from scipy import signal
from scipy.special import ndtr

ROUNDOFF_FACTOR = 10.0
OUT_MASS = 1e-11  # per-epoch budget for each piece of mass sent to +∞


def _lognormal_cdf_sf(w: np.ndarray, s: float, mu: float):
    """(P(W ≤ w), P(W > w)) for W = exp(sZ + mu), accurate in both tails."""
    with np.errstate(divide="ignore"):
        z = (np.log(w) - mu) / s
    return ndtr(z), ndtr(-z)


def lattice_pmf(s: float, mu: float, g: float, w_cap: float, up: bool, w_mid: float,
                coarse: int = 100):
    """Sparse PMF of W rounded onto the lattice g·k, W = exp(sZ + mu).

    Returns (k, mass, beyond). up=True: W ∈ (g(k−1), gk] → k for W ≤ w_mid; above
    w_mid the cells are (g(k−coarse), gk] (a coarser rounding UP, still onto
    the lattice); W > w_cap is sent to +∞ (``beyond``). up=False: W ∈ [gk,
    g(k+1)) → k below w_mid, [gk, g(k+coarse)) → k above (rounding DOWN), and
    W > w_cap is put at the last point (a rounding down), beyond = 0.
    """
    k_mid = math.ceil(w_mid / g)
    k_cap = k_mid + coarse * math.ceil((w_cap - k_mid * g) / (coarse * g))
    edges_k = np.concatenate([np.arange(0, k_mid, dtype=np.int64),
                              np.arange(k_mid, k_cap + 1, coarse, dtype=np.int64)])
    cdf, sf = _lognormal_cdf_sf(g * edges_k.astype(float), s, mu)
    # mass of each cell from whichever of cdf/sf is small there (no cancellation)
    mass = np.where(cdf[1:] < 0.5, cdf[1:] - cdf[:-1], sf[:-1] - sf[1:])
    mass = np.maximum(mass, 0.0)
    beyond = float(sf[-1])
    if up:  # cell (edges[i], edges[i+1]] → edges[i+1]
        return edges_k[1:], mass, beyond
    mass[-1] += beyond  # cell [edges[i], edges[i+1]) → edges[i]; the rest down to the last
    return edges_k[:-1], mass, 0.0


def _log_mgf(k: np.ndarray, pmf: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """log Σ_k pmf_k e^{lam·k} for each lam (k the lattice index)."""
    nz = pmf > 0
    lp = np.log(pmf[nz])
    kk = k[nz].astype(float)
    out = np.empty(len(lam))
    for i, la in enumerate(lam):
        v = lp + la * kk
        m = v.max()
        out[i] = m + math.log(np.exp(v - m).sum())
    return out


_LAMBDA = np.geomspace(1e-8, 5.0, 60)


def chernoff_upper(k, pmf, n, K, lm=None):
    """Bound on P(Σ_n ≥ K) (n iid copies of the sub-probability lattice PMF): Markov on e^{λΣ}."""
    lm = _log_mgf(k, pmf, _LAMBDA) if lm is None else lm
    return float(min(1.0, np.exp(np.min(n * lm - _LAMBDA * K))))


def chernoff_lower(k, pmf, n, K, lm=None):
    """Bound on P(Σ_n ≤ K): Markov on e^{−λΣ}."""
    lm = _log_mgf(k, pmf, -_LAMBDA) if lm is None else lm
    return float(min(1.0, np.exp(np.min(n * lm + _LAMBDA * K))))


def _window(k, pmf, n):
    """[K_lo, K_hi) with both outside masses ≤ OUT_MASS (Chernoff)."""
    kf = k.astype(float)
    m1 = float((pmf * kf).sum())
    mean = m1 * n
    sd = math.sqrt(max(float((pmf * kf * kf).sum()) - m1 * m1, 1e-30) * n)
    up, down = _log_mgf(k, pmf, _LAMBDA), _log_mgf(k, pmf, -_LAMBDA)
    hi = mean + 8 * sd
    while chernoff_upper(k, pmf, n, hi, up) > OUT_MASS:
        hi = mean + (hi - mean) * 1.25
    lo = mean - 8 * sd
    while lo > 0 and chernoff_lower(k, pmf, n, lo, down) > OUT_MASS:
        lo = mean - (mean - lo) * 1.25
    lo = max(0, math.floor(lo))
    hi = math.ceil(hi)
    out = (chernoff_lower(k, pmf, n, lo - 1, down) if lo > 0 else 0.0) + chernoff_upper(
        k, pmf, n, hi, up)
    return lo, hi, out


def sum_pmf(k, pmf, n: int):
    """n-fold convolution on a window: (K_lo, p̃ on K_lo.., mass outside, round-off allowance).

    p̃ ≥ the true PMF on the window up to round-off: the circular FFT folds
    mass from outside the window onto it (non-negative)."""
    if n == 1:
        dense = np.bincount(k, weights=pmf)
        return 0, dense, 0.0, 0.0
    lo, hi, out = _window(k, pmf, n)
    size = sfft.next_fast_len(hi - lo)
    folded = np.bincount(k % size, weights=pmf, minlength=size)
    res = sfft.irfft(sfft.rfft(folded) ** n, size)
    # index j holds Σ over K ≡ j (mod size); the window is [lo, lo+size)
    res = np.roll(res, -(lo % size))
    neg = float(-res[res < 0].sum())
    return lo, res, out, ROUNDOFF_FACTOR * neg


MAX_WINDOW = 12_000_000  # lattice points of a sum's window
MAX_TAIL = 2_000_000  # coarse points of the A-tail convolution


def _choose_g(s: float, n: int, g_target: float, w_cap: float, w_mid: float, up: bool) -> float:
    """The finest lattice ≥ g_target whose sum window has at most MAX_WINDOW points."""
    g0 = max(g_target, 1e-2)
    k, m, _ = lattice_pmf(s, -s * s / 2, g0, w_cap, up, w_mid)
    if n == 1:
        width = w_cap
    else:
        lo, hi, _ = _window(k, m, n)
        width = (hi - lo + 2 * n) * g0
    return max(g_target, width / MAX_WINDOW)


def remove_tails(sigma: float, t: int, g_target: float, h: float, grid: np.ndarray,
                 wrong: bool = False):
    """Upper bounds U(a) ≥ P_P(L > a) at each a of ``grid`` (remove direction).

    ``wrong=True`` rounds W DOWN instead (a negative control for the checks: at
    t = 2 it moves the tail by less than 10⁻⁶ relative, below what the
    loss grid's own rounding adds, so the checks cannot see it)."""
    s = 1.0 / sigma
    w_cap = math.exp(s * 8.0 - s * s / 2)  # P(W > w_cap) = Φ̄(8) ≈ 6e-16 per term → +∞
    w_mid = math.exp(s * 5.0 - s * s / 2)
    g = _choose_g(s, t - 1, g_target, w_cap, w_mid, True)
    k, m, inf_w = lattice_pmf(s, -s * s / 2, g, w_cap, not wrong, w_mid)
    lo, p, out, rnd = sum_pmf(k, m, t - 1)
    inf_mass = (t - 1) * inf_w + out + rnd
    p = np.maximum(p, 0.0)
    # U(mG) ≤ Σ_{c ≥ m} P_c + Σ_{c < m} P_c·Q_A((m − c)G), Q_A(y) = P(A > y) exact;
    # G is a multiple of g, fine enough for a loss error G/x, coarse enough that
    # the lattice reaches the window top plus A's e^-36 quantile
    x_need = (lo + len(p)) * g + math.exp(s * 8.5 + s * s / 2)
    ratio = max(1, math.ceil(max(t * h / 2, x_need / MAX_TAIL) / g))
    big_g = ratio * g
    # round B̂ = K g up to the lattice G: bin c = ceil(K / ratio)
    ks = lo + np.arange(len(p))
    c = -(-ks // ratio)
    c_lo = int(c[0])
    coarse = np.bincount(c - c_lo, weights=p)
    c_top = c_lo + len(coarse)  # B̂ < c_top·G on the window; the rest is in inf_mass
    n_max = int(max(1, math.ceil(x_need / big_g)))
    nn = np.arange(1, n_max + 1) * big_g
    _, qa = _lognormal_cdf_sf(nn, s, s * s / 2)  # A = exp(sZ + s²/2)
    conv = signal.fftconvolve(coarse, qa)  # conv[i] ↔ m = c_lo + i + 1
    # fftconvolve of non-negative sequences: absolute error far below this
    # plus the terms n > n_max left out of qa: at most Q_A(n_max·G) in all
    conv_err = (64 * 2.2e-16 * math.log2(len(conv) + 2) * float(coarse.sum())
                + float(_lognormal_cdf_sf(np.array([n_max * big_g]), s, s * s / 2)[1][0]))
    tail_b = np.concatenate([np.cumsum(coarse[::-1])[::-1], [0.0]])
    x = t * np.exp(grid)
    # always valid: B̂ < c_top·G off the +∞ mass, so U(x) ≤ Q_A(x − c_top·G)
    crude = _lognormal_cdf_sf(np.maximum(x - c_top * big_g, 0.0), s, s * s / 2)[1]
    m_all = np.floor(x / big_g).astype(np.int64)
    idx = m_all - c_lo - 1
    ok = (idx >= 0) & (idx < min(len(conv), n_max))
    fine = np.full(len(grid), np.inf)
    i_ok = idx[ok]
    fine[ok] = (tail_b[np.minimum(i_ok + 1, len(coarse))] + np.maximum(conv[i_ok], 0.0)
                + conv_err)
    u = np.minimum(fine, crude)
    return np.minimum(u + inf_mass, 1.0), dict(g=g, G=big_g, inf=inf_mass, window=len(p))


def add_tails(sigma: float, t: int, g_target: float, grid: np.ndarray):
    """Upper bounds U(a) ≥ P_Q(−L > a) at each a of ``grid`` (add direction)."""
    s = 1.0 / sigma
    w_cap = math.exp(s * 6.0 - s * s / 2)  # W above is rounded DOWN to w_cap: no +∞ mass
    w_mid = math.exp(s * 4.0 - s * s / 2)
    g = _choose_g(s, t, g_target, w_cap, w_mid, False)
    k, m, _ = lattice_pmf(s, -s * s / 2, g, w_cap, False, w_mid)
    lo, p, out, rnd = sum_pmf(k, m, t)
    cum = np.concatenate([[0.0], np.cumsum(p)])  # cum[i] = Σ_{lo ≤ K < lo + i}
    y = t * np.exp(-grid)
    # Σ W̌ < y  ⇔  K < y/g  ⇔  K < ceil(y/g)
    kexcl = np.ceil(y / g).astype(np.int64)
    i = np.clip(kexcl - lo, 0, len(p))
    u = cum[i] + out + rnd  # out covers K < lo (and K ≥ hi, harmlessly)
    return np.minimum(u, 1.0), dict(g=g, inf=out + rnd, window=len(p))


def pmf_from_tails(u: np.ndarray, grid_lo_index: int):
    """Stochastically larger PMF on the grid (see module docstring)."""
    u = np.maximum.accumulate(u[::-1])[::-1]
    u = np.minimum(u, 1.0)
    probs = np.empty(len(u))
    probs[0] = 1.0 - u[0]
    probs[1:] = u[:-1] - u[1:]
    return probs, float(u[-1])


def epoch_plds(sigma: float, t: int, h: float = 1e-4, g_target: float = 1e-4,
               wrong: bool = False):
    """dp-accounting PLD (both directions) dominating one epoch, and diagnostics."""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_distribution as pld

    s = 1.0 / sigma
    t0 = time.time()
    a_hi = math.log((math.exp(s * 8.5 + s * s / 2) + 2 * t) / t)
    j_lo = math.floor(-8.0 / h)
    grid = np.arange(j_lo, math.ceil(a_hi / h) + 1) * h
    u_rem, info_rem = remove_tails(sigma, t, g_target, h, grid, wrong is True)
    grid_add = np.arange(j_lo, math.ceil((math.log(t) + 8 * s + 2) / h) + 1) * h
    u_add, info_add = add_tails(sigma, t, g_target, grid_add)
    elapsed = time.time() - t0

    def dense(u, shift=0):
        # the mass below the first point where U < 1 − 1e-15 goes to that point
        # (raising a loss is always safe)
        first = max(0, int(np.argmax(u < 1.0 - 1e-15)) - 1)
        probs, inf = pmf_from_tails(u[first:], j_lo + first)
        first += int(np.argmax(probs > 0))
        probs = probs[int(np.argmax(probs > 0)):]
        return pld_pmf.DensePLDPmf(h, j_lo + first - shift, probs, inf, True)

    # wrong == "grid": every remove loss one grid step too low (a negative control)
    out = pld.PrivacyLossDistribution(dense(u_rem, int(wrong == "grid")), dense(u_add))
    return out, dict(seconds=elapsed, remove=info_rem, add=info_add, grid=grid, u_rem=u_rem,
                     grid_add=grid_add, u_add=u_add)


def _neg(pl):
    tot = 0.0
    for name in ("_pmf_remove", "_pmf_add"):
        pr = np.asarray(getattr(pl, name)._probs)
        tot += float(-pr[pr < 0].sum())
    return tot


def certified_delta(pl, eps: float, epochs: int) -> float:
    comp = pl.self_compose(epochs, tail_mass_truncation=1e-15)
    return float(comp.get_delta_for_epsilon(eps)) + ROUNDOFF_FACTOR * _neg(comp)


def max_epochs(pl, eps_list, delta_a: float, cap: int = 4096) -> list[int]:
    """Largest E with certified δ(ε) ≤ δ_A(1 − 10⁻³), for each ε (one composition per E)."""
    target = delta_a * (1 - 1e-3)
    memo: dict[int, np.ndarray] = {}

    def deltas(e: int) -> np.ndarray:
        if e not in memo:
            comp = pl.self_compose(e, tail_mass_truncation=1e-15)
            d = np.asarray(comp.get_delta_for_epsilon(list(eps_list)), dtype=float)
            memo[e] = d + ROUNDOFF_FACTOR * _neg(comp)
        return memo[e]

    out = []
    for i, _ in enumerate(eps_list):
        lo, hi = 0, 1
        while hi <= cap and deltas(hi)[i] <= target:
            lo, hi = hi, hi * 2
        hi = min(hi, cap + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if deltas(mid)[i] <= target:
                lo = mid
            else:
                hi = mid
        out.append(lo)
    return out


def pmf_tail(pmf, x: np.ndarray) -> np.ndarray:
    """P(L̂ > x) of a DensePLDPmf (its +∞ mass included)."""
    losses = (np.arange(pmf.size) + pmf._lower_loss) * pmf._discretization
    probs = np.asarray(pmf._probs)
    tail = np.concatenate([np.cumsum(probs[::-1])[::-1], [0.0]]) + pmf._infinity_mass
    return tail[np.searchsorted(losses, x, side="right")]


def exact_tails_t2(sigma: float, x: np.ndarray):
    """t = 2 by one-dimensional quadrature (the inner law in closed form):
    remove P_P(L > a) = E_Z[P(A > 2e^a − W(Z))], add P_Q(−L > a) = E_Z[P(W < 2e^{−a} − W(Z))]."""
    from scipy import integrate
    from scipy.stats import norm

    s = 1.0 / sigma
    rem, add = [], []
    for a in x:
        y = 2 * math.exp(a)

        def f_rem(z, y=y):
            w = math.exp(s * z - s * s / 2)
            r = y - w
            return norm.pdf(z) * (1.0 if r <= 0 else float(norm.sf((math.log(r) - s * s / 2) / s)))

        y2 = 2 * math.exp(-a)

        def f_add(z, y2=y2):
            w = math.exp(s * z - s * s / 2)
            r = y2 - w
            return norm.pdf(z) * (0.0 if r <= 0 else float(norm.cdf((math.log(r) + s * s / 2) / s)))

        # split at the kink of the integrand (where W(z) = y), integrate each side
        zk = (math.log(y) + s * s / 2) / s
        zk2 = (math.log(y2) + s * s / 2) / s
        rem.append(sum(integrate.quad(f_rem, lo, hi, epsabs=1e-16, epsrel=1e-10, limit=400)[0]
                       for lo, hi in ((-40, zk), (zk, 40))))
        add.append(integrate.quad(f_add, -40, zk2, epsabs=1e-16, epsrel=1e-10, limit=400)[0])
    return np.array(rem), np.array(add)


def validate() -> None:
    print("== t = 2: certified tail / exact (1-D quadrature), min over 400 points, "
          "and the largest loss gap")
    for sigma in (0.8, 1.0, 2.0):
        pl, _ = epoch_plds(sigma, 2)
        x = np.linspace(-3.0, 4.0, 400) + 1.234e-5
        rem, add = exact_tails_t2(sigma, x)
        cr = pmf_tail(pl._pmf_remove, x)
        ca = pmf_tail(pl._pmf_add, x)
        mr = rem > 1e-13
        ma = add > 1e-13
        print(f"sigma={sigma}: remove min ratio {np.min(cr[mr] / rem[mr]):.6f} "
              f"(violations {int(np.sum(cr < rem * (1 - 1e-9)))}), "
              f"add min ratio {np.min(ca[ma] / add[ma]):.6f} "
              f"(violations {int(np.sum(ca < add * (1 - 1e-9)))})")
    x = np.linspace(-3.0, 4.0, 400) + 1.234e-5
    rem, _ = exact_tails_t2(1.0, x)
    for wrong, what in ((True, "W rounded DOWN"), ("grid", "losses one grid step low")):
        pl, _ = epoch_plds(1.0, 2, wrong=wrong)
        cr = pmf_tail(pl._pmf_remove, x)
        print(f"negative control, remove, {what}, sigma=1, t=2: "
              f"violations {int(np.sum(cr < rem * (1 - 1e-9)))} of 400, "
              f"min ratio {np.min(cr[rem > 1e-13] / rem[rem > 1e-13]):.6f}")
    print("== t = 10: certified tail vs Monte-Carlo (4e6 epochs), "
          "violations = certified < MC − 4·SE, at 101 points of [−2, 3]")
    rng = np.random.default_rng(20261126)
    for sigma in (0.8, 1.0, 2.0):
        s = 1.0 / sigma
        pl, _ = epoch_plds(sigma, 10)
        n = 4_000_000
        rem_l = np.empty(n)
        add_l = np.empty(n)
        for b in range(0, n, 500_000):
            z = rng.standard_normal((500_000, 10))
            w = np.exp(s * z - s * s / 2)
            add_l[b:b + 500_000] = -np.log(w.mean(axis=1))
            w[:, 0] = np.exp(s * z[:, 0] + s * s / 2)  # x's step under P
            rem_l[b:b + 500_000] = np.log(w.mean(axis=1))
        x = np.linspace(-2.0, 3.0, 101)
        worst = []
        for name, losses, pmf in (("remove", rem_l, pl._pmf_remove), ("add", add_l, pl._pmf_add)):
            mc = np.array([np.count_nonzero(losses > v) / n for v in x])
            # standard error, floored at that of one event in n (an MC tail of
            # exactly 0 or 1 says nothing below 1/n)
            se = np.sqrt(np.maximum(mc * (1 - mc), 1.0 / n) / n)
            cert = pmf_tail(pmf, x)
            bad = int(np.sum(cert < mc - 4 * se))
            z = float(np.max((mc - cert) / se))
            gap = float(np.max(cert - mc))
            worst.append(f"{name}: violations {bad}, max (MC − certified)/SE {z:+.2f}, "
                         f"max certified − MC {gap:.2e}")
        print(f"sigma={sigma}: " + "; ".join(worst))


def table(sigmas=(0.8, 1.0, 2.0), ts=(10, 100, 1000), eps_list=(1, 2, 3, 4, 5, 6, 7, 8),
          delta: float = 1e-5, skip=()) -> None:
    from privguard import Ledger, Plan
    from privguard import mechanisms as M
    from privguard._accounting._hybrid import DEFAULT_SHARE_A, Envelope, envelope_steps

    delta_a = DEFAULT_SHARE_A * delta
    print(f"epochs admitted on plan, delta = {delta:g}, delta_A = {delta_a:g}")
    print("sigma t eps | RDP filter (delta) | certified allocation PLD (delta_A) | "
          "Poisson q=1/t PLD, epochs (delta_A; reference, not a bound) | build s")
    for sigma in sigmas:
        for t in ts:
            if (sigma, t) in skip:
                continue
            pl, info = epoch_plds(sigma, t)
            cert = max_epochs(pl, eps_list, delta_a)
            for eps, n_pld in zip(eps_list, cert):
                step = M.RandomAllocation(sigma, t)
                n_rdp = Ledger(float(eps), delta, plan=Plan(step, 1)).remaining(step).repeats
                poisson = envelope_steps(Envelope(sigma, 1.0 / t), float(eps), delta_a) / t
                print(f"{sigma:g} {t} {eps} | {n_rdp} | {n_pld} | {poisson:.1f} | "
                      f"{info['seconds']:.1f}", flush=True)


if __name__ == "__main__":
    if "--validate" in sys.argv:
        validate()
    else:
        # --skip 0.8,10 leaves a (sigma, t) out (to resume a run)
        skip = {(float(a), int(b)) for a, b in (v.split(",") for v in sys.argv[2::2])
               } if "--skip" in sys.argv else set()
        order = [(1.0, 1000), (1.0, 100), (1.0, 10), (2.0, 1000), (2.0, 100), (2.0, 10),
                 (0.8, 1000), (0.8, 100), (0.8, 10)]
        for sigma, t in order:
            if (sigma, t) not in skip:
                table(sigmas=(sigma,), ts=(t,))
