"""Review ir: an integration review of the merged branches lc + rlc, pl + rpl, gc + rgc."""

from __future__ import annotations

import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("folder", ["privguard", "integrations"])
def test_every_module_compiles_with_warnings_as_errors(folder):
    # rgc's "``all_gather``\ s" in integrations/_distributed.py's docstring: an invalid
    # escape sequence (a DeprecationWarning on 3.11, a SyntaxWarning from 3.12, an error
    # under `python -W error`, which then cannot import the DDP coordinator)
    for path in sorted((ROOT / folder).rglob("*.py")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
