"""What a tuning run releases (issue 14, items 1 and 2): the winner, nothing else.

* the exact hockey-stick δ of the release, at the charged ε, for candidates
  that adapt their spend to their own output (and the δ of the releases that
  are NOT covered: the former (runs, failed), and (winner, K));
* failures (raise, NaN, ±inf, non-numbers, refusals) are ⊥ and leave no trace;
* only the current best is alive during a run;
* an interruption or an error of the tuner itself leaves no candidate's data
  in the exception, its context, or any frame of its traceback.
"""

from __future__ import annotations

import gc
import io
import logging
import math
import re
import subprocess
import sys
import textwrap
import traceback
import weakref
from contextlib import redirect_stderr, redirect_stdout
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from privguard import Ledger, RDPCurve
from privguard import mechanisms as M
from privguard.tuning import (
    DPHyPOSearch,
    Geometric,
    Poisson,
    RandomSearch,
    SubsetSearch,
    TuningAborted,
)
from privguard.tuning._base import accept, as_score
from privguard.tuning._executors import SerialExecutor

EPS0 = 0.1
KEEP = math.exp(EPS0) / (1 + math.exp(EPS0))  # randomized response keeps the bit w.p. KEEP


# --- item 1: the release meets the charged bound, exactly -----------------------------------
def rr_objective(bit: int, rng: np.random.Generator):
    """The issue's candidate: one 0.1-DP randomized response of the private bit; when it
    answers 1 it tries a second step, which its child ledger (declared: one step) refuses."""

    def objective(params, child):
        child.charge(M.PureDP(EPS0))
        answer = bit if rng.random() < KEEP else 1 - bit
        if answer == 1:
            child.charge(M.PureDP(EPS0))  # refused: BudgetExhausted, the candidate is ⊥
        return 1.0, "model"

    return objective


def hockey_stick(p: np.ndarray, q: np.ndarray, eps: float) -> float:
    """max over both directions of Σ_y [P(y) − e^ε Q(y)]_+ for two laws on the same outcomes."""
    return max(np.maximum(p - math.exp(eps) * q, 0).sum(),
               np.maximum(q - math.exp(eps) * p, 0).sum())


def laws(runs, answer_one: float, kmax: int = 1500):
    """The laws of three releases, by enumerating K and the candidates' answers.

    A candidate is ⊥ exactly when it answers 1 (probability ``answer_one``); every other
    candidate returns the same (params, score, artifact), so the winner is either that
    or ⊥ ("no candidate selected"), and P[⊥ | K = k] = answer_one^k. Outcomes with
    K > kmax are dropped: P[K > 1500] = 0.98^1500 < 1e-13 for Geometric(mean 50).

    Returns the law of the winner (2 outcomes), of (winner, K) and of (K, failures) —
    the last two as one array per k, each weighted by P[K = k].
    """
    ks = range(0 if isinstance(runs, Poisson) else 1, kmax)
    bottom = sum(runs.pmf(k) * answer_one ** k for k in ks)
    winner = np.array([bottom, 1 - bottom])
    winner_and_k = [runs.pmf(k) * np.array([answer_one ** k, 1 - answer_one ** k]) for k in ks]
    runs_and_failed = [runs.pmf(k) * stats.binom.pmf(np.arange(k + 1), k, answer_one)
                       for k in ks]
    return winner, np.concatenate(winner_and_k), np.concatenate(runs_and_failed)


