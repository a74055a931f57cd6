"""Task hk (issue 26, item 2): attach's per-step work, cut without changing a charge.

Each shortcut of the step hook is checked two ways: it is taken (the work it skips is
not done on the common path), and it gives the answer of the path it replaces, bit for
bit, on random sequences (Hypothesis).
"""

from __future__ import annotations

import functools
import math
from itertools import islice

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from _private_mlp import private as _private  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from privguard.integrations import _drawn_rates  # noqa: E402


def _window_rate(drawn: _drawn_rates.DrawnRates, charged: float) -> float:
    """What ``DrawnRates.rate`` answered before task hk: the largest rate of the window
    read from the newest draw back (review rsmp), at least the last step's after no draw."""
    window = drawn.since + drawn.before + drawn.ahead * max(1, len(drawn._iterators))
    q = max(charged, max(islice(reversed(list(drawn.rates)), window), default=charged))
    return max(q, drawn.last) if not drawn.since else q


def _same_float(a: float, b: float) -> bool:
    return (a == b and math.copysign(1.0, a) == math.copysign(1.0, b)) or (a != a and b != b)


def test_a_step_after_draws_at_one_rate_reads_no_window(monkeypatch):
    # every batch drawn at the loader's q (the common case): the step's rate is q without
    # reading the window of recent draws (it read it at every step: ~4 µs of attach's hook)
    _model, _opt, loader = _private(batch_size=8)
    q = loader.batch_sampler.sample_rate
    drawn = _drawn_rates.DrawnRates(loader, q)
    try:
        for _ in range(50):
            drawn._drawn(None)
        read = []
        monkeypatch.setattr(_drawn_rates, "islice", lambda *a: read.append(a) or islice(*a))
        assert drawn.rate(q / 2) == q
        assert read == []
    finally:
        drawn.restore()


_RATES = st.sampled_from([0.125, 0.25, 0.5, 1.0, 0.0, -0.0, math.nan, 1e-300])
_OPS = st.lists(st.one_of(st.tuples(st.just("draw"), _RATES),
                          st.tuples(st.just("step"), st.sampled_from([0.125, 0.0625, 0.5]))),
                max_size=40)


@functools.lru_cache(maxsize=1)
def _loader():
    return _private(batch_size=8)[2]


@settings(max_examples=300, deadline=None)
@given(ops=_OPS, ahead=st.sampled_from([0, 1, 4]))
def test_the_rate_is_the_windows_rate_bit_for_bit(ops, ahead):
    # the shortcut (every kept rate alike) against the window it replaces, on random draws
    # and steps: rates equal and not, 0.0 and -0.0 (equal, not the same float), NaN
    loader = _loader()
    drawn = _drawn_rates.DrawnRates(loader, 0.125)
    drawn.ahead = ahead
    try:
        for op, value in ops:
            if op == "draw":
                drawn.sampler.sample_rate = value
                drawn._drawn(None)
            else:
                expected = _window_rate(drawn, value)
                assert _same_float(drawn.rate(value), expected)
                drawn.take()
    finally:
        drawn.restore()
