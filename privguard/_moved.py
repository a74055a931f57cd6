"""Where the private modules of privguard 0.2 went (issue 30): one table, one import hook.

A pickle made by privguard 0.2 names classes by private module paths
(``privguard._curve.RDPCurve``), and those modules moved into the layer folders.
:func:`install` (called once by ``privguard/__init__.py``) lets ``import
privguard._curve`` return the module that holds that code now, so such a pickle
loads. Nothing in privguard imports an old path. (``privguard._ledger`` and
``privguard._mechanisms`` are folders now: their ``__init__`` serves the old names.)

Example:
    >>> import importlib, privguard
    >>> importlib.import_module("privguard._curve").RDPCurve is privguard.RDPCurve
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

#: An old private module path → the module that holds its code now.
MOVED: dict[str, str] = {
    "privguard._accumulated": "privguard._mechanisms._accumulated",
    "privguard._allocation": "privguard._mechanisms._allocation",
    "privguard._base": "privguard._mechanisms._base",
    "privguard._budget": "privguard._accounting._budget",
    "privguard._curve": "privguard._mechanisms._curve",
    "privguard._deviation": "privguard._accounting._deviation",
    "privguard._journal": "privguard._accounting._journal",
    "privguard._odometer": "privguard._accounting._odometer",
    "privguard._plan": "privguard._accounting._plan",
    "privguard._repeat_select": "privguard._mechanisms._repeat_select",
    "privguard._results": "privguard._accounting._results",
    "privguard._runs": "privguard._mechanisms._runs",
    "privguard._shares": "privguard._accounting._shares",
    "privguard._subset": "privguard._mechanisms._subset",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old path of :data:`MOVED` to the module that holds the code now."""

    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder, replaced in sys.modules by exec_module

    def exec_module(self, module: ModuleType) -> None:
        # the import system returns what sys.modules holds after this call: the real
        # module, whose own __spec__ and __name__ are left untouched
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


def install() -> None:
    """Put the hook on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
