"""The default grid of Rényi orders, and the largest order a grid may hold.

A ledger accounts on one fixed, finite grid Λ of orders (seed 001 §3.3:
"a (possibly infinite) sequence of α values to track"). The default covers
where DP-SGD's optimal order lives (fine fractional orders in 1.1–10.9), every
integer up to 64 (integer-order bounds such as subsampling need them), and a
few large orders for small target ε. It is a superset of Opacus'
``RDPAccountant.DEFAULT_ALPHAS`` and of dp-accounting's ``DEFAULT_RDP_ORDERS``
up to 64, built with the same floating-point expressions so numbers agree
bit for bit on shared orders.

Every grid's orders lie in [:data:`MIN_ORDER`, :data:`MAX_ORDER`] =
[1 + 10^-5, 10^6]. Orders outside buy nothing and compute badly:

* above 10^6 the RDP→DP conversion term log(1/δ)/(α−1) is below 10^-4 for
  any δ ≥ 1e-40, while curves that need a sum over α terms (the subsampled
  Gaussian at integer orders) cost O(α) to evaluate, and closed forms lose
  their meaning near the float range (e.g. 2α − 1 overflowing);
* below 1 + 10^-5 that term exceeds 10^5·log(1/δ), while closed forms that
  divide by α − 1 (Laplace, pure DP) lose their digits to cancellation: from
  α − 1 ≈ 10^-7 on their computed curves decrease with α by more than the
  round-off tolerance of :class:`privguard.RDPCurve`.
"""

from __future__ import annotations

DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)]  # 1.1 ... 10.9 (same floats as Opacus)
    + [float(a) for a in range(11, 65)]  # 11 ... 64
    + [128.0, 256.0, 512.0, 1024.0]
)
"""157 orders: 1.1–10.9 by 0.1, the integers 11–64, and 128, 256, 512, 1024."""

MIN_ORDER: float = 1.00001
"""The smallest Rényi order any grid may hold (1 + 10^-5)."""

MAX_ORDER: float = 1e6
"""The largest Rényi order any grid may hold (10^6)."""
