"""Review rhm (adversarial pass over task hm: attach's per-step cost, issue 26).

Task hm re-arms ``DrawnRates``' one-rate shortcut in ``_drawn`` (the flag cleared once
the record holds one rate again) and leaves ``_rank_checks`` out of a step with neither
a ghost counter nor a dropout guard.
"""

from __future__ import annotations

import threading
from itertools import islice

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from _private_mlp import private as _private  # noqa: E402

from privguard.integrations import _drawn_rates  # noqa: E402

_KEPT = _drawn_rates._KEPT


def _window_rate(drawn: _drawn_rates.DrawnRates, charged: float) -> float:
    """main's ``DrawnRates.rate`` (the window read from the newest draw back), without
    its side effect."""
    window = drawn.since + drawn.before + drawn.ahead * max(1, len(drawn._iterators))
    q = max(charged, max(islice(reversed(list(drawn.rates)), window), default=charged))
    return max(q, drawn.last) if not drawn.since else q


class _Paused(_drawn_rates.DrawnRates):
    """A DrawnRates whose ``_mixed`` setter, on the thread named ``paused``, waits (at
    most ``wait`` seconds) for another thread's draw right after marking the record mixed:
    two loader threads drawing from one sampler, one preempted inside ``_drawn``."""

    def __init__(self, *args, **kwargs):
        self.paused: threading.Thread | None = None
        self.marked = threading.Event()
        self.go_on = threading.Event()
        self.wait = 2.0
        super().__init__(*args, **kwargs)

    @property
    def _mixed(self) -> bool:  # type: ignore[override]
        return self.__dict__["_mixed"]

    @_mixed.setter
    def _mixed(self, value: bool) -> None:
        self.__dict__["_mixed"] = value
        if value and threading.current_thread() is self.paused:
            self.marked.set()
            self.go_on.wait(self.wait)


def test_a_draw_on_another_thread_does_not_rearm_the_shortcut_over_a_larger_draw():
    # hm's re-arm: thread 2 draws at 0.5 and marks the record mixed; before it records
    # the 0.5, thread 1 finishes a draw at 0.125 (the record's one rate), sees the flag
    # set and every kept rate 0.125, and clears it; thread 2 then records its 0.5. The
    # shortcut answered 0.125 for a step whose window holds a batch drawn at 0.5
    drawn = _Paused(_private(batch_size=8)[2], 0.125)
    try:
        drawn.sampler.sample_rate = 0.125
        for _ in range(_KEPT):
            drawn._drawn(None)
        drawn.take()
        drawn.sampler.sample_rate = 0.5
        second = threading.Thread(target=drawn._drawn, args=(None,))
        drawn.paused = second
        second.start()
        assert drawn.marked.wait(30), "the second thread did not draw"
        drawn.sampler.sample_rate = 0.125
        first = threading.Thread(target=drawn._drawn, args=(None,))
        first.start()
        first.join(drawn.wait / 2)  # on hm it ends here; under a lock it waits for the 2nd
        drawn.go_on.set()
        first.join(30)
        second.join(30)
        assert not first.is_alive() and not second.is_alive()
        assert 0.5 in drawn.rates
        assert _window_rate(drawn, 0.125) == 0.5
        assert drawn.rate(0.125) == 0.5
    finally:
        drawn.go_on.set()
        drawn.restore()
        drawn.sampler.sample_rate = 0.125


def test_every_charged_step_runs_the_rank_checks(monkeypatch):
    # hm called _rank_checks only where a ghost counter or a dropout guard exists,
    # restating its conditions beside it: a check added there would run on no plain
    # step. Whatever it checks, it runs before every charge outside DDP
    from _private_mlp import step

    from privguard import Ledger
    from privguard.integrations.opacus import AttachHandle, attach

    calls: list[int] = []
    original = AttachHandle._rank_checks

    def counted(self):
        calls.append(self.steps_charged)
        return original(self)

    monkeypatch.setattr(AttachHandle, "_rank_checks", counted)
    model, opt, loader = _private()
    handle = attach(opt, Ledger(delta=1e-5), data_loader=loader)
    assert handle.ghost is None and handle.dropout_guard is None
    for _ in range(3):
        step(model, opt, loader)
    assert handle.steps_charged == 3
    assert calls == [0, 1, 2]
    handle.detach()


