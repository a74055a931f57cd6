"""Stored curves and totals against today's: a curve may have been revised up, never down.

A journal, a 0.1 ledger file or a ``state_dict`` records spent curves computed by the
privguard version that wrote it. Loading one recomputes them from the recorded
mechanisms and uses the recomputed values. Two changes raised values since 0.2, never
lowered them, at the orders where the older evaluation was below the true RDP
(docs/theory.md §1.1):

* issue z27, step 2b: integer orders at tiny q (far below RDP_RTOL of the epsilon that
  matters, or from 0 at q < 1e-10);
* step 3b's tolerance (this module's change): fractional orders where Opacus' series
  stopped early were kept up to 1e-4 (relative) below the stable estimate.

So a recorded value may lie below today's by up to :data:`REVISION_RTOL` (relative),
and no more than round-off above it. The recomputed, larger values are the ones used, so
accepting such a record never lowers what the ledger holds as spent: the ledger does not
go backwards. A recorded value further below is refused as before (edited or another
mechanism), and one above today's is refused as before (a curve would have gone down).
"""

from __future__ import annotations

import numpy as np

from privguard._validation import RDP_ATOL, RDP_RTOL

REVISION_RTOL = 1e-4
"""How far (relative) a recorded value may lie below today's curve: the old step 3b
tolerance of Opacus' fractional series (privguard/_curves/_sgm.py, FRACTIONAL_RTOL
before this change); integer-order revisions at tiny q are covered by RDP_ATOL."""


def revised_up_only(recomputed: np.ndarray, recorded: np.ndarray) -> bool:
    """Whether ``recorded`` is ``recomputed`` up to round-off, or below it by at most
    REVISION_RTOL (relative): recorded ≤ recomputed·(1 + RDP_RTOL) + RDP_ATOL and
    recorded ≥ recomputed·(1 − REVISION_RTOL) − RDP_ATOL, elementwise; shapes must match.
    Infinite values must match exactly (an ∞ is never a revision)."""
    new = np.asarray(recomputed, dtype=float)
    old = np.asarray(recorded, dtype=float)
    if new.shape != old.shape:
        return False
    finite = np.isfinite(new) & np.isfinite(old)
    if not np.array_equal(new[~finite], old[~finite]):
        return False
    n, o = new[finite], old[finite]
    return bool(np.all(o <= n * (1.0 + RDP_RTOL) + RDP_ATOL)
                and np.all(o >= n * (1.0 - REVISION_RTOL) - RDP_ATOL))