def test_released_output_meets_the_charged_bound_exactly():
    runs = Geometric(mean=50.0)
    tuner = RandomSearch({"x": [1]}, runs, cost=M.PureDP(EPS0), progress=False)
    ledger = Ledger(epsilon=1.0, delta=1e-5)
    result = tuner.run(rr_objective(1, np.random.default_rng(0)), ledger)
    assert set(vars(result)) == {"selected", "params", "score", "artifact", "cost", "seeded"}
    charged = ledger.history[0].mechanism
    eps = RDPCurve(ledger.orders, charged.rdp(ledger.orders)).epsilon(1e-5)
    assert eps == pytest.approx(0.3129, abs=1e-4)
    assert eps == pytest.approx(tuner.plan(1e-5, ledger.orders).epsilon, rel=1e-12)

    # neighbouring datasets: the private bit is 1 (D) or 0 (D')
    on_d, on_d2 = laws(runs, KEEP), laws(runs, 1 - KEEP)
    winner, winner_and_k, runs_and_failed = (hockey_stick(a, b, eps) for a, b in zip(on_d, on_d2))
    ratio = math.log(on_d[0][0] / on_d2[0][0])
    print(f"\ncharged ε = {eps:.4f} at δ = 1e-5; hockey-stick δ at that ε: winner {winner:.3g} "
          f"(log-ratio of P[no winner] {ratio:.3f}), (winner, K) {winner_and_k:.3g}, "
          f"(runs, failed) {runs_and_failed:.3g}")
    assert winner <= 1e-5            # what is released: covered at the ledger's δ
    assert winner == 0.0             # in fact pure here: log(P[⊥|D]/P[⊥|D']) = 0.196 < 0.313
    assert winner_and_k > 1e-5       # releasing K with the winner would NOT be covered
    assert winner_and_k == pytest.approx(4.93e-4, rel=1e-2)
    assert runs_and_failed == pytest.approx(0.149, abs=1e-3)  # the measurement


@pytest.mark.parametrize("bit", [0, 1])
def test_the_tuner_releases_the_law_the_bound_was_checked_on(bit):
    # The real tuner, simulated on both datasets: P[no winner] = Σ_k P[K=k]·P[answer 1]^k.
    runs = Geometric(mean=3.0)
    rng = np.random.default_rng(100 + bit)
    n, bottoms = 3000, 0
    for seed in range(n):
        tuner = RandomSearch({"x": [1]}, runs, cost=M.PureDP(EPS0), seed=seed, progress=False)
        result = tuner.run(rr_objective(bit, rng), Ledger(epsilon=1.0, delta=1e-5))
        if not result.selected:
            bottoms += 1
        else:
            assert (result.params, result.score, result.artifact) == ({"x": 1}, 1.0, "model")
    p_one = KEEP if bit == 1 else 1 - KEEP
    expected = laws(runs, p_one, kmax=400)[0][0]
    se = math.sqrt(expected * (1 - expected) / n)
    assert abs(bottoms / n - expected) < 4 * se


# --- item 2: failures are ⊥ -------------------------------------------------------------
SECRET = "s3cr3t-7d1f"


def failing(params, child):
    kind = params["kind"]
    child.charge(M.Gaussian(10.0))
    if kind == "raises":
        raise FloatingPointError(f"loss diverged {SECRET} at {params}")
    if kind == "refused":
        child.charge(M.Gaussian(10.0))  # one step more than declared
    if kind == "keyerror":
        return {}["missing " + SECRET]
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "string": "0.99",
            "none": None, "bool": True, "complex": 1j, "array": np.ones(3),
            "dict-no-score": {"artifact": SECRET}, "list": [0.9, "x"],
            "ok": (0.25, "winner-model")}[kind]


KINDS = ["raises", "refused", "keyerror", "nan", "inf", "-inf", "string", "none", "bool",
         "complex", "array", "dict-no-score", "list"]


@pytest.mark.parametrize("mode", ["max", "min"])
def test_every_kind_of_failure_is_bottom_and_the_run_goes_on(mode, caplog):
    caplog.set_level(logging.DEBUG)
    out, err = io.StringIO(), io.StringIO()
    tuner = RandomSearch({"kind": [*KINDS, "ok"]}, Poisson(60.0), cost=M.Gaussian(10.0),
                         mode=mode, seed=11, progress=True)
    with redirect_stdout(out), redirect_stderr(err):
        result = tuner.run(failing, Ledger(epsilon=50.0, delta=1e-5))
    assert result.selected and result.params == {"kind": "ok"}
    assert (result.score, result.artifact) == (0.25, "winner-model")
    text = out.getvalue() + err.getvalue() + caplog.text + repr(result)
    assert SECRET not in text and "diverged" not in text and "raises" not in text


def test_all_failures_select_nothing():
    tuner = RandomSearch({"kind": KINDS}, Poisson(30.0), cost=M.Gaussian(10.0), seed=2,
                         progress=False)
    result = tuner.run(failing, Ledger(epsilon=50.0, delta=1e-5))
    assert not result.selected and result.params is None and result.artifact is None
    assert repr(result) == "TuningResult(no candidate selected)"


