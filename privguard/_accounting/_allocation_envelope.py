"""A certified stochastically-larger PLD for one epoch of random allocation (issue 27 item 5).

docs/theory.md §2b.3 (Lemmas 2b.3, 2b.4, 2b.5, 2b.6). Pure numerics: no ledger, no I/O.

One epoch of ``RandomAllocation(σ, t)`` at σ ≥ σ₀ and the same t is dominated, in
both neighbouring directions and under any adaptivity, by the pair
P₀ = (1/t) Σ_i N(e_i, σ₀² I_t), Q₀ = N(0, σ₀² I_t) (docs/theory.md §2b.2,
Lemma 2b.2). By Lemma 2b.3 any loss that is stochastically larger than the
pair's loss, per direction, bounds the hockey-stick of every T-fold product
after composition. This module builds such a loss on a grid of width
:data:`LOSS_INTERVAL`, with every numerical error of its construction covered
by an explicit, proved allowance:

* the lattice masses (``scipy.special.ndtr``) by a relative allowance
  :data:`NDTR_REL` on each tail value (Lemma 2b.6);
* the FFT convolutions (the (t − 1)- and t-fold power, and the convolution with
  A's tail) by Higham's normwise FFT bound (Lemma 2b.4), turned into an absolute
  mass placed at the window's edge (finite loss) or added to every tail;
* every floating-point sum of non-negative terms by its relative bound γ_n
  (Higham §3.1), covered by :data:`SUM_REL`.

The composition of E epochs is dp-accounting's dense PLD ``self_compose`` with
the round-off allowance of docs/theory.md §2b (ROUNDOFF_FACTOR × negative mass),
exactly as the Poisson envelope's T_A.

Example:
    >>> pld = epoch_pld(2.0, 10)
    >>> 0 < certified_epoch_delta(2.0, 10, 1.0, 1) < 1e-2
    True
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._errors import InvalidArgumentError

# ------------------------------------------------------------------ constants
#: Unit round-off of IEEE double (Higham, eq. (2.4)).
UNIT = 2.0 ** -53
#: Loss grid of the epoch PMF (and its B lattice target): each rounding up costs about this much loss.
LOSS_INTERVAL = 1e-4
#: Relative allowance on every computed normal tail value, × max(1, σ/50): Cephes'
#: documented peak relative error of erfc (5.7e-14 on [0, 26.6]) plus the argument's
#: error, ≤ 4.3e-15·(σ + 120) relative where the value is above 1e-300 (docs/theory.md
#: Lemma 2b.6).
NDTR_REL = 1e-12
#: Relative allowance covering every float sum/cumulative sum of non-negative terms
#: (γ_n ≤ 4e-9 for n ≤ 2^25, Higham Lemma 3.1 / §4.2), applied at most twice, and NDTR_REL.
SUM_REL = 1e-8
#: Twiddle-factor error bound μ (Higham Thm 24.2); pocketfft computes twiddles to ~1 ulp.
TWIDDLE = 2.0 * UNIT
#: Safety factor on Higham's η: pocketfft uses radix-4/2 real passes, not the
#: radix-2 complex algorithm Thm 24.2 analyses (docs/theory.md Lemma 2b.4, the assumption).
FFT_SAFETY = 8.0
#: Mass sent out of each sum's window by Chernoff bounds (each side, per epoch).
OUT_MASS = 1e-11
#: Largest lattice window (a power of two) of an epoch's sum; a coarser lattice beyond.
MAX_WINDOW = 2 ** 24
#: Largest coarse lattice of the convolution with A's tail.
MAX_TAIL = 2 ** 21
#: Same as privguard._accounting._hybrid (docs/theory.md §2b): the composition's
#: round-off allowance, its Chernoff tail truncation and T_A's relative margin.
ROUNDOFF_FACTOR = 10.0
TAIL_MASS = 1e-15
MARGIN = 1e-3
#: Largest t and smallest σ certified here (window sizes; σ₀ < 0.5 is refused).
MAX_STEPS = 10_000
MIN_SIGMA = 0.5
#: Largest σ₀ (docs/theory.md §2b.3): beyond about 10¹² the lattices grow (σ₀ = 10¹⁴ with
#: t = 10⁴ ran for minutes, 10¹⁷ ran out of memory at t = 2, σ₀ = 10³⁰⁸ overflows
#: z = (log w − μ)/s). Nothing is lost: the envelope of σ₀ = 10¹² holds every epoch with a
#: larger σ. Review rbi: not 10⁶ (bi's first bound), which refused the plans of
#: 10⁶ < σ₀ ≤ 10¹² that main certified in about 2 s (t = 2 to 10⁴), and so the ledgers
#: main wrote with them (their stored fix entries no longer derived).
MAX_SIGMA = 1e12
#: T_A (epochs) is not searched beyond this.
MAX_EPOCHS = 4096

_LAMBDA = np.geomspace(1e-8, 5.0, 24)  # Chernoff's λ grid: a coarser one only widens windows


def _gamma(n: float, unit: float = UNIT) -> float:
    """γ_n = n·u / (1 − n·u) (Higham, Lemma 3.1)."""
    return n * unit / (1.0 - n * unit)


def fft_tau(size: int) -> float:
    """Relative normwise error of one length-``size`` DFT (Higham, 2nd ed., Thm 24.2):
    ‖ŷ − y‖₂ ≤ τ‖y‖₂, τ = Lη/(1 − Lη), L = log₂ size, η = μ + γ₄(√2 + μ), here with
    η × :data:`FFT_SAFETY` (docs/theory.md Lemma 2b.4)."""
    levels = math.log2(size)
    eta = FFT_SAFETY * (TWIDDLE + _gamma(4) * (math.sqrt(2.0) + TWIDDLE))
    return levels * eta / (1.0 - levels * eta)


def _norm2(x: np.ndarray) -> float:
    """An upper bound on ‖x‖₂: the float Σ|x_k|² (``vdot``, non-negative terms, relative error
    ≤ γ_(N+2) < SUM_REL for N ≤ 2²⁵, Higham Lemma 3.1), inflated by SUM_REL twice."""
    return math.sqrt(abs(complex(np.vdot(x, x))) * (1 + SUM_REL)) * (1 + SUM_REL)


def _power(z: np.ndarray, n: int) -> np.ndarray:
    """z**n by square-and-multiply: relative error ≤ (1 + √2γ₂)^(n−1) − 1 per entry
    (Higham Lemma 3.5 for one complex product, by induction; Lemma 2b.4)."""
    result: np.ndarray | None = None
    base = z
    while n:
        if n & 1:
            result = base.copy() if result is None else result * base
        n >>= 1
        if n:
            base = base * base
    assert result is not None  # n ≥ 1
    return result


def fft_power(x: np.ndarray, n: int) -> tuple[np.ndarray, float]:
    """The n-fold circular self-convolution of the real vector ``x`` (length a power of
    two) by one real FFT, and a bound E with ‖ĉ − c‖₂ ≤ E (docs/theory.md Lemma 2b.4).

    c is the exact circular n-fold convolution of the float vector x. With F = DFT(x),
    D = τ√N‖x‖₂ ≥ ‖F̂ − F‖₂, R = ‖x‖₁ + D ≥ |F̂_j|, |F_j|, θ = (1 + √2γ₂)^(n−1) − 1:
    ‖Ĝ − F^n‖₂ ≤ nR^(n−1)D + θ‖F̂^n‖₂ and ‖ĉ − c‖₂ ≤ τ‖Ĝ‖₂/√N + ‖Ĝ − F^n‖₂/√N.
    """
    size = x.size
    tau = fft_tau(size)
    spec = np.fft.rfft(x)
    powered = _power(spec, n)
    out = np.fft.irfft(powered, size)
    # ‖·‖₂ of the full (Hermitian) spectrum from the half spectrum: at most twice the half's.
    g_norm = math.sqrt(2.0) * _norm2(powered)
    d = tau * math.sqrt(size) * _norm2(x)
    r = float(np.abs(x).sum()) * (1 + SUM_REL) + d
    theta = math.expm1((n - 1) * math.log1p(math.sqrt(2.0) * _gamma(2)))
    fn_norm = g_norm / (1.0 - theta)  # ‖F̂^n‖₂ ≤ ‖Ĝ‖₂/(1 − θ)
    diff = n * math.exp((n - 1) * math.log(r)) * d + theta * fn_norm
    err = (tau * g_norm + diff) / math.sqrt(size) + 1e-290 * size  # + underflow, absolute
    return out, err


def fft_convolve(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """Linear convolution of two real vectors by a zero-padded real FFT of power-of-two
    length, and a bound E ≥ max_k |ĉ_k − c_k| (docs/theory.md Lemma 2b.4):
    E = τ(‖a‖₂‖b‖₁ + ‖a‖₁‖b‖₂ + τ√N‖a‖₂‖b‖₂) + (τ + √2γ₂/(1 − √2γ₂))‖P̂‖₂/√N."""
    length = a.size + b.size - 1
    size = 1 << max(1, (length - 1).bit_length())
    tau = fft_tau(size)
    pa, pb = np.fft.rfft(a, size), np.fft.rfft(b, size)
    prod = pa * pb
    out = np.fft.irfft(prod, size)[:length]
    na2, nb2 = _norm2(a), _norm2(b)
    na1 = float(np.abs(a).sum()) * (1 + SUM_REL)
    nb1 = float(np.abs(b).sum()) * (1 + SUM_REL)
    mu = math.sqrt(2.0) * _gamma(2)
    p_norm = math.sqrt(2.0) * _norm2(prod)
    err = (tau * (na2 * nb1 + na1 * nb2 + tau * math.sqrt(size) * na2 * nb2)
           + (tau + mu / (1 - mu)) * p_norm / math.sqrt(size))
    return out, err


# ------------------------------------------------------------ lattice laws
def _z(w: np.ndarray, s: float, mu: float) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return (np.log(w) - mu) / s


def ndtr_rel(s: float) -> float:
    """The relative allowance of Lemma 2b.6 at s = 1/σ: NDTR_REL·max(1, σ/50)."""
    return NDTR_REL * max(1.0, 1.0 / (50.0 * s))


def _ndtr(z: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr

    return ndtr(z)


def lattice_up(s: float, g: float, w_mid: float, w_cap: float, coarse: int = 100
               ) -> tuple[np.ndarray, np.ndarray, float]:
    """W = exp(sZ − s²/2) rounded UP onto g·ℕ, as (indices, masses, mass at +∞).

    Cells (g(k−1), gk] below w_mid, (g(k−coarse), gk] above; W above the last edge
    goes to +∞. The masses are differences of upper bounds Ŝ ≥ P(W > edge)
    (computed tail × (1 + ndtr_rel), made non-increasing, Lemma 2b.6), plus 2·UNIT
    at the top cell, so the lattice measure's tail at every
    point is ≥ the rounded law's (its float differences telescope to within UNIT).
    """
    k_mid = math.ceil(w_mid / g)
    k_cap = k_mid + coarse * math.ceil((w_cap - k_mid * g) / (coarse * g))
    edges = np.concatenate([np.arange(0, k_mid, dtype=np.int64),
                            np.arange(k_mid, k_cap + 1, coarse, dtype=np.int64)])
    sf = _ndtr(-_z(g * edges.astype(float), s, -s * s / 2)) * (1 + ndtr_rel(s))
    sf[0] = 1.0  # P(W > 0) = 1
    sf = np.minimum(np.maximum.accumulate(sf[::-1])[::-1], 1.0)
    mass = sf[:-1] - sf[1:]
    mass[-1] += 2 * UNIT
    return edges[1:], mass, float(sf[-1])


def lattice_down(s: float, g: float, w_mid: float, w_cap: float, coarse: int = 100
                 ) -> tuple[np.ndarray, np.ndarray]:
    """W rounded DOWN onto g·ℕ, as (indices, masses): cells [gk, g(k+1)) below w_mid,
    [gk, g(k+coarse)) above; W ≥ the last edge goes to the last edge (also down).
    Masses are differences of upper bounds Ĉ ≥ P(W < edge) (Lemma 2b.6), plus 2·UNIT
    at the bottom cell, so every lower tail is ≥ the rounded law's."""
    k_mid = math.ceil(w_mid / g)
    k_cap = k_mid + coarse * math.ceil((w_cap - k_mid * g) / (coarse * g))
    edges = np.concatenate([np.arange(0, k_mid, dtype=np.int64),
                            np.arange(k_mid, k_cap + 1, coarse, dtype=np.int64)])
    cdf = _ndtr(_z(g * edges.astype(float), s, -s * s / 2)) * (1 + ndtr_rel(s))
    cdf[0] = 0.0  # P(W < 0) = 0
    cdf = np.minimum(np.maximum.accumulate(cdf), 1.0)
    cdf = np.concatenate([cdf, [1.0]])  # the last cell holds everything above
    mass = cdf[1:] - cdf[:-1]
    mass[0] += 2 * UNIT
    return edges, mass


