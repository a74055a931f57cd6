"""Review rbi: counter-examples to branch bi's hardening (and its merge into fin4).

Each test failed on fin4's head (3b19c4e) before the fix beside it.
"""

from __future__ import annotations

import pytest

from privguard import Ledger
from privguard import mechanisms as M


@pytest.mark.parametrize("tail", [".", ".."])
def test_plot_with_a_trailing_dot_prints_and_checks_the_path_matplotlib_writes(
        tmp_path, capsys, tail):
    # matplotlib writes "budget." as budget.png (it strips the dots and appends its format):
    # bi's fix took "." for an extension, printed "budget." and let the image replace a
    # ledger stored as budget.png (review bx's check ran on the other name)
    pytest.importorskip("matplotlib")
    from privguard._cli._cli import main

    ledger = Ledger(3.0, 1e-5, path=str(tmp_path / "budget.png"))
    ledger.charge(M.SubsampledGaussian(1.1, 0.01), times=3)
    ledger.close()
    before = (tmp_path / "budget.png").read_bytes()
    assert main(["plot", str(tmp_path / "budget.png"), "-o", str(tmp_path / ("budget" + tail)),
                 "--no-prv"]) == 2
    assert "the ledger's own file" in capsys.readouterr().err
    assert (tmp_path / "budget.png").read_bytes() == before
    assert main(["plot", str(tmp_path / "budget.png"), "-o", str(tmp_path / ("out" + tail)),
                 "--no-prv"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out.png")
    assert (tmp_path / "out.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.filterwarnings("error")
def test_hybrid_allocation_plan_main_certified_above_bi_s_bound_still_opens(tmp_path):
    # main certified RandomAllocation(1e7, t) plans in about 2 s and wrote their ledgers;
    # bi's bound σ₀ ≤ 10⁶ refused the plan, and reopening such a ledger failed its fix check
    from privguard import InvalidArgumentError, Plan

    plan = Plan(M.RandomAllocation(1e7, 2), 3)
    path = str(tmp_path / "a.db")
    ledger = Ledger(1.0, 1e-5, plan=plan, filter="hybrid", path=path)
    ledger.charge(M.RandomAllocation(1e7, 2))
    ledger.close()
    again = Ledger(1.0, 1e-5, plan=plan, filter="hybrid", path=path)
    assert len(again.runs) == 1
    again.close()
    with pytest.raises(InvalidArgumentError, match=r"noise_multiplier >= 0.5 and <= 1e\+12"):
        Ledger(1.0, 1e-5, plan=Plan(M.RandomAllocation(1e13, 2), 3), filter="hybrid")