@pytest.mark.parametrize("value,score", [
    (0.5, 0.5), (np.float32(0.25), 0.25), (np.int64(3), 3.0), (Decimal("0.5"), 0.5),
    (Fraction(1, 4), 0.25), (np.array(0.75), 0.75), (7, 7.0),
    (math.nan, None), (math.inf, None), (-math.inf, None), (True, None), (np.True_, None),
    ("1.0", None),
    (b"1", None), (None, None), (1j, None), (np.ones(2), None), (object(), None),
])
def test_what_counts_as_a_score(value, score):
    assert as_score(value) == score
    assert accept(value) == (None if score is None else (score, None))
    assert accept((value, "a")) == (None if score is None else (score, "a"))
    assert accept({"score": value, "artifact": "a"}) == (None if score is None else (score, "a"))


def test_ties_go_to_the_earlier_draw():
    order = []

    def objective(params, child):
        order.append(params["i"])
        return 1.0, params["i"]  # every score ties

    result = RandomSearch({"i": list(range(50))}, Poisson(10.0), cost=M.Gaussian(10.0), seed=4,
                          progress=False).run(objective, Ledger(epsilon=50.0, delta=1e-5))
    assert len(set(order)) > 1 and result.artifact == order[0]


def normalised(text: str) -> list[str]:
    frames = [re.sub(r"\d+:\d+(:\d+)?", "T", f).strip() for f in re.split(r"[\r\n]", text)]
    out = []
    for f in frames:
        if f and (not out or out[-1] != f):
            out.append(f)
    return out


class Terminal(io.StringIO):
    """A stream that says it is a terminal: tqdm draws its bar there (task rd)."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream", [Terminal, io.StringIO])  # the bar, and the log's lines
def test_progress_shows_neither_k_nor_failures(stream):
    def run(mean, fail):
        def objective(params, child):
            if fail:
                raise RuntimeError(SECRET)
            return 1.0

        err = stream()
        with redirect_stderr(err):
            RandomSearch({"x": [1]}, Poisson(mean), cost=M.Gaussian(10.0), seed=1,
                         progress=True).run(objective, Ledger(epsilon=50.0, delta=1e-5))
        return err.getvalue()

    texts = [run(1.0, False), run(40.0, False), run(40.0, True)]
    assert all(texts)
    assert normalised(texts[1]) == normalised(texts[2])  # same bound: the same display
    # another mean charges another bound (chosen before any run): only the meter differs
    meter = re.compile(r" \(budget .*? left\)")
    assert [meter.sub("", f) for f in normalised(texts[0])] == \
        [meter.sub("", f) for f in normalised(texts[1])]
    assert all(SECRET not in t and "40" not in t for t in texts)


# --- item 2: only the current best is kept ------------------------------------------------
class Artifact:
    """A candidate's model; its repr carries a marker that must never be shown."""

    def __init__(self, i: int) -> None:
        self.marker = f"artifact-of-candidate-{i}-{SECRET}"

    def __repr__(self) -> str:
        return self.marker


def score_of(i: int) -> float:
    return 0.5 + (i + 1) / 7919  # distinctive, never written in the source


def test_only_the_current_best_is_alive_during_a_run():
    refs: list[weakref.ref] = []
    alive_counts = []

    def objective(params, child):
        gc.collect()
        alive_counts.append(sum(r() is not None for r in refs))
        art = Artifact(len(refs))
        refs.append(weakref.ref(art))
        return score_of(len(refs) - 1) * (1 if len(refs) % 2 else -1), art

    tuner = RandomSearch({"x": [1]}, Poisson(30.0), cost=M.Gaussian(10.0), seed=5,
                         progress=False)
    result = tuner.run(objective, Ledger(epsilon=50.0, delta=1e-5))
    assert len(refs) > 10 and max(alive_counts) <= 1  # the best so far, nothing else
    gc.collect()
    assert [r() for r in refs if r() is not None] == [result.artifact]


