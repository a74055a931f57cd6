"""Review rhk (adversarial pass over task hk: DrawnRates.rate's one-rate shortcut).

The shortcut must give the window's answer (main's ``DrawnRates.rate``) bit for bit in
every state a run can reach: real iterators of the sampler alive and dropped, more draws
than the record keeps, the prefetch depth, the record replaced from outside, and a step
read while a draw is being recorded (a loop that draws on a thread of its own).
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from collections import deque
from itertools import islice
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from _private_mlp import private as _private  # noqa: E402
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402

from privguard.integrations import _drawn_rates  # noqa: E402


def _main_rate(drawn: _drawn_rates.DrawnRates, charged: float) -> float:
    """main's ``DrawnRates.rate`` (before task hk) on ``drawn``'s state, without its side
    effect: the largest rate of the window read from the newest draw back."""
    window = drawn.since + drawn.before + drawn.ahead * max(1, len(drawn._iterators))
    q = max(charged, max(islice(reversed(list(drawn.rates)), window), default=charged))
    return max(q, drawn.last) if not drawn.since else q


def _bits(x: float) -> tuple:
    return ("nan",) if x != x else (x, math.copysign(1.0, x))


@functools.lru_cache(maxsize=1)
def _loader():
    return _private(batch_size=8)[2]


_RATES = st.sampled_from([0.125, 0.25, 1.0, 0.0, -0.0, math.inf, -math.inf, math.nan,
                          "not a number", 1e-300])
_CHARGED = st.sampled_from([0.125, 0.0625, 0.5, 0.0, -0.0, math.nan])


class _Run(RuleBasedStateMachine):
    """Draws (through real iterators of the loader's sampler and directly), steps, the
    prefetch depth and the record replaced; every step's rate against main's."""

    def __init__(self) -> None:
        super().__init__()
        self.sampler = _loader().batch_sampler
        self.sampler.sample_rate = 0.125
        self.drawn = _drawn_rates.DrawnRates(_loader(), 0.125)
        self.iterators: list = []

    def teardown(self) -> None:
        self.iterators.clear()
        self.drawn.restore()
        self.sampler.sample_rate = 0.125

    @rule(rate=_RATES, n=st.sampled_from([1, 2, _drawn_rates._KEPT + 3]))
    def draw(self, rate, n):
        self.sampler.sample_rate = rate
        for _ in range(n):
            self.drawn._drawn(None)

    @rule(rate=_RATES.filter(lambda r: not isinstance(r, str)))  # the sampler compares
    def draw_through_an_iterator(self, rate):
        self.sampler.sample_rate = rate
        if not self.iterators:
            self.iterators.append(iter(self.sampler))
        try:
            next(self.iterators[-1])
        except StopIteration:
            self.iterators.pop()

    @rule()
    def open_an_iterator(self):
        self.iterators.append(iter(self.sampler))

    @rule()
    def drop_an_iterator(self):
        if self.iterators:
            self.iterators.pop(0)

    @rule(ahead=st.sampled_from([0, 1, 4]))
    def prefetch(self, ahead):
        self.drawn.ahead = ahead

    @rule(kept=st.lists(st.sampled_from([0.125, 0.5]), max_size=5))
    def replace_the_record(self, kept):
        self.drawn.rates = deque(kept, maxlen=_drawn_rates._KEPT)

    @rule(charged=_CHARGED)
    def step(self, charged):
        expected = _main_rate(self.drawn, charged)
        assert _bits(self.drawn.rate(charged)) == _bits(expected)
        self.drawn.take()

    @invariant()
    def no_nan_kept(self):
        assert all(r == r for r in self.drawn.rates)


_Run.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_the_rate_is_mains_in_every_reachable_state = _Run.TestCase


class _Racing(_drawn_rates.DrawnRates):
    """A DrawnRates whose ``since`` setter (``_drawn``'s ``self.since += 1``) reads the
    step's rate there, as a training thread may while a loader thread records a draw."""

    def __init__(self, *args, **kwargs):
        self.seen: list[tuple[float, float]] = []
        self.racing = False
        super().__init__(*args, **kwargs)

    @property
    def since(self) -> int:  # type: ignore[override]
        return self.__dict__["since"]

    @since.setter
    def since(self, value: int) -> None:
        if self.racing and self.rates:
            # what the other thread's step reads here: this rate against main's
            self.seen.append((self.rate(0.125), _main_rate(self, 0.125)))
        self.__dict__["since"] = value


def test_a_step_read_while_a_larger_draw_is_recorded_is_charged_as_on_main():
    # hk recorded a draw's rate, then counted it, then marked the record mixed: a step read
    # on another thread in between saw the new rate in the record but the one-rate flag
    # still set, and charged the old rate, where main's window (the newest draw first)
    # charged the new, larger one
    drawn = _Racing(_loader(), 0.125)
    try:
        drawn.sampler.sample_rate = 0.125
        drawn._drawn(None)
        drawn.racing = True
        drawn.sampler.sample_rate = 0.5
        drawn._drawn(None)
        assert drawn.seen, "the race was not modelled"
        assert all(got == main for got, main in drawn.seen), drawn.seen
        assert drawn.seen[-1][1] == 0.5
    finally:
        drawn.restore()
        drawn.sampler.sample_rate = 0.125


_BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
_ROOT = _BENCHMARKS.parent


def _run(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=300)


def test_attach_overheads_this_tree_is_this_tree_not_the_installed_privguard(tmp_path):
    # review rhk: --against's worker for "this tree" imported whichever privguard the
    # interpreter found (an installed release, another checkout's editable install) and
    # printed its times as this tree's; here one comes first on PYTHONPATH and refuses
    installed = tmp_path / "installed" / "privguard"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("raise ImportError('the installed privguard')\n")
    # the commit's library: this tree's files laid out as the wheel (no git needed here)
    code = f"""
import os, shutil, sys
sys.path.insert(0, {str(_BENCHMARKS)!r})
import attach_overhead as bench

def library_of(commit, into):
    src = os.path.join(into, "commit")
    shutil.copytree({str(_ROOT / "privguard")!r}, os.path.join(src, "privguard"))
    shutil.copytree({str(_ROOT / "integrations")!r},
                    os.path.join(src, "privguard", "integrations"))
    return src

bench._library_of = library_of
os.environ["PYTHONPATH"] = {str(installed.parent)!r}
bench.against("COMMIT", 1, bench.WARMUP + 1, ["attach, in memory"])
"""
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| attach, in memory")]
    assert [row.split("|")[2].strip() for row in rows] == ["this tree", "COMMIT"], done.stdout


def test_attach_overheads_worker_refuses_a_library_it_did_not_import(tmp_path):
    # the worker checks what it imported against the library it was started for
    done = subprocess.run(
        [sys.executable, str(_BENCHMARKS / "attach_overhead.py"), "--worker", str(tmp_path),
         "--library", str(tmp_path / "elsewhere")],
        input="", capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert "not from" in done.stderr and str(tmp_path / "elsewhere") in done.stderr
