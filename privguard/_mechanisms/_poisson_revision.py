"""Why a ledger holding Poisson random-K tuning, written before a change of its curve, is refused.

``RepeatAndSelect(base, Poisson(μ))`` is charged differently from before the fix of
docs/theory.md §7, "K = 0 (Poisson)": seed 002 Theorem 6 as stated leaves out the
outcome K = 0 and under-counts for μ < 1 (now more), and the joint-convexity bound is
lower at some orders (now less); and since task lo4 Theorem 6's δ̂ is rounded up
(docs/theory.md §7, "Rounding of δ̂"), which raised the curve again (by up to 1.78·10⁻⁵
relative where measured, μ ≤ 10⁴: scripts/lo4_poisson_sweep.py). A ledger (file,
journal or ``state_dict``) written before either change replays to today's curve, which
can differ from what it recorded (by more than the revision tolerance of privguard/_stores/_revision.py), exceed what its budget
admitted, or derive other choices from its plan; loading then refuses it, and stays
refusing (no migration: the old record may be below what was released). The
refusals name a row, a checkpoint, a total or a fix entry, which says nothing of this
cause; :func:`poisson_tuning_hint` adds it where the ledger holds such a tuner.
"""

from __future__ import annotations

from typing import Any

from privguard._mechanisms._base import Mechanism

HINT = (
    ". This ledger holds Poisson random-K tuning (RepeatAndSelect(..., Poisson(μ))), whose "
    "curve this privguard computes differently from older versions, in two changes: "
    "(1) the fix of docs/theory.md §7 \"K = 0 (Poisson)\" (Papernot & Steinke 2022, "
    "Theorem 6, leaves out the outcome K = 0 and under-counts for μ < 1; a joint-convexity "
    "bound is lower at some orders), and (2) Theorem 6's δ̂ rounded up (docs/theory.md §7, "
    "\"Rounding of δ̂\"), which raised the curve by up to 1.78·10⁻⁵ (relative) where it "
    "was measured "
    "(μ ≤ 10⁴); a rise beyond the revision tolerance of 10⁻⁴ refuses. If it was written "
    "before either change, this is why it does not load, and it stays refused, because what "
    "it recorded may be below what was released. Read it with the privguard that wrote it, "
    "and go on in a new ledger whose budget leaves room for its spend as this privguard "
    "charges it (charge its runs there again); if it was not, it was edited")


def _holds(data: Any) -> bool:
    """Whether the JSON data (a mechanism's or plan's dict, or lists of them) holds a
    RepeatAndSelect whose runs are Poisson, at any depth (iterative: no recursion limit)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            params = item.get("params")
            runs = params.get("runs") if isinstance(params, dict) else None
            if (item.get("type") == "RepeatAndSelect" and isinstance(runs, dict)
                    and runs.get("type") == "Poisson"):
                return True
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def poisson_tuning_hint(*sources: Any) -> str:
    """:data:`HINT` when any source (a mechanism, a journal run, whose ``mechanism`` is
    read, or JSON data of mechanisms) holds Poisson random-K tuning, else "". Never
    raises: it only words a refusal that is raised anyway."""
    try:
        mechs = [getattr(s, "mechanism", s) for s in sources]
        data = [m.to_dict() if isinstance(m, Mechanism) else m for m in mechs]
        return HINT if _holds(data) else ""
    except Exception:  # by design: a hint must not replace the refusal it words
        return ""