class _RearmedWhileRead(_drawn_rates.DrawnRates):
    """A DrawnRates whose first read of ``_mixed`` after ``racing`` is set records
    ``_KEPT`` draws at ``next_rate`` first: a loader thread re-arming the shortcut at a new
    rate while a step reads its rate on the training thread."""

    def __init__(self, *args, **kwargs):
        self.racing = False
        self.next_rate = 0.5
        super().__init__(*args, **kwargs)

    @property
    def _mixed(self) -> bool:  # type: ignore[override]
        if self.racing:
            self.racing = False
            self.sampler.sample_rate = self.next_rate
            for _ in range(_KEPT):
                self._drawn(None)
        return self.__dict__["_mixed"]

    @_mixed.setter
    def _mixed(self, value: bool) -> None:
        self.__dict__["_mixed"] = value


def test_a_step_read_while_the_shortcut_is_rearmed_at_a_larger_rate_reads_that_rate():
    # hm's memory-order argument: rate() reads the flag, then the rate (the re-arm writes
    # the rate, then clears the flag). Read the other way round, a step read the old
    # rate (0.125), the loader thread then re-armed at 0.5 (every kept draw at 0.5), and
    # the step saw the flag cleared: charged 0.125 for a window of 0.5 draws only
    drawn = _RearmedWhileRead(_private(batch_size=8)[2], 0.125)
    try:
        drawn.sampler.sample_rate = 0.125
        for _ in range(3):
            drawn._drawn(None)
        drawn.sampler.sample_rate = 0.25
        drawn._drawn(None)  # the record mixed: the re-arm below has a flag to clear
        drawn.take()
        drawn.racing = True
        got = drawn.rate(0.125)
        assert not drawn.racing, "the race was not modelled"
        assert set(drawn.rates) == {0.5} and not drawn.__dict__["_mixed"]
        assert got == _window_rate(drawn, 0.125) == 0.5
    finally:
        drawn.restore()
        drawn.sampler.sample_rate = 0.125


class _ReadWhileRearming(_drawn_rates.DrawnRates):
    """A DrawnRates whose ``_same`` setter, once ``racing``, reads the step's rate before
    writing: a training thread reading while a loader thread re-arms the shortcut."""

    def __init__(self, *args, **kwargs):
        self.racing = False
        self.seen: list[tuple[float, float]] = []
        super().__init__(*args, **kwargs)

    @property
    def _same(self) -> float | None:  # type: ignore[override]
        return self.__dict__["_same"]

    @_same.setter
    def _same(self, value: float | None) -> None:
        if self.racing:
            self.seen.append((self.rate(0.125), _window_rate(self, 0.125)))
        self.__dict__["_same"] = value


def test_a_step_read_while_the_shortcut_is_rearmed_reads_the_window():
    # the re-arm writes the rate, then clears the flag: a step read between the writes
    # reads the window (the flag still set). The other way round it read the old rate
    # with the flag cleared: 0.125 for a record of 0.5 draws only
    drawn = _ReadWhileRearming(_private(batch_size=8)[2], 0.125)
    try:
        drawn.sampler.sample_rate = 0.125
        drawn._drawn(None)
        drawn.sampler.sample_rate = 0.5
        for _ in range(_KEPT - 1):
            drawn._drawn(None)
        drawn.take()
        drawn.racing = True
        drawn._drawn(None)  # the last 0.125 leaves the record: re-armed at 0.5
        assert drawn.seen, "the race was not modelled"
        assert all(got == window == 0.5 for got, window in drawn.seen), drawn.seen
        assert not drawn.__dict__["_mixed"] and drawn.rate(0.125) == 0.5
    finally:
        drawn.restore()
        drawn.sampler.sample_rate = 0.125