# --- item 2: interruptions and errors of the tuner itself -------------------------------
def k_of(make_tuner, run) -> int:
    """K (or T) for a seeded tuner: count the objective's calls in a dry run."""
    calls = []
    run(make_tuner(), lambda *a: calls.append(1) or 0.0)
    return len(calls)


def random_search():
    return RandomSearch({"i": list(range(40))}, Geometric(mean=12.0), cost=M.Gaussian(10.0),
                        seed=21, progress=False)


def dp_hypo():
    return DPHyPOSearch({"i": list(range(40))}, Geometric(mean=12.0), cost=M.Gaussian(10.0),
                        update=lambda h, c: np.ones(len(c)), seed=21, progress=False)


def subset():
    return SubsetSearch(random_search(), q=0.2, final_cost=M.Gaussian(10.0), seed=3)


def run_plain(tuner, objective, backend=None):
    return tuner.run(lambda p, child: objective(p, child), Ledger(epsilon=50.0, delta=1e-5),
                     backend=backend)


def run_subset(tuner, objective, backend=None):
    return tuner.run(lambda p, child, idx: objective(p, child), lambda *a: "final",
                     Ledger(epsilon=50.0, delta=1e-5), 100)


CASES = [(random_search, run_plain), (dp_hypo, run_plain), (subset, run_subset)]


def capture(call):
    """Call, and return what escaped it (the only object a reporter would see)."""
    try:
        call()
    except BaseException as exc:  # that is the point
        return exc
    raise AssertionError("nothing was raised")


def assert_nothing_reachable(exc, refs, needles):
    assert exc.__cause__ is None and exc.__context__ is None and exc.__suppress_context__
    assert str(exc) == "" or SECRET not in str(exc)
    # what `pytest --showlocals`, Sentry or rich show: every frame's locals
    text = "".join(traceback.TracebackException.from_exception(exc, capture_locals=True).format())
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        assert frame.f_code.co_name not in ("_search", "run_candidate", "objective")
        text += "".join(f"{k}={v!r}\n" for k, v in frame.f_locals.items())
    for needle in needles:
        assert needle not in text
    gc.collect()  # and no object still reachable holds an earlier candidate's artifact
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("make,run", CASES, ids=["random", "dp-hypo", "subset"])
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt])
def test_an_interrupt_at_the_last_candidate_leaks_nothing(make, run, interrupt):
    k = k_of(make, run)
    assert k >= 3
    refs: list[weakref.ref] = []
    ledger_records = []

    def objective(params, child):
        if len(refs) == k - 1:
            raise interrupt()
        art = Artifact(len(refs))
        refs.append(weakref.ref(art))
        return score_of(len(refs) - 1), art

    def call():
        tuner = make()
        ledger = Ledger(epsilon=50.0, delta=1e-5)
        ledger_records.append(ledger)
        if run is run_subset:
            tuner.run(lambda p, c, idx: objective(p, c), lambda *a: "final", ledger, 100)
        else:
            tuner.run(objective, ledger)

    exc = capture(call)
    assert type(exc) is (KeyboardInterrupt if interrupt is KeyboardInterrupt else TuningAborted)
    assert len(refs) == k - 1 and len(ledger_records[0].history) == 1  # the charge stands
    needles = [repr(score_of(i)) for i in range(k)] + [f"candidate-{i}-" for i in range(k)]
    needles += [SECRET, "Artifact"]
    assert_nothing_reachable(exc, refs, needles)


# --- issue 24: after the charge, no candidate can end the run --------------------------------
def _raise(exc):
    raise exc


@pytest.mark.parametrize("make,run", CASES, ids=["random", "dp-hypo", "subset"])
@pytest.mark.parametrize("escape", [SystemExit, GeneratorExit, lambda: SystemExit(0)],
                         ids=["SystemExit", "GeneratorExit", "exit-0"])
def test_a_candidate_that_raises_a_base_exception_is_bottom_not_an_abort(make, run, escape):
    """Issue 24 item 2 audit: a BaseException from one candidate ended the whole run with
    TuningAborted, so whether SOME candidate raised (a function of non-selected candidates
    on the private data) was released without being covered by the best-of-K bound. Now
    it is ⊥, and the neighbour runs give a winner either way."""
    k = k_of(make, run)
    for target_present in (True, False):
        calls = []

        def objective(params, child):
            calls.append(1)
            if target_present and len(calls) == 1:  # a candidate reacting to the target
                _raise(escape())
            return score_of(len(calls))

        result = run(make(), objective)
        assert result.selected and len(calls) == k


