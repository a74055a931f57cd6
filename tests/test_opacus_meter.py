"""Issue 25: after attach, engine.get_epsilon is the ledger's any-time ε, and attach says so once."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("opacus")

from test_opacus_integration import DELTA, make_private, train

from privguard import Ledger
from privguard._accounting._results import upper
from privguard.integrations.opacus import AccountantWarning, attach

warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def test_attach_with_the_engine_warns_once_naming_both_numbers():
    engine, model, opt, loader = make_private(accountant="prv")
    train(model, opt, loader, 8)  # steps Opacus' accountant recorded before attach
    theirs = engine.get_epsilon(DELTA)
    ledger = Ledger(8.0, DELTA)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    about = [w for w in caught if issubclass(w.category, AccountantWarning)
             and "engine.get_epsilon" in str(w.message)]
    assert len(about) == 1
    text = str(about[0].message)
    # both rounded up (review rlo2)
    assert f"({upper(ledger.epsilon(), '.4g')} now)" in text and \
        f"({upper(theirs, '.4g')} now)" in text
    assert "PRV" in text and "ledger.budget()" in text and "guarantee()" in text
    # the engine now reports the valid running ε, not Opacus' PRV number
    assert engine.get_epsilon(DELTA) == ledger.epsilon() > theirs
    train(model, opt, loader, 4)
    assert engine.get_epsilon(DELTA) == ledger.epsilon()
