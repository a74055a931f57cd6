"""Adversarial pass fs: a forged ``state_dict`` whose header fields are not of the types
privguard writes is refused with ``LedgerStateError``, never a built-in exception.

Each test failed before: a non-ASCII checksum (plain JSON, e.g. an edited file) raised
``TypeError`` from ``hmac.compare_digest``; an array as format, version or keyed raised
``ValueError`` (the truth value of an array); an object whose ``==`` or ``str`` raises
let that exception escape.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from privguard import Ledger, LedgerStateError
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
