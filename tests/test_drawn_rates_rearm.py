"""Issue 26, task hm: DrawnRates' one-rate shortcut comes back once the record holds one rate.

Task hk's shortcut (a step's rate without reading the window of recent draws) stayed off
for the rest of the run after one draw at another rate (a batch-size schedule that changed
the rate once). It is re-armed when every kept rate is one nonzero rate again; its answer
must stay the window's (main's ``DrawnRates.rate``) bit for bit in every reachable state.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("opacus")

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from test_review_rhk import _bits, _loader, _main_rate

from privguard.integrations import _drawn_rates

_KEPT = _drawn_rates._KEPT


def _drawn_at(drawn: _drawn_rates.DrawnRates, rate, n: int) -> None:
    drawn.sampler.sample_rate = rate
    for _ in range(n):
        drawn._drawn(None)


def test_the_shortcut_is_rearmed_when_every_kept_rate_is_one_again(monkeypatch):
    drawn = _drawn_rates.DrawnRates(_loader(), 0.125)
    try:
        _drawn_at(drawn, 0.5, 3)  # drawn at 0.5, then the rate lowered for good
        _drawn_at(drawn, 0.125, _KEPT - 1)
        expected = _main_rate(drawn, 0.125)
        assert expected == 0.5  # a 0.5 draw is still kept, and in the window
        assert drawn.rate(0.125) == expected
        _drawn_at(drawn, 0.125, 1)  # the last 0.5 draw leaves the record

        def window(*_a, **_k):
            raise AssertionError("the window was read: the shortcut stayed off")

        expected = _main_rate(drawn, 0.0625)
        monkeypatch.setattr(_drawn_rates, "islice", window)
        assert _bits(drawn.rate(0.0625)) == _bits(expected) == _bits(0.125)
        _drawn_at(drawn, 0.25, 1)  # another rate: the window again, with the new draw
        monkeypatch.undo()
        assert drawn.rate(0.0625) == _main_rate(drawn, 0.0625) == 0.25
    finally:
        drawn.restore()
        drawn.sampler.sample_rate = 0.125


_RATES = st.sampled_from([0.125, 0.25, 0.0, -0.0, 1e-300, "not a number"])


class _Schedule(RuleBasedStateMachine):
    """Runs of draws long enough to fill the record at one rate, and steps between them;
    every step's rate against main's window, and the shortcut's premise at all times."""

    def __init__(self) -> None:
        super().__init__()
        self.drawn = _drawn_rates.DrawnRates(_loader(), 0.125)

    def teardown(self) -> None:
        self.drawn.restore()
        self.drawn.sampler.sample_rate = 0.125

    @rule(rate=_RATES, n=st.sampled_from([1, 2, _KEPT - 1, _KEPT, _KEPT + 1]))
    def draw(self, rate, n):
        _drawn_at(self.drawn, rate, n)

    @rule(ahead=st.sampled_from([0, 1, 4]))
    def prefetch(self, ahead):
        self.drawn.ahead = ahead

    @rule(charged=st.sampled_from([0.125, 0.0625, 0.5, 0.0, -0.0]))
    def step(self, charged):
        expected = _main_rate(self.drawn, charged)
        assert _bits(self.drawn.rate(charged)) == _bits(expected)
        self.drawn.take()

    @invariant()
    def the_shortcut_only_where_every_kept_rate_is_its_rate(self):
        drawn = self.drawn
        if not drawn._mixed and drawn._same is not None:
            assert all(_bits(r) == _bits(drawn._same) for r in drawn.rates)


_Schedule.TestCase.settings = settings(max_examples=40, stateful_step_count=12,
                                       deadline=None)
test_the_rearmed_rate_is_mains_in_every_reachable_state = _Schedule.TestCase
