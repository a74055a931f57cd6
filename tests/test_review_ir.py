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


def test_ddp_ghost_uneven_shared_file_leases_prefetch_fork_and_a_refusal(tmp_path):
    """The merged branches together under DDP (tests/_ddp_worker.py::interplay)."""
    pytest.importorskip("opacus")
    import _ddp_worker
    import test_ddp

    from privguard import Ledger
    from privguard import mechanisms as M

    db = str(tmp_path / "interplay.db")
    Ledger(50.0, _ddp_worker.DELTA, path=db).close()  # created before the ranks open it
    r0, r1 = test_ddp.launch("interplay", str(tmp_path), 50.0)
    for r in (r0, r1):
        assert r["prefetch"] and r["forks"] == 14 * 2
        assert r["applied"] == r["charged"] == 45, (r0, r1)
        assert r["charged_before"] == r["charged_after_refusal"] == 40
        assert r["unchanged"] and r["refused"] is not None
    assert r1["refused"] == "InvalidArgumentError"
    q = _ddp_worker.BATCH / _ddp_worker.N
    two = M.AccumulatedSubsampledGaussian(_ddp_worker.SIGMA, q, 2)
    ledger = Ledger.open(db)
    assert {r.mechanism for r in ledger.history} == {two}  # every step at the largest k
    assert len(ledger.history) - ledger.leased_unused == 45  # released: each step once
