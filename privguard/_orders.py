"""The default grid of Rényi orders.

A ledger accounts on one fixed, finite grid Λ of orders (seed 001 §3.3:
"a (possibly infinite) sequence of α values to track"). The default covers
where DP-SGD's optimal order lives (fine fractional orders in 1.1–10.9), every
integer up to 64 (integer-order bounds such as subsampling need them), and a
few large orders for small target ε. It is a superset of Opacus'
``RDPAccountant.DEFAULT_ALPHAS`` and of dp-accounting's ``DEFAULT_RDP_ORDERS``
up to 64, built with the same floating-point expressions so numbers agree
bit for bit on shared orders.
"""

from __future__ import annotations

DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)]  # 1.1 ... 10.9 (same floats as Opacus)
    + [float(a) for a in range(11, 65)]  # 11 ... 64
    + [128.0, 256.0, 512.0, 1024.0]
)
"""157 orders: 1.1–10.9 by 0.1, the integers 11–64, and 128, 256, 512, 1024."""
