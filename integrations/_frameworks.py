"""Shared pieces of the training-framework callbacks (private)."""

from __future__ import annotations

import importlib
from typing import Any

from privguard._errors import InvalidArgumentError


def require(module: str, extra: str) -> Any:
    """Import an optional framework, or fail with an install hint."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"this privguard integration needs {module!r}: pip install 'privguard[{extra}]' "
            f"(install torch==2.13.0 first on a CPU-only machine)") from exc


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
