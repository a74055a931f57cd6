"""Task lo7, item 5: a ``fork()`` while another thread held a DrawnRates' recording lock
(drawing a batch from the sampler) left the child's copy of the lock held by a thread the
child does not have: the child's next draw waited for ever. The child now makes the lock
anew (``os.register_at_fork``), as the handle registry does for its own lock. A real fork;
a child that would hang is ended by its alarm and fails the test."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from privguard.integrations._drawn_rates import DrawnRates


class _Sampler:
    sample_rate = 0.25

    def __iter__(self):
        return iter([[0, 1], [2]])


class _Loader:
    num_workers = 0

    def __init__(self) -> None:
        self.batch_sampler = _Sampler()


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.fork")
def test_a_child_forked_while_another_thread_records_a_draw_draws_again():
    rates = DrawnRates(_Loader(), 0.25)
    held, release = threading.Event(), threading.Event()

    def drawing() -> None:  # another thread, inside _drawn at the fork
        with rates._recording_lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=drawing)
    thread.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                signal.alarm(20)
                batches = list(rates.sampler)  # two draws, recorded
                code = 0 if len(batches) == 2 and rates.since == 2 else 3
            finally:
                os._exit(code)
    finally:
        release.set()
        thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # -14: hung, ended by its alarm
    assert list(rates.sampler) == [[0, 1], [2]]  # the parent's lock was its own all along
    rates.restore()
