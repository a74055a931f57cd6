"""Optional dependencies: imported on first use, with an install hint when missing."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``, or raise ImportError naming the extra that provides it.

    Example:
        >>> require("json", "none").dumps(1)
        '1'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"this part of privguard needs {module!r}: pip install 'privguard[{extra}]' "
            "(install torch==2.13.0 first on a CPU-only machine)") from exc
