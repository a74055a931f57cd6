"""A checkout's package laid out as the wheel installs it, for a benchmark's subprocess.

The wheel maps the top-level ``integrations/`` folder onto ``privguard.integrations``
(pyproject's ``package-dir``). A checkout put first on ``PYTHONPATH`` as it is lacks that
subpackage: only an editable install of some checkout supplied it (review rhk for
``attach_overhead.py --against``; CI62 for ``quickstart_cost.py --against``, which
imported the checkout's bare ``privguard/`` and failed on the installed wheel).
"""

from __future__ import annotations

import os
import shutil


def as_installed(checkout: str, into: str) -> str:
    """A folder to put first on ``PYTHONPATH`` (and to run in) whose ``privguard`` is
    ``checkout``'s, with its ``integrations/`` as ``privguard.integrations``.

    Raises:
        RuntimeError: ``checkout`` has no ``privguard/`` or no ``integrations/`` folder.
    """
    parts = [os.path.join(checkout, name) for name in ("privguard", "integrations")]
    if not all(os.path.isdir(p) for p in parts):
        raise RuntimeError(f"{checkout}: failed: no privguard/ and integrations/ folders "
                           "to import a package from")
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(parts[0], os.path.join(into, "privguard"), ignore=skip)
    shutil.copytree(parts[1], os.path.join(into, "privguard", "integrations"), ignore=skip)
    return into
