"""``silenced()`` (the Optuna integration's quiet scope) leaves the process as it found it,
also when scopes of several threads overlap (trials run in threads)."""

from __future__ import annotations

import logging
import threading
import warnings

import pytest

pytest.importorskip("optuna")

from privguard.integrations._optuna_sampler import silenced


def _state():
    logger = logging.getLogger("optuna")
    return list(warnings.filters), logger.level, logger.propagate


def test_overlapping_scopes_of_two_threads_restore_the_filters_and_the_logger():
    """A enters, B enters, A leaves, B leaves: each scope restoring what it saw left the
    warnings ignored and Optuna's logger silenced for good (B saved A's silence)."""
    before = _state()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def first():
        with silenced():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def second():
        a_in.wait(10)
        with silenced():
            b_in.set()
            a_out.wait(10)
            with warnings.catch_warnings(record=True) as caught:  # still silenced after A left
                warnings.warn("a trial's warning", UserWarning, stacklevel=1)
            seen["caught"] = len(caught)
            seen["level"] = logging.getLogger("optuna").getEffectiveLevel()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"caught": 0, "level": logging.CRITICAL + 1}
    assert _state() == before


def test_a_scope_drops_warnings_and_optuna_lines_and_restores_after_an_error():
    before = _state()
    with pytest.raises(RuntimeError), silenced():
        with silenced():  # nested in one thread
            pass
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn("dropped", UserWarning, stacklevel=1)
        assert caught == []
        assert logging.getLogger("optuna.study").getEffectiveLevel() > logging.CRITICAL
        raise RuntimeError("a trial failed")
    assert _state() == before
