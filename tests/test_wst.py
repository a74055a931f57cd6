"""Task wst: an independent check of docs/theory.md §16.5 (review radv9).

1. ``reserve_for`` sized the witnesses' false-alarm total a from the ledger's current target
   (ε_T, δ_T), while its odometer's statements (``guarantee()`` after a retarget, ``privguard
   report``'s running ε) are made at δ₀, the δ it was created with. A ledger at (8, 1e-6)
   retargeted to (8, 1e-3) before attach had (1 + e⁸)·a ≈ 1e-6 = δ₀: Proposition 16.6 then
   gave (8, ≈2e-6)-DP, not the (8, 1e-6) its statement names. a is now sized at the smallest
   δ any statement of the ledger is made at (failed on radv9's head).
2. A reserve charge the ledger refuses (``BudgetExhausted`` after the witnessed step's own
   charge) leaves that step unapplied: no step is released under witnesses without its
   reserve in the ledger. (Passes on radv9's head too: it pins the fail-closed order.)
3. The sentence a witnessed ledger's odometer statement carries (``WITNESSED``) names
   Proposition 16.6's conditions: ε fixed before the first output, at most the target ε the
   witnesses were sized for (failed on radv9's head).
"""

from __future__ import annotations

import math
import warnings

import pytest

from privguard import BudgetExhausted, Ledger
from privguard import mechanisms as M

torch = pytest.importorskip("torch")


def _false_alarm_total(ledger: Ledger) -> float:
    from privguard.integrations._witnesses import STATISTICAL, reserve_for

    alpha, _ = reserve_for(ledger)
    return STATISTICAL * alpha


@pytest.mark.parametrize("created, retargeted", [(1e-6, 1e-3), (1e-5, 1e-5), (1e-3, 1e-6)])
def test_the_false_alarms_are_sized_at_every_delta_a_statement_is_made_at(
        tmp_path, created, retargeted):
    from privguard._accounting._results import stated_delta

    path = str(tmp_path / "w.db")
    Ledger(8.0, created, path=path).close()
    ledger = Ledger(8.0, retargeted, path=path, retarget="before the witnessed run")
    a, share = _false_alarm_total(ledger), 1e-3
    # Proposition 16.6 (docs/theory.md §16.5) at the δ the odometer is stated at, and
    # Proposition 16.4 at the target's δ: (1 + e^ε_T)·a ≤ r·δ at both
    for delta in (stated_delta(ledger._acc), ledger.target[1]):
        assert (1.0 + math.exp(8.0)) * a <= share * delta
    ledger.close()


def _between(step: M.Mechanism, delta: float) -> float:
    """A target ε whose filter admits ``step`` and then refuses the witnesses' reserve
    (bisection on fresh ledgers; the reserve costs about 0.01 in ε, docs/theory.md §16.2)."""
    def admits(epsilon: float, reserve: bool) -> bool:
        ledger = Ledger(epsilon, delta)
        if not ledger.can_afford(step):
            return False
        ledger.charge(step)
        return not reserve or ledger.can_afford(
            M.DeltaReserve(share=1e-3, min_order=float(ledger.orders[0])))

    lo, hi = 1e-3, 50.0  # hi admits both, lo neither
    assert admits(hi, True) and not admits(lo, False)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if admits(mid, True) else (mid, hi)
    assert admits(lo, False) and not admits(lo, True)
    return lo


def test_a_refused_reserve_leaves_the_witnessed_step_unapplied():
    """Item 5 of task wst: the reserve is charged after the first witnessed step's charge;
    when the ledger refuses it, the step is refused too (not applied, nothing of it kept for a
    later step), and every later step until the reserve is in the ledger."""
    pytest.importorskip("opacus")
    from test_opacus_integration import make_private, params

    from privguard.integrations.opacus import attach

    _engine, model, opt, loader = make_private()
    step = M.SubsampledGaussian(opt.noise_multiplier, 1 / len(loader))
    ledger = Ledger(_between(step, 1e-5), 1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    before = params(model)
    batches = iter(loader)
    for i in range(3):  # the first refusal is the reserve's, the later ones their step's
        x, y = next(batches)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with pytest.raises(BudgetExhausted, match="witnesses" if i == 0 else "step"):
            opt.step()
        assert all(torch.equal(p, b) for p, b in zip(params(model), before))
        assert all(p.grad is None for p in model.parameters())
    runs = ledger._acc.journal.runs()
    assert runs and not any(isinstance(r.mechanism, M.DeltaReserve) for r in runs)
    assert handle.steps_charged == 0
    handle.detach()


def test_the_witnessed_sentence_names_proposition_16_6s_conditions(tmp_path):
    """Item 4 of task wst: the sentence a witnessed ledger's odometer statement carries named
    neither that Proposition 16.6's ε is fixed before the first output nor that it is at most
    the target ε the witnesses were sized for (their δ is sized at it)."""
    path = str(tmp_path / "w.db")
    ledger = Ledger(8.0, 1e-5, path=path)
    ledger.charge(M.SubsampledGaussian(1.0, 0.01))
    ledger.charge(M.DeltaReserve(share=1e-3, min_order=float(ledger.orders[0])))
    ledger.close()
    ledger = Ledger(9.0, 1e-5, path=path, retarget="after the witnessed run")
    statement = ledger.guarantee().statement
    assert "fixed before the first output" in statement
    assert "at most the target ε the witnesses were sized for" in statement
    ledger.close()