def test_a_final_training_that_raises_a_base_exception_is_bottom():
    result = subset().run(lambda p, child, idx: 0.5,
                          lambda *a: _raise(SystemExit("final training exited")),
                          Ledger(epsilon=50.0, delta=1e-5), 100)
    assert result.selected and not result.trained and result.artifact is None


def test_a_dp_hypo_update_rule_that_exits_or_warns_falls_back_to_the_prior():
    """The update rule sees the history (data): its SystemExit ended the run (TuningAborted)
    and its warnings reached stderr; both are now the prior fallback, silently."""
    import warnings

    calls = []

    def update(history, coords):
        calls.append(1)
        if len(history) == 1:  # the pre-charge probe
            return np.ones(len(coords))
        warnings.warn(f"history holds {history[-1][1]!r}")
        raise SystemExit("update rule exited")

    tuner = DPHyPOSearch({"i": list(range(10))}, Geometric(mean=6.0), cost=M.Gaussian(10.0),
                         update=update, seed=4, progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = tuner.run(lambda p, child: 0.5 + p["i"] / 100, Ledger(epsilon=50.0, delta=1e-5))
    assert result.selected and len(calls) > 2
    assert not [w for w in caught if "history holds" in str(w.message)]


class Exploding(SerialExecutor):
    """An executor that breaks after running every candidate: an error of the tuner itself."""

    def run(self, tasks, reduce):
        super().run(tasks, reduce)
        raise RuntimeError(f"executor broke {SECRET}")


@pytest.mark.parametrize("make,run", CASES[:2], ids=["random", "dp-hypo"])
def test_an_error_of_the_tuner_itself_leaks_nothing(make, run):
    refs: list[weakref.ref] = []

    def objective(params, child):
        art = Artifact(len(refs))
        refs.append(weakref.ref(art))
        return score_of(len(refs) - 1), art

    exc = capture(lambda: run(make(), objective, backend=Exploding()))
    assert type(exc) is TuningAborted and "withheld" in str(exc)
    assert refs
    needles = [repr(score_of(i)) for i in range(len(refs))] + [SECRET, "broke", "Artifact"]
    assert_nothing_reachable(exc, refs, needles)


def test_pytest_showlocals_shows_no_candidate(tmp_path):
    """The real reporter: `pytest --showlocals` on a tuner whose executor breaks. A control
    test in the same file shows that the reporter does print locals."""
    test_file = tmp_path / "test_leak.py"
    test_file.write_text(textwrap.dedent("""
        from privguard import Ledger, mechanisms as M
        from privguard.tuning import Poisson, RandomSearch
        from privguard.tuning._executors import SerialExecutor

        class Exploding(SerialExecutor):
            def run(self, tasks, reduce):
                super().run(tasks, reduce)
                raise RuntimeError("executor broke")

        def objective(params, child):
            i = params["i"]
            return 0.5 + i / 7919, "model" + str(i * 7919)

        def test_tuner():
            tuner = RandomSearch({"i": list(range(30))}, Poisson(20.0), cost=M.Gaussian(10.0),
                                 seed=8, progress=False)
            tuner.run(objective, Ledger(epsilon=50.0, delta=1e-5), backend=Exploding())

        def test_control():
            best_so_far = (0.5 + 3 / 7919, "model" + str(3 * 7919))
            raise RuntimeError("control")
    """))
    proc = subprocess.run([sys.executable, "-m", "pytest", "--showlocals", "-p", "no:cacheprovider",
                           "-q", str(test_file)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert "2 failed" in out and "TuningAborted" in out
    control = f"model{3 * 7919}"
    assert out.count(control) >= 1  # the control's locals are shown
    tuner_part = out[out.index("test_tuner"):out.index("test_control")]
    for i in range(30):
        assert f"model{i * 7919}" not in tuner_part and repr(0.5 + i / 7919) not in tuner_part
