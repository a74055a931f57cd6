"""Opacus' subsampled-Gaussian RDP analysis, loaded without importing torch.

privguard computes the Poisson-subsampled Gaussian's curve with Opacus' own
``opacus.accountants.analysis.rdp.compute_rdp`` (Mironov, Talwar & Zhang
2019), so that a ledger and Opacus' ``RDPAccountant`` agree bit for bit.
Importing it the usual way runs ``opacus/__init__.py``, which imports torch
(seconds and hundreds of MiB) although the analysis itself needs only numpy
and scipy. This module loads that one source file of the installed Opacus
under a private name, on first use, so ``import privguard`` and
``privguard report`` never load torch.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from types import ModuleType

_INSTALL_HINT = "privguard needs opacus to compute subsampled-Gaussian curves: pip install opacus"


@functools.lru_cache(maxsize=1)
def _module() -> ModuleType:
    spec = importlib.util.find_spec("opacus")  # locates the package; does not run it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(_INSTALL_HINT)
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "accountants", "analysis", "rdp.py")
        if os.path.exists(path):
            break
    else:  # pragma: no cover - every Opacus >= 1.4 ships this file
        raise ImportError(f"{_INSTALL_HINT} (no accountants/analysis/rdp.py in {spec.origin})")
    file_spec = importlib.util.spec_from_file_location("privguard._opacus_analysis_rdp", path)
    assert file_spec is not None and file_spec.loader is not None
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module


def compute_rdp() -> Callable[..., object]:
    """Opacus' ``compute_rdp(q, noise_multiplier, steps, orders)``."""
    return _module().compute_rdp
