"""Independent high-precision RDP curves (task cv), written from the papers, not from privguard.

* Poisson-subsampled Gaussian, add/remove (Mironov, Talwar & Zhang 2019, "Rényi Differential
  Privacy of the Sampled Gaussian Mechanism", §3.3): A_α = E_{z~N(0,σ²)}[((1−q) + q·e^((2z−1)/(2σ²)))^α],
  ε(α) = log A_α/(α−1).
  - integer α: the exact binomial sum, written as A_α − 1 = Σ_{j≥2} C(α,j)(1−q)^(α−j) q^j
    (e^((j²−j)/(2σ²)) − 1) (Σ_j C(α,j)(1−q)^(α−j)q^j = 1), every term ≥ 0, in mpmath;
  - fractional α: an mpmath quadrature (tanh-sinh, split at the two modes u = 0 and u = α/σ)
    of A_α − 1 = E_u[(1+x)^α − 1 − αx], x = q·(e^((2σu−1)/(2σ²)) − 1), u ~ N(0, 1) (E[x] = 0);
    the integrand is ≥ 0 and is the binomial series Σ_{k≥2} C(α,k)x^k where |x| < 1/8.
* Gaussian α/(2σ²), Laplace and pure DP (Mironov 2017, Props. 7, 6, 5) in mpmath.

Everything is returned as an mpmath number; callers compare in mpmath.
"""

from __future__ import annotations

import mpmath as mp


def sgm_integer(q: float, sigma: float, alpha: int, dps: int = 40) -> mp.mpf:
    """ε(α) of one subsampled-Gaussian step at an integer order α ≥ 2 (exact sum)."""
    with mp.workdps(dps):
        qm, s2 = mp.mpf(q), 2 * mp.mpf(sigma) ** 2
        if qm == 1:
            return mp.mpf(alpha) / s2
        p = 1 - qm
        total = mp.mpf(0)
        coef = mp.mpf(alpha) * (alpha - 1) / 2  # C(α, 2)
        for j in range(2, alpha + 1):
            total += coef * p ** (alpha - j) * qm**j * mp.expm1((j * j - j) / s2)
            coef = coef * (alpha - j) / (j + 1)
        return mp.log1p(total) / (alpha - 1)


def _excess(alpha: mp.mpf, x: mp.mpf) -> mp.mpf:
    """(1+x)^α − 1 − αx ≥ 0 for x ≥ −1, α > 1, without cancellation for small |x|."""
    if abs(x) < mp.mpf(1) / 8:
        term = alpha * (alpha - 1) / 2 * x * x
        total = term
        k = 2
        while abs(term) > abs(total) * mp.mpf(10) ** (-mp.mp.dps - 5) and k < 2000:
            term = term * (alpha - k) / (k + 1) * x
            total += term
            k += 1
        return total
    return mp.exp(alpha * mp.log1p(x)) - 1 - alpha * x


def sgm_fractional(q: float, sigma: float, alpha: float, dps: int = 30) -> mp.mpf:
    """ε(α) of one subsampled-Gaussian step at any α > 1, by quadrature (see the module)."""
    with mp.workdps(dps):
        qm, sm, am = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)
        if qm == 1:
            return am / (2 * sm * sm)
        c = 1 / (2 * sm * sm)
        norm = 1 / mp.sqrt(2 * mp.pi)

        # mp.quad's tolerance is absolute (~10^-dps): scale the integrand to order 1 by its
        # second-order size α(α−1)/2·q²·E[(L−1)²] (without it, 1.5% off at σ = 1e8, q = 1e-6)
        scale = am * (am - 1) / 2 * qm * qm * mp.expm1(1 / (sm * sm))

        def f(u):
            x = qm * mp.expm1(u / sm - c)
            return norm * mp.exp(-u * u / 2) * _excess(am, x) / scale

        peak = am / sm - 1 / (2 * sm)  # the mode of φ(u)·L(u)^α
        pts: list = []
        for p in sorted({mp.mpf(-12), mp.mpf(0), mp.mpf(12), peak - 12, peak, peak + 12}):
            if not pts or p - pts[-1] > mp.mpf(1) / 64:  # no slivers (σ = 1e150: peak ≈ 0)
                pts.append(p)
        pts = [mp.ninf, *pts, mp.inf]
        total = mp.quad(f, pts, maxdegree=10) * scale
        return mp.log1p(total) / (am - 1)


def sgm(q: float, sigma: float, alpha: float) -> mp.mpf:
    """ε(α), exact sum at integer orders, quadrature elsewhere."""
    if float(alpha).is_integer():
        return sgm_integer(q, sigma, int(alpha))
    return sgm_fractional(q, sigma, alpha)


def gaussian(sigma: float, alpha: float) -> mp.mpf:
    """Mironov 2017, Prop. 7: α/(2σ²)."""
    with mp.workdps(40):
        return mp.mpf(alpha) / (2 * mp.mpf(sigma) ** 2)


def _digits(x: float) -> int:
    """Working digits for a closed form whose first-order terms cancel at a parameter x."""
    return 50 + max(0, int(-mp.log10(mp.mpf(x))) if x < 1 else int(mp.log10(mp.mpf(x))))


def laplace(b: float, alpha: float) -> mp.mpf:
    """Mironov 2017, Prop. 6 (scale b, L1 sensitivity 1), with S − 1 summed exactly."""
    with mp.workdps(_digits(b)):
        a, t = mp.mpf(alpha), 1 / mp.mpf(b)
        # S = (α e^((α−1)t) + (α−1) e^(−αt))/(2α−1); S − 1 from expm1 terms (no cancellation
        # of the leading 1 at high precision: dps is far above the digits we compare)
        s_m1 = (a * mp.expm1((a - 1) * t) + (a - 1) * mp.expm1(-a * t)) / (2 * a - 1)
        return mp.log1p(s_m1) / (a - 1)


def pure_dp(eps0: float, alpha: float) -> mp.mpf:
    """Mironov 2017, Prop. 5 (randomized response, the worst ε₀-DP mechanism)."""
    with mp.workdps(_digits(eps0)):
        a, e = mp.mpf(alpha), mp.mpf(eps0)
        # (e^(αε) + e^(−(α−1)ε))/(1 + e^ε) − 1 = (e^(αε) − e^ε + e^(−(α−1)ε) − 1)/(1 + e^ε)
        num = mp.expm1(a * e) - mp.expm1(e) + mp.expm1(-(a - 1) * e)
        return mp.log1p(num / (1 + mp.exp(e))) / (a - 1)
