"""Shared pieces of the training-framework callbacks (private)."""

from __future__ import annotations

from typing import Any

from privguard._errors import InvalidArgumentError
from privguard._optional import require

__all__ = ["find_dp_optimizer", "require"]


def find_dp_optimizer(candidates: Any):
    """The Opacus DPOptimizer among ``candidates``, unwrapping framework wrappers."""
    from opacus.optimizers import DPOptimizer

    found = []
    for opt in candidates if isinstance(candidates, (list, tuple)) else [candidates]:
        seen = 0
        while opt is not None and not isinstance(opt, DPOptimizer) and seen < 5:
            opt = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
            seen += 1
        if isinstance(opt, DPOptimizer):
            found.append(opt)
    if len(found) != 1:
        raise InvalidArgumentError(
            "optimizer", candidates,
            f"expected exactly one Opacus DPOptimizer, found {len(found)}")
    return found[0]