def _log_mgf(k: np.ndarray, pmf: np.ndarray, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log Σ_k pmf_k e^(λk) for each λ, and a bound on its absolute float error: each exponent
    v = log pmf_k + λk is within 4u(745 + |λ|·k_max) of the exact one, exp and the sum add
    γ_(N+2) relatively (Higham Lemma 3.1), the last log u·|result|."""
    nz = pmf > 0
    lp = np.log(pmf[nz])
    kk = k[nz].astype(float)
    k_max = float(kk.max())
    out = np.empty(len(lam))
    err = np.empty(len(lam))
    for i, la in enumerate(lam):
        v = lp + la * kk
        m = v.max()
        out[i] = m + math.log(np.exp(v - m).sum())
        err[i] = (8 * UNIT * (745.0 + abs(la) * k_max) + 2 * _gamma(kk.size + 2)
                  + UNIT * abs(out[i]))
    return out, err


def _chernoff(mgf: tuple[np.ndarray, np.ndarray], lam: np.ndarray, n: int, edge: float) -> float:
    """min_λ exp(n·log M(λ) − λ·edge) (Markov on e^(λΣ), valid for any non-negative
    lattice measure), with every exponent raised by its float error bound."""
    lm, err = mgf
    expo = n * lm - lam * edge + n * err + 4 * UNIT * (np.abs(lam * edge) + n * np.abs(lm))
    return float(min(1.0, np.exp(np.min(expo))))


def _window(k: np.ndarray, pmf: np.ndarray, n: int) -> tuple[int, int, float, float]:
    """[lo, hi) such that the n-fold measure has ≤ OUT_MASS below lo and at/above hi."""
    kf = k.astype(float)
    total = float(pmf.sum())
    m1 = float((pmf * kf).sum()) / total
    mean = m1 * n
    sd = math.sqrt(max(float((pmf * kf * kf).sum()) / total - m1 * m1, 1e-30) * n)
    up, down = _log_mgf(k, pmf, _LAMBDA), _log_mgf(k, pmf, -_LAMBDA)
    hi = mean + 8 * sd
    while _chernoff(up, _LAMBDA, n, hi) > OUT_MASS:
        hi = mean + (hi - mean) * 1.25
    lo = mean - 8 * sd
    while lo > 0 and _chernoff(down, -_LAMBDA, n, lo) > OUT_MASS:
        lo = mean - (mean - lo) * 1.25
    lo = max(0, math.floor(lo))
    hi = math.ceil(hi)
    above = _chernoff(up, _LAMBDA, n, hi)
    below = _chernoff(down, -_LAMBDA, n, lo - 1) if lo > 0 else 0.0
    return lo, hi, below, above


def sum_measure(k: np.ndarray, pmf: np.ndarray, n: int,
                window: tuple[int, int, float, float] | None = None
                ) -> tuple[int, np.ndarray, float, float, float]:
    """The n-fold sum on a window [lo, lo + N), N a power of two, as
    (lo, ν ≥ 0, tail error, mass below, mass above) (docs/theory.md Lemma 2b.5).

    ν = max(ĉ, 0), ĉ the FFT of the measure folded modulo N. The exact circular
    power c is, at each window point, the sum of the exact linear n-fold measure
    over its residue class (≥ it); any sum over a set of window points of c is
    within √N·‖ĉ − c‖₂ of that of ĉ, hence ≤ that of ν plus the tail error."""
    if n == 1:
        return 0, np.bincount(k, weights=pmf), 0.0, 0.0, 0.0
    lo, hi, below, above = _window(k, pmf, n) if window is None else window
    size = 1 << max(1, (hi - lo - 1).bit_length())
    folded = np.bincount(k % size, weights=pmf, minlength=size)
    res, err = fft_power(folded, n)
    res = np.roll(res, -(lo % size))  # index j ↔ lattice point lo + j
    return lo, np.maximum(res, 0.0), math.sqrt(size) * err, below, above


def _choose_g(s: float, n: int, g_target: float, w_cap: float, w_mid: float, up: bool) -> float:
    """The finest lattice ≥ g_target whose sum window fits MAX_WINDOW (only tightness)."""
    g0 = max(g_target, 1e-2)
    if up:
        k, m, _ = lattice_up(s, g0, w_mid, w_cap)
    else:
        k, m = lattice_down(s, g0, w_mid, w_cap)
    if n == 1:
        width = w_cap
    else:
        lo, hi, _, _ = _window(k, m, n)
        width = (hi - lo + 2 * n) * g0
    return max(g_target, width / (MAX_WINDOW * 0.9))


def _fit(s: float, n: int, w_cap: float, w_mid: float, up: bool
         ) -> tuple[float, tuple[Any, ...], tuple[int, int, float, float] | None]:
    """The lattice step g, the lattice law and the n-fold window, coarsening g until the
    window has at most MAX_WINDOW points (a coarser lattice only costs tightness)."""
    g = _choose_g(s, n, LOSS_INTERVAL, w_cap, w_mid, up)
    for _ in range(8):
        law = lattice_up(s, g, w_mid, w_cap) if up else lattice_down(s, g, w_mid, w_cap)
        if n == 1:
            return g, law, None
        window = _window(law[0], law[1], n)
        if window[1] - window[0] <= MAX_WINDOW:
            return g, law, window
        g *= max(1.02, 1.01 * (window[1] - window[0]) / MAX_WINDOW)
    raise ArithmeticError(f"no lattice window of at most {MAX_WINDOW} points found")


def _sf_a(x: np.ndarray, s: float) -> np.ndarray:
    """Upper bound on Q_A(x) = P(A > x), A = exp(sZ + s²/2); 1 for x ≤ 0."""
    x = np.asarray(x, dtype=float)
    out = np.ones_like(x)
    pos = x > 0
    out[pos] = np.minimum(_ndtr(-_z(x[pos], s, s * s / 2)) * (1 + ndtr_rel(s)), 1.0)
    return out


def remove_tails(sigma: float, t: int, grid: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """U(a) ≥ P₀(ℓ > a) at each a of ``grid``, ℓ = log((A + B)/t) the remove loss
    (docs/theory.md §2b.3, step 1, with the allowances of Lemmas 2b.4–2b.6)."""
    s = 1.0 / sigma
    h = LOSS_INTERVAL
    w_cap = math.exp(s * 8.0 - s * s / 2)
    w_mid = math.exp(s * 5.0 - s * s / 2)
    n = t - 1
    g, (k, m, inf_w), window = _fit(s, n, w_cap, w_mid, True)
    lo, nu, err, below, above = sum_measure(k, m, n, window)
    # +∞: any of the n terms beyond w_cap (≤ n·Ŝ_cap·(total)^(n−1)), and the mass above the window
    total = float(m.sum()) + inf_w
    inf_mass = n * inf_w * math.exp((n - 1) * math.log(max(total, 1.0))) + above
    nu = nu.copy()
    nu[-1] += err  # the FFT's tail error, as mass at the window's top (finite loss)
    nu[0] += below  # the mass below the window, moved up to its bottom (a larger loss)
    x_need = (lo + len(nu)) * g + math.exp(s * 8.5 + s * s / 2)
    ratio = max(1, math.ceil(max(t * h / 2, x_need / MAX_TAIL) / g))
    big_g = ratio * g
    ks = lo + np.arange(len(nu))
    c = -(-ks // ratio)  # round B up onto the lattice G
    c_lo = int(c[0])
    coarse = np.bincount(c - c_lo, weights=nu)
    c_top = c_lo + len(coarse)
    n_max = int(max(1, math.ceil(x_need / big_g)))
    qa = _sf_a(np.arange(1, n_max + 1) * big_g, s)
    conv, conv_err = fft_convolve(coarse, qa)  # conv[i] ↔ m = c_lo + i + 1
    nu_total = float(coarse.sum()) * (1 + SUM_REL)
    conv_err += nu_total * float(_sf_a(np.array([n_max * big_g]), s)[0])  # terms n > n_max
    tail_b = np.concatenate([np.cumsum(coarse[::-1])[::-1], [0.0]])
    x = t * np.exp(grid) * (1 - 4 * UNIT)  # never above the exact t·e^a: the tail only grows
    crude = _sf_a(np.maximum(x - c_top * big_g, 0.0), s) * nu_total
    m_all = np.floor(x / big_g).astype(np.int64)
    idx = m_all - c_lo - 1
    ok = (idx >= 0) & (idx < min(len(conv), n_max))
    fine = np.full(len(grid), np.inf)
    i_ok = idx[ok]
    fine[ok] = (tail_b[np.minimum(i_ok + 1, len(coarse))] + np.maximum(conv[i_ok], 0.0)
                + conv_err)
    below_all = idx < 0  # x below the coarse lattice: every finite B counts
    fine[below_all] = nu_total + conv_err
    u = np.minimum(fine, crude) * (1 + SUM_REL) + inf_mass
    return np.minimum(u, 1.0), dict(g=g, G=big_g, inf=inf_mass, window=len(nu), fft_err=err,
                                   conv_err=conv_err)


def add_tails(sigma: float, t: int, grid: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """U(a) ≥ Q₀(−ℓ > a) at each a of ``grid``: P(Σ_{i≤t} W_i < t·e^(−a)) bounded by the
    lower tails of the t-fold rounded-down lattice measure (docs/theory.md §2b.3, step 2)."""
    s = 1.0 / sigma
    w_cap = math.exp(s * 6.0 - s * s / 2)
    w_mid = math.exp(s * 4.0 - s * s / 2)
    g, (k, m), window = _fit(s, t, w_cap, w_mid, False)
    lo, nu, err, below, above = sum_measure(k, m, t, window)
    cum = np.concatenate([[0.0], np.cumsum(nu)])
    y = t * np.exp(-grid) * (1 + 4 * UNIT)  # never below the exact t·e^(−a)
    kexcl = np.ceil(y / g).astype(np.int64)  # ΣŴ < y ⇔ K < ⌈y/g⌉
    i = np.clip(kexcl - lo, 0, len(nu))
    # the FFT's error as mass at the window's bottom: it counts wherever K = lo is counted
    u = (cum[i] + np.where(i > 0, err, 0.0)) * (1 + SUM_REL) + below
    u += np.where(kexcl - lo > len(nu), above, 0.0)  # y beyond the window: its upper mass too
    return np.minimum(u, 1.0), dict(g=g, inf=below, window=len(nu), fft_err=err)


def _pmf(u: np.ndarray, j_lo: int) -> Any:
    """dp-accounting's dense PMF whose tail at every x ∈ [a_j, a_{j+1}) is U(a_j) (made
    non-increasing), plus 1e-15 at +∞ for the float differences (docs/theory.md §2b.3, step 3)."""
    from dp_accounting.pld import pld_pmf

    u = np.minimum(np.maximum.accumulate(u[::-1])[::-1], 1.0)
    first = max(0, int(np.argmax(u < 1.0 - 1e-15)) - 1)
    u = u[first:]
    probs = np.empty(len(u))
    probs[0] = 1.0 - u[0]
    probs[1:] = u[:-1] - u[1:]
    start = int(np.argmax(probs > 0))
    return pld_pmf.DensePLDPmf(LOSS_INTERVAL, j_lo + first + start, probs[start:],
                               min(1.0, float(u[-1]) + 1e-15), True)


def _check(sigma: Any, steps: Any, name: str = "steps") -> tuple[float, int]:
    """σ₀ and t₀ in the envelope's range; ``name`` is the caller's name for t₀."""
    sigma = check.positive_finite("noise_multiplier", sigma)
    if sigma < MIN_SIGMA:
        raise InvalidArgumentError("noise_multiplier", sigma,
                                   f"must be >= {MIN_SIGMA} for the allocation PLD envelope")
    if sigma > MAX_SIGMA:  # docs/theory.md §2b.3: σ₀ ≤ 10¹² (an envelope of 10¹² holds it)
        raise InvalidArgumentError("noise_multiplier", sigma,
                                   f"must be <= {MAX_SIGMA:g} for the allocation PLD envelope "
                                   f"(plan noise_multiplier={MAX_SIGMA:g}: its envelope holds "
                                   "every epoch with a larger one)")
    steps = check.positive_int(name, steps, maximum=MAX_STEPS)
    if steps < 2:
        raise InvalidArgumentError(name, steps, "must be >= 2 (t = 1 is a Gaussian)")
    return sigma, steps


@functools.lru_cache(maxsize=8)
def _epoch(sigma: float, steps: int) -> tuple[Any, dict[str, Any]]:
    from dp_accounting.pld import privacy_loss_distribution as pld

    s = 1.0 / sigma
    h = LOSS_INTERVAL
    j_lo = math.floor(-8.0 / h)
    a_hi = math.log((math.exp(s * 8.5 + s * s / 2) + 2 * steps) / steps)
    grid = np.arange(j_lo, math.ceil(a_hi / h) + 1) * h
    u_rem, info_rem = remove_tails(sigma, steps, grid)
    grid_add = np.arange(j_lo, math.ceil((math.log(steps) + 8 * s + 2) / h) + 1) * h
    u_add, info_add = add_tails(sigma, steps, grid_add)
    out = pld.PrivacyLossDistribution(_pmf(u_rem, j_lo), _pmf(u_add, j_lo))
    return out, dict(remove=info_rem, add=info_add)


def epoch_pld(noise_multiplier: float, steps: int) -> Any:
    """dp-accounting PLD (remove, add) whose losses are stochastically larger than one
    epoch's, per direction (docs/theory.md §2b.3, Lemmas 2b.3–2b.6). Cached per (σ, t)."""
    sigma, steps = _check(noise_multiplier, steps)
    return _epoch(sigma, steps)[0]


