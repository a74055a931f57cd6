"""Task wr: a retarget after ``attach(..., witnesses=True)``; does any statement claim more than
Proposition 16.4 covers (docs/theory.md §16.2, §16.5)?

The witnesses' false-alarm total a is sized at attach, at the target (ε_T, δ_T) in force then
(``reserve_for``); a retarget does not resize it. What the ledger states afterwards:

* ``guarantee()`` falls back to the odometer at δ₀, the δ the ledger was created with, never the
  filter's (ε, δ)-DP at the new target (docs/theory.md §4); ``privguard report`` states no
  (ε, δ)-DP for the retargeted target either; ``budget()`` is a meter and ``repr`` a
  description: none states DP. These pass on main too: they pin it.
* The sentence a witnessed ledger's odometer statement carries (``WITNESSED``) bounds
  Proposition 16.6's ε by "the target ε the witnesses were sized for" without naming it: after a
  retarget to ε = 20 the report printed the target ε = 20 beside it, while (1+e^ε)·a ≤ r·δ holds
  only up to the ε = 8 the witnesses were sized at. The statement now names that ε (the smallest
  target ε the ledger has had) — failed on main.
"""

from __future__ import annotations

import warnings

import pytest

from privguard import Ledger
from privguard import mechanisms as M

DELTA = 1e-5


def _witnessed_then_retargeted(path: str, created: tuple[float, float],
                               *retargets: tuple[float, float]) -> Ledger:
    """A file ledger created at ``created`` with a witnessed run's charges (the step, then the
    witnesses' δ reserve after it, as ``attach(..., witnesses=True)`` charges them), reopened
    with each of ``retargets`` in turn."""
    ledger = Ledger(*created, path=path)
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger.charge(step)
    ledger.charge(M.DeltaReserve(share=1e-3, min_order=float(ledger.orders[0])),
                  label="witnesses: δ set aside for false alarms")
    ledger.charge(step, times=49)
    for i, target in enumerate(retargets):
        ledger.close()
        ledger = Ledger(*target, path=path, retarget=f"after the witnessed run ({i})")
    return ledger


def _printed(ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> str:
    from privguard._cli._report import print_report, report

    capsys.readouterr()
    print_report(report(ledger))
    return capsys.readouterr().out


@pytest.mark.parametrize("retarget", [(20.0, DELTA), (8.0, 1e-7), (20.0, 1e-3)])
def test_no_statement_claims_the_filter_at_a_target_set_after_the_witnessed_run(
        tmp_path, capsys, retarget):
    """Passes on main too: it pins that no output states (ε, δ)-DP at the retargeted target."""
    ledger = _witnessed_then_retargeted(str(tmp_path / "w.db"), (8.0, DELTA), retarget)
    epsilon, delta = retarget
    claim = ledger.guarantee()
    assert claim.kind == "odometer" and claim.delta == DELTA  # δ₀, fixed before the first output
    assert "-DP for the whole interaction" not in claim.statement
    assert f"(ε = {epsilon:g}, δ = {delta:g})" not in claim.statement
    if delta < DELTA:
        assert "is smaller, was chosen after outputs and is not covered" in claim.statement
    from privguard._cli._report import report

    data = report(ledger)
    assert data["statement_kind"] == "odometer" and data["risk"] is None
    assert "no (ε, δ)-DP statement for the whole interaction" in data["target_statement"]
    assert data["running_delta"] == DELTA
    out = _printed(ledger, capsys)
    assert "-DP for the whole interaction" not in out
    assert "interaction is (" not in out
    # the meter and the description state no DP
    assert ")-DP" not in str(ledger.budget()) and ")-DP" not in repr(ledger)
    ledger.close()


@pytest.mark.parametrize("created, retargets, sized", [
    ((8.0, DELTA), [(20.0, DELTA)], "8"),  # the brief's case: a larger ε after the run
    ((8.0, DELTA), [(20.0, DELTA), (30.0, DELTA)], "8"),
    ((20.0, DELTA), [(6.5, DELTA), (20.0, DELTA)], "6.5"),  # 6.5 was in force in between
])
def test_the_witnessed_statement_names_the_epsilon_the_witnesses_cover(
        tmp_path, capsys, created, retargets, sized):
    """Failed on main: the statement named no ε, and the report printed the retargeted ε = 20
    as "the target" beside "at most the target ε the witnesses were sized for"."""
    ledger = _witnessed_then_retargeted(str(tmp_path / "w.db"), created, *retargets)
    bound = f"take ε ≤ {sized}, the smallest target ε this ledger has had"
    assert bound in ledger.guarantee().statement
    from privguard._cli._report import report

    assert bound in report(ledger)["running_statement"]
    assert bound in _printed(ledger, capsys)
    ledger.close()


def test_a_witnessed_ledger_without_a_retarget_names_its_own_target(tmp_path):
    from privguard._cli._report import report

    ledger = _witnessed_then_retargeted(str(tmp_path / "w.db"), (8.0, DELTA))
    assert ledger.guarantee().kind == "filter"  # Proposition 16.4's statement, unchanged
    assert "take ε ≤ 8," in report(ledger)["running_statement"]
    ledger.close()


def test_an_attached_run_then_a_retarget_to_a_larger_epsilon(tmp_path):
    """The same through ``attach(..., witnesses=True)`` (Opacus): the reserve is the one
    attach charges, and the statement after the retarget names the ε it was sized at."""
    pytest.importorskip("torch")
    pytest.importorskip("opacus")
    from test_opacus_integration import make_private, train

    from privguard.integrations.opacus import attach

    path = str(tmp_path / "w.db")
    ledger = Ledger(8.0, DELTA, path=path)
    _engine, model, opt, loader = make_private()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    train(model, opt, loader, 2)
    assert any(isinstance(r.mechanism, M.DeltaReserve) for r in ledger._acc.journal.runs())
    handle.detach()
    ledger.close()
    ledger = Ledger(20.0, DELTA, path=path, retarget="a larger ε after the witnessed run")
    claim = ledger.guarantee()
    assert claim.kind == "odometer" and claim.delta == DELTA
    assert "take ε ≤ 8, the smallest target ε this ledger has had" in claim.statement
    ledger.close()


def test_the_report_claims_no_filter_guarantee_beside_the_running_epsilon_after_a_retarget(
        tmp_path, capsys):
    """Failed on main: after a retarget ``privguard report`` said the running ε "may exceed the
    target while the filter's guarantee holds", a guarantee it states nowhere (its statement is
    the odometer's, docs/theory.md §4)."""
    ledger = _witnessed_then_retargeted(str(tmp_path / "w.db"), (8.0, DELTA), (0.5, DELTA))
    out = _printed(ledger, capsys)
    assert "above the target ε = 0.5" in out  # the line the sentence ends
    assert "the filter's guarantee holds" not in out
    assert "no filter's guarantee is stated: the target was set by a retarget" in out
    ledger.close()
    # with its target fixed in advance the sentence is unchanged
    fixed = _witnessed_then_retargeted(str(tmp_path / "f.db"), (8.0, DELTA))
    assert "may exceed the target while the filter's guarantee holds" in _printed(fixed, capsys)
    fixed.close()
