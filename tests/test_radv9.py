"""Review radv9 of task adv9: Opacus' accountant calls after attach, the δ beside a logged ε,
and what the odometer states for a witnessed run (docs/theory.md §16.5).

Each test of a fix failed on adv9's head:

1. ``engine.accountant.get_privacy_spent(delta=...)`` (Opacus' ``RDPAccountant`` call) raised
   ``AttributeError`` after ``attach(..., privacy_engine=engine)``, and on a
   ``LedgerAccountant``: a built-in exception out of a public call. It now answers
   ``(get_epsilon(delta), nan)``: the mixture odometer has no best order.
2. A witnessed run's odometer statement (``guarantee()`` after a retarget, ``privguard
   report``'s running ε) stated the tail bound alone; it is proven for the run without the
   witnesses' refusals only (docs/theory.md §16.5).
"""

from __future__ import annotations

import math
import warnings

import pytest

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M

DELTA = 1e-5


def _engine_view(ledger: Ledger):
    pytest.importorskip("opacus")
    from test_opacus_integration import make_private, train

    from privguard.integrations.opacus import attach

    engine, model, opt, loader = make_private(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    return engine, handle, (model, opt, loader, train)


def test_get_privacy_spent_after_attach_answers_the_ledgers_epsilon_with_no_best_order():
    ledger = Ledger(8.0, DELTA)
    engine, handle, (model, opt, loader, train) = _engine_view(ledger)
    acc = engine.accountant
    eps, order = acc.get_privacy_spent(delta=DELTA)  # AttributeError on adv9's head
    assert eps == 0.0 and math.isnan(order)  # nothing charged yet, as Opacus says 0
    train(model, opt, loader, 3)
    eps, order = acc.get_privacy_spent(delta=DELTA)
    assert eps == ledger.epsilon(DELTA) == acc.get_epsilon(DELTA) == engine.get_epsilon(DELTA)
    assert eps > 0 and math.isnan(order)
    assert acc.get_privacy_spent(delta=1e-3)[0] == ledger.epsilon(1e-3)  # at the δ asked
    with pytest.raises(InvalidArgumentError, match="alphas"):
        acc.get_privacy_spent(delta=DELTA, alphas=[2.0, 8.0])
    with pytest.raises(InvalidArgumentError):
        acc.get_privacy_spent(delta=-1.0)
    # the other calls an Opacus user makes on privacy_engine.accountant keep Opacus' meaning
    assert acc.history == engine.accountant.wrapped.history and len(acc) == 1
    assert acc.history[0][2] == 3 and acc.mechanism() == "privguard"
    state = acc.state_dict()
    assert state["mechanism"] == "rdp" and "privguard" in state
    handle.detach()


def test_a_ledger_accountant_answers_get_privacy_spent_too():
    pytest.importorskip("opacus")
    from privguard.integrations.opacus import LedgerAccountant

    acc = LedgerAccountant(Ledger(delta=DELTA))
    acc.step(noise_multiplier=1.0, sample_rate=0.01)
    eps, order = acc.get_privacy_spent(delta=DELTA)
    assert eps == acc.get_epsilon(DELTA) > 0 and math.isnan(order)
    with pytest.raises(InvalidArgumentError, match="alphas"):
        acc.get_privacy_spent(delta=DELTA, alphas=(2, 3))
def _witnessed(path, retarget: bool) -> Ledger:
    ledger = Ledger(8.0, DELTA, path=path)
    step = M.SubsampledGaussian(1.0, 0.01)
    ledger.charge(step)
    ledger.charge(M.DeltaReserve(share=1e-3, min_order=float(ledger.orders[0])),
                  label="witnesses: δ set aside for false alarms")
    ledger.charge(step, times=99)
    if not retarget:
        return ledger
    ledger.close()
    return Ledger(9.0, DELTA, path=path, retarget="after the witnessed run")


def test_a_witnessed_ledgers_odometer_statement_says_what_is_proven(tmp_path):
    from privguard._accounting._results import WITNESSED  # task radv9
    from privguard._cli._report import report

    ledger = _witnessed(str(tmp_path / "w.db"), retarget=True)
    claim = ledger.guarantee()
    assert claim.kind == "odometer" and claim.delta == DELTA
    assert claim.statement.endswith(WITNESSED) and "§16.5" in claim.statement
    assert report(ledger)["running_statement"].endswith(WITNESSED)
    ledger.close()
    # with its target fixed in advance the filter's statement is Proposition 16.4's: unchanged
    fixed = _witnessed(str(tmp_path / "f.db"), retarget=False)
    assert fixed.guarantee().kind == "filter" and WITNESSED not in fixed.guarantee().statement
    assert report(fixed)["running_statement"].endswith(WITNESSED)
    fixed.close()
    # a run without witnesses states the tail bound alone
    plain = Ledger(delta=DELTA)
    plain.charge(M.SubsampledGaussian(1.0, 0.01), times=100)
    assert WITNESSED not in plain.guarantee().statement
    assert WITNESSED not in report(plain)["running_statement"]


@pytest.mark.parametrize("steps", [1, 100, 3000])
def test_the_reserve_makes_the_mixture_odometer_hold_at_the_freed_delta(steps):
    """Proposition 16.5: with the reserve in its spent curve the mixture odometer at δ is
    never below the one of the run without it at (1 − r)·δ."""
    share = 1e-3
    with_reserve, without = Ledger(8.0, DELTA), Ledger(8.0, DELTA)
    step = M.SubsampledGaussian(1.0, 0.01)
    with_reserve.charge(step)
    with_reserve.charge(M.DeltaReserve(share=share, min_order=float(with_reserve.orders[0])))
    without.charge(step)
    if steps > 1:
        with_reserve.charge(step, times=steps - 1)
        without.charge(step, times=steps - 1)
    assert with_reserve.epsilon() >= without.epsilon((1 - share) * DELTA) > without.epsilon()


@pytest.mark.parametrize("make", [lambda: Ledger(delta=DELTA),
                                  lambda: Ledger(orders=[2.0, 8.0], rdp_budget=[1.0, 4.0],
                                                 delta=DELTA)],
                         ids=["odometer", "rdp-budget"])
def test_the_engine_warning_claims_no_filter_for_a_ledger_without_a_target(make):
    """Review radv9: attach's ``engine.get_epsilon`` warning said "it may exceed the target
    while the filter's guarantee holds" for a ledger with no (ε, δ) target."""
    pytest.importorskip("opacus")
    from test_opacus_integration import make_private
    from test_review_rnw import _engine_warning

    ledger = make()
    assert ledger.target is None
    engine, _model, opt, loader = make_private(accountant="prv")
    handle, text = _engine_warning(engine, opt, loader, ledger)
    assert "filter's guarantee" not in text and "no (ε, δ) target" in text, text
    assert ledger.guarantee().kind == "odometer"
    handle.detach()


def _retargeted(path: str) -> Ledger:
    first = Ledger(6.0, 1e-6, path=path)
    first.charge(M.SubsampledGaussian(1.0, 0.02), times=50)
    first.close()
    return Ledger(6.0, 1e-3, path=path, retarget="looser δ, after outputs")


def test_lightning_logs_the_delta_its_epsilon_is_stated_at(tmp_path):
    """Review radv9: ``privacy/epsilon`` was logged alone; after a retarget it is stated at
    the δ the ledger was created with, not ``ledger.delta``."""
    pytest.importorskip("lightning")
    from test_lightning import Tiny, trainer

    from privguard.integrations.lightning import LedgerCallback

    ledger = _retargeted(str(tmp_path / "l.db"))
    t = trainer(LedgerCallback(ledger), max_steps=3)
    t.fit(Tiny())
    logged = t.callback_metrics
    assert ledger.delta == 1e-3
    assert 1e-6 <= logged["privacy/delta"].item() < 1.0001e-6  # float32, rounded up
    assert logged["privacy/epsilon"].item() >= ledger.epsilon() == ledger.epsilon(1e-6)
    ledger.close()


def test_hugging_face_logs_the_delta_its_epsilon_is_stated_at(tmp_path):
    pytest.importorskip("transformers")
    from test_huggingface import make_trainer

    ledger = _retargeted(str(tmp_path / "l.db"))
    trainer, _cb = make_trainer(tmp_path, ledger, max_steps=2, save_strategy="no")
    trainer.train()
    rows = [h for h in trainer.state.log_history if "privacy_epsilon" in h]
    assert rows and all(1e-6 <= h["privacy_delta"] < 1.0001e-6 for h in rows)
    assert rows[-1]["privacy_epsilon"] >= ledger.epsilon(1e-6)
    ledger.close()