def _negative_mass(pld: Any) -> float:
    total = 0.0
    for name in ("_pmf_remove", "_pmf_add"):
        pmf = getattr(pld, name, None)
        if pmf is not None:
            probs = np.asarray(pmf._probs)
            total += float(-probs[probs < 0].sum())
    return total


def certified_epoch_delta(noise_multiplier: float, steps: int, epsilon: float, epochs: int
                          ) -> float:
    """δ at ε of ``epochs`` epochs, max over remove and add, plus §2b's round-off allowance."""
    epsilon = check.positive_finite("epsilon", epsilon)
    # at most MAX_EPOCHS, as T_A's search: a composition of 10⁹ epochs would not fit in memory
    epochs = check.positive_int("epochs", epochs, maximum=MAX_EPOCHS)
    pld = epoch_pld(noise_multiplier, steps)
    composed = pld if epochs == 1 else pld.self_compose(epochs, tail_mass_truncation=TAIL_MASS)
    return float(composed.get_delta_for_epsilon(epsilon)) + ROUNDOFF_FACTOR * _negative_mass(composed)


def _rdp_guess(sigma: float, steps: int, epsilon: float, delta_a: float) -> int:
    """The non-adaptive RDP epoch count at (ε, δ_A): only a starting point for the search."""
    from privguard._curves import _conversion as conv
    from privguard._curves._orders import DEFAULT_ORDERS
    from privguard._mechanisms._allocation import RandomAllocation

    orders = np.array(DEFAULT_ORDERS)
    one = RandomAllocation(sigma, steps).rdp(orders)
    budget = conv.rdp_budget_per_order(orders, epsilon, delta_a)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(one > 0, budget / one, 0.0)
    return int(min(max(float(np.nanmax(ratio)), 1.0), MAX_EPOCHS))


