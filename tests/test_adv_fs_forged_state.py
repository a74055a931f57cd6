"""Adversarial pass fs: a forged ``state_dict`` whose header fields are not of the types
privguard writes is refused with ``LedgerStateError``, never a built-in exception.

Each test failed before: a non-ASCII checksum (plain JSON, e.g. an edited file) raised
``TypeError`` from ``hmac.compare_digest``; an array as format, version or keyed raised
``ValueError`` (the truth value of an array); an object whose ``==`` or ``str`` raises
let that exception escape.
"""

from __future__ import annotations

import copy
import pickle
import sqlite3
import warnings

import numpy as np
import pytest

from privguard import InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M


class _RaisingCompare:
    """A value whose comparison, str and repr all raise (what a pickle can carry)."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("compared")

    __ne__ = __eq__  # type: ignore[assignment]

    def __str__(self) -> str:
        raise RuntimeError("str")

    __repr__ = __str__


@pytest.fixture(scope="module")
def ledger_and_state():
    ledger = Ledger(epsilon=8.0, delta=1e-5)
    ledger.charge(M.Gaussian(5.0), "b")
    return ledger, ledger.state_dict()


FORGED = [
    ("checksum", "é" * 64),
    ("checksum", _RaisingCompare()),
    ("format", np.array([1.0, 2.0])),
    ("format", _RaisingCompare()),
    ("version", np.array([2, 2])),
    ("version", _RaisingCompare()),
    ("keyed", np.array([1.0, 2.0])),
]


@pytest.mark.parametrize(("key", "value"), FORGED, ids=lambda x: type(x).__name__)
def test_a_forged_header_field_is_refused_by_the_class_loader(ledger_and_state, key, value):
    _, state = ledger_and_state
    forged = copy.deepcopy(state)
    forged[key] = value
    with pytest.raises(LedgerStateError, match=key):
        Ledger.load_state_dict(forged)


@pytest.mark.parametrize(("key", "value"), FORGED, ids=lambda x: type(x).__name__)
def test_a_forged_header_field_is_refused_in_place_and_changes_nothing(ledger_and_state, key,
                                                                       value):
    ledger, state = ledger_and_state
    before = ledger.epsilon()
    forged = copy.deepcopy(state)
    forged[key] = value
    with pytest.raises(LedgerStateError, match=key):
        ledger.load_state_dict(forged)
    assert ledger.epsilon() == before
    assert ledger.state_dict() == state


def _keyed(monkeypatch) -> None:
    monkeypatch.setenv("PRIVGUARD_LEDGER_KEY", "s3cret")
    monkeypatch.delenv("PRIVGUARD_LEDGER_KEY_FILE", raising=False)


@pytest.mark.parametrize("check", ["é" * 64, 7, None], ids=["non-ascii", "int", "none"])
def test_a_keyed_state_with_a_forged_key_check_is_refused(monkeypatch, check):
    # "é": compare_digest raised TypeError (non-ASCII str), before the checksum was read.
    _keyed(monkeypatch)
    ledger = Ledger(epsilon=8.0, delta=1e-5)
    ledger.charge(M.Gaussian(5.0), "b")
    state = copy.deepcopy(ledger.state_dict())
    assert state["keyed"] is True
    state["key_check"] = check
    with pytest.raises(LedgerStateError, match="ledger key"):
        Ledger.load_state_dict(state)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_keyed_file_with_a_non_ascii_key_check_is_refused(tmp_path, monkeypatch, read_only):
    # An edited meta row: opening raised TypeError, and `privguard verify` printed
    # "error: TypeError" with exit status 1 instead of refusing the file.
    _keyed(monkeypatch)
    path = tmp_path / "k.db"
    ledger = Ledger(epsilon=8.0, delta=1e-5, path=path)
    ledger.charge(M.Gaussian(5.0), "b")
    ledger.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'key_check'", ("é" * 64,))
    conn.commit()
    conn.close()
    with pytest.raises(LedgerStateError, match="ledger key"):
        Ledger.open(path, read_only=read_only)


def _edited_pickle(ledger: Ledger, old: str, new: str) -> bytes:
    data = pickle.dumps(ledger)
    # SHORT_BINUNICODE: the opcode, one length byte, the UTF-8 text
    before, after = (b"\x8c" + bytes([len(x)]) + x.encode() for x in (old, new))
    assert data.count(before) == 1 and len(before) == len(after)
    return data.replace(before, after)


def test_an_edited_pickle_of_an_in_memory_ledger_is_refused():
    # the payload's key "state" renamed: KeyError before
    ledger = Ledger(epsilon=8.0, delta=1e-5)
    ledger.charge(M.Gaussian(5.0), "b")
    with pytest.raises(LedgerStateError, match="pickle"):
        pickle.loads(_edited_pickle(ledger, "state", "stale"))


def test_an_edited_pickle_of_a_file_ledger_is_refused(tmp_path):
    # the reference's key "path" renamed: KeyError before
    ledger = Ledger(epsilon=8.0, delta=1e-5, path=tmp_path / "p.db")
    ledger.charge(M.Gaussian(5.0), "b")
    try:
        with pytest.raises(LedgerStateError, match="pickle"):
            pickle.loads(_edited_pickle(ledger, "path", "pith"))
    finally:
        ledger.close()


@pytest.mark.parametrize("history", [5, None, [1, 2], "ab", [(1.1, 0.01)], [(1.1, "x", 2)],
                                     np.array([[1.1, 0.01, 2]])], ids=repr)
def test_a_ledger_accountant_state_with_a_malformed_history_is_refused_before_loading(history):
    # 5, None, [1, 2]: TypeError after the ledger had been restored; "ab", a row of two
    # or a row holding a string loaded as the accountant's history, and an array too
    pytest.importorskip("opacus")
    from privguard.integrations.opacus import LedgerAccountant

    source = LedgerAccountant(Ledger(epsilon=8.0, delta=1e-5))
    source.step(noise_multiplier=1.1, sample_rate=0.01)
    state = dict(source.state_dict())
    state["history"] = history
    target = LedgerAccountant(Ledger(epsilon=8.0, delta=1e-5))
    with pytest.raises(InvalidArgumentError, match=r"state_dict\['history'\]"):
        target.load_state_dict(state)
    assert len(target.ledger.runs) == 0 and target.history == []


def _engine_attached():
    """An Opacus engine (RDP accountant) whose optimizer is attached to a fresh ledger,
    after one epoch of 4 steps."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("opacus")
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from privguard.integrations.opacus import attach

    model = torch.nn.Linear(2, 1)
    loader = DataLoader(TensorDataset(torch.randn(20, 2), torch.randn(20, 1)), batch_size=5)
    engine = PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0)
        ledger = Ledger(epsilon=8.0, delta=1e-5)
        attach(optimizer, ledger, data_loader=loader, privacy_engine=engine)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return engine, ledger


@pytest.mark.parametrize(("key", "name"), [("history", r"state_dict\['history'\]"),
                                           ("format", "privguard")], ids=["history", "format"])
def test_an_engine_checkpoint_holding_an_array_is_refused(key, name):
    # ValueError (the truth value of an array) from Opacus' history read back, or from the
    # entry's format compared element-wise
    engine, _ = _engine_attached()
    state = copy.deepcopy(engine.accountant.state_dict())
    if key == "history":
        state["history"] = np.array([1, 2])
    else:
        state["privguard"]["format"] = np.array([1, 2])
    fresh, ledger = _engine_attached()
    before = ledger.epsilon()
    with pytest.raises((InvalidArgumentError, LedgerStateError), match=name):
        fresh.accountant.load_state_dict(state)
    assert ledger.epsilon() == before