@functools.lru_cache(maxsize=64)
def _epochs(sigma: float, steps: int, epsilon: float, delta_a: float) -> int:
    target = delta_a * (1.0 - MARGIN)
    memo: dict[int, bool] = {0: True}

    def ok(e: int) -> bool:
        if e not in memo:
            memo[e] = certified_epoch_delta(sigma, steps, epsilon, e) <= target
        return memo[e]

    # Bracket lo < hi with ok(lo) and not ok(hi), galloping from the RDP count; only
    # an E whose own certified δ passed is ever returned.
    guess = _rdp_guess(sigma, steps, epsilon, delta_a)
    if ok(guess):
        lo, hi = guess, min(MAX_EPOCHS + 1, max(guess + 1, math.ceil(guess * 1.125)))
        while hi <= MAX_EPOCHS and ok(hi):
            lo, hi = hi, min(MAX_EPOCHS + 1, max(hi + 1, math.ceil(hi * 1.125)))
    else:
        lo, hi = 0, guess
        while hi > 1:
            probe = max(1, math.floor(hi / 1.25))
            if ok(probe):
                lo = probe
                break
            hi = probe
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def envelope_epochs(noise_multiplier: float, steps: int, epsilon: float, delta_a: float) -> int:
    """T_A in epochs: the largest E ≤ MAX_EPOCHS with certified δ(ε) ≤ δ_A(1 − 10⁻³).

    Cached per (σ₀, t₀, ε, δ_A). The search (galloping from the RDP filter's count, then
    bisection) only ever returns an E whose own certified δ was computed and passed, so
    its soundness does not depend on δ(E) being monotone in E (docs/theory.md §2b.3).
    """
    sigma, steps = _check(noise_multiplier, steps)
    epsilon = check.positive_finite("epsilon", epsilon)
    delta_a = check.delta("delta_a", delta_a, minimum=0.0)
    return _epochs(sigma, steps, epsilon, delta_a)
