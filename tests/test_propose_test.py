"""Propose-test tuning: per-round charges, termination, refusal, noise scales, sensitivity."""

from __future__ import annotations

import traceback

import numpy as np
import pytest

from privguard import Ledger
from privguard import mechanisms as M
from privguard.tuning import ProposeTest
from privguard.tuning._propose_test import partitions

CANDS = [{"i": i} for i in range(100)]


def tuner(**kw):
    kw.setdefault("epsilon0", 0.1)
    kw.setdefault("partitions", 10)
    kw.setdefault("granularity", 0.01)
    return ProposeTest(CANDS, progress=False, **kw)


def test_each_round_is_charged_as_pure_epsilon0():
    ledger = Ledger(delta=1e-5)
    result = tuner(seed=1).select(np.random.default_rng(1).uniform(0, 1, 100), ledger)
    assert result.rounds == len(ledger.history) > 0
    assert all(r.mechanism == M.PureDP(0.1) for r in ledger.history)
    np.testing.assert_allclose(ledger.spent, result.rounds * M.PureDP(0.1).rdp(ledger.orders))


def test_terminates_in_every_seed_within_the_worst_case():
    rng = np.random.default_rng(0)
    for seed in range(2000):
        g = float(rng.choice([0.2, 0.05, 0.01, 0.003]))
        u0 = float(rng.choice([0.0, 0.5, 0.9]))
        eps0 = float(rng.choice([0.05, 0.5, 5.0]))
        t = tuner(seed=seed, granularity=g, lower_bound=u0, epsilon0=eps0)
        result = t.select(rng.uniform(0, 1, 100), Ledger(delta=1e-5))
        assert 1 <= result.rounds <= t.worst_case_rounds()


def test_refused_round_stops_cleanly_with_the_best_so_far():
    # a filter with room for a few rounds only
    ledger = Ledger(epsilon=0.4, delta=1e-5, plan=M.PureDP(0.1))
    room = ledger.remaining(M.PureDP(0.1)).repeats
    assert room == 3  # fewer than the ~7 rounds this run needs
    result = tuner(seed=4).select(np.full(100, 0.99), ledger)
    assert result.stopped_by_refusal and result.rounds == room == len(ledger.history)
    assert result.selected and result.params in CANDS


class SpyRng:
    """Records the scale of every Laplace draw; returns 0 noise."""

    def __init__(self):
        self.scales = []

    def laplace(self, loc, scale):
        self.scales.append(scale)
        return 0.0


@pytest.mark.parametrize("k,eps0", [(10, 0.1), (4, 2.0), (1, 0.5)])
def test_noise_scales_are_exactly_2_and_4_over_k_epsilon0(k, eps0):
    t = ProposeTest([{"a": 1}, {"a": 2}], epsilon0=eps0, partitions=k, granularity=0.1,
                    progress=False)
    spy = SpyRng()
    result = t.select([0.0, 0.95], Ledger(delta=1e-5), rng=spy)
    threshold, candidate = 2 / (k * eps0), 4 / (k * eps0)
    assert result.rounds > 1 and spy.scales[0] == threshold
    assert set(spy.scales) == {threshold, candidate}
    assert spy.scales.count(threshold) == result.rounds  # one proposal per round
    assert t.threshold_scale == 2 / (k * eps0) and t.candidate_scale == 4 / (k * eps0)


def test_partitions_are_disjoint_and_cover():
    parts = partitions(1000, 7, np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))


def test_one_example_moves_each_utility_by_at_most_one_over_k():
    k = 5
    t = ProposeTest([{"w": w} for w in (0.1, 0.5, 0.9)], epsilon0=1.0, partitions=k,
                    progress=False)
    rng = np.random.default_rng(3)
    data = rng.uniform(0, 1, 200)

    def objective(params, idx):  # any accuracy-like value in [0, 1] of one partition
        if len(idx) == 0:
            return 0.0
        return float(np.clip(np.mean(data[idx] > params["w"]) + 0.3 * np.max(data[idx]), 0, 1))

    parts = partitions(200, k, rng)
    base = t.aggregate(objective, parts)
    for removed in (0, 57, 199):  # neighbour: one example removed, others' partitions kept
        neighbour = [p[p != removed] for p in parts]
        changed = [i for i in range(k) if len(neighbour[i]) != len(parts[i])]
        assert len(changed) == 1
        assert np.max(np.abs(t.aggregate(objective, neighbour) - base)) <= 1 / k + 1e-12


def test_utility_outside_unit_interval_is_clamped_not_refused():
    t = ProposeTest([{"a": 1}, {"a": 2}, {"a": 3}], epsilon0=1.0, partitions=2, progress=False)
    values = {1: 87.6543, 2: -3.0, 3: 0.25}
    u = t.utilities(lambda p, idx: values[p["a"]], 10)
    np.testing.assert_array_equal(u, [1.0, 0.0, 0.25])


# An objective that misbehaves only on a partition holding the target record: each mapped
# value is fixed and in [0, 1], so the aggregate still moves by at most 1/k (seed 004).
MISBEHAVIOURS = {
    "above": lambda: 1.5, "percent": lambda: 87.0, "below": lambda: -0.5,
    "nan": lambda: float("nan"), "inf": lambda: float("inf"), "-inf": lambda: float("-inf"),
    "string": lambda: "0.5", "none": lambda: None, "raises": lambda: 1 / 0,
    "system-exit": lambda: (_ for _ in ()).throw(SystemExit(3)),
}


@pytest.mark.parametrize("kind", sorted(MISBEHAVIOURS))
def test_a_misbehaving_partition_keeps_the_sensitivity_one_over_k(kind):
    k, target = 4, 13
    t = ProposeTest([{"w": w} for w in (0.2, 0.6)], epsilon0=1.0, partitions=k, progress=False)
    parts = partitions(60, k, np.random.default_rng(5))

    def objective(params, idx):
        if target in idx:
            return MISBEHAVIOURS[kind]()
        return params["w"]

    with_target = t.aggregate(objective, parts)
    without = t.aggregate(objective, [p[p != target] for p in parts])
    assert np.all((with_target >= 0) & (with_target <= 1))
    assert np.max(np.abs(with_target - without)) <= 1 / k + 1e-12


def test_issue_24_reproducer_neighbours_both_get_a_charged_result():
    """Issue 24 item 2: an objective returning 1.5 only when the target record is present
    raised InvalidArgumentError after touching the data, with nothing charged, while the
    neighbour got a result with its rounds charged: one uncharged bit per run."""
    n, target = 90, 41

    def objective_on(data):
        def objective(params, idx):
            if params["i"] == 3 and target in data[idx]:  # the record itself
                return 1.5  # a non-selected candidate, out of range only with the target
            return 0.2 + 0.1 * params["i"]
        return objective

    present = np.arange(n)
    absent = present.copy()
    absent[target] = -1  # the neighbour: the target record replaced
    outcomes = []
    for data in (present, absent):
        ledger = Ledger(delta=1e-5)
        t = ProposeTest([{"i": i} for i in range(6)], epsilon0=0.5, partitions=5,
                        granularity=0.05, seed=11, progress=False)
        result = t.run(objective_on(data), ledger, n)
        assert result.rounds == len(ledger.history) > 0
        assert all(r.mechanism == M.PureDP(0.5) for r in ledger.history)
        outcomes.append(result)
    assert all(isinstance(r.selected, bool) for r in outcomes)


def test_a_failing_partition_counts_as_accuracy_zero():
    t = ProposeTest([{"a": 1}, {"a": 2}, {"a": 3}], epsilon0=1.0, partitions=4, progress=False)
    parts = partitions(40, 4, np.random.default_rng(0))

    def objective(params, idx):
        if params["a"] == 2 and 0 in idx:
            raise FloatingPointError("diverged")
        if params["a"] == 3 and 1 in idx:
            return float("nan")
        return 0.8

    u = t.aggregate(objective, parts)
    np.testing.assert_allclose(u, [0.8, 0.6, 0.6])  # one of four partitions at 0


class ScriptedRng:
    """Laplace draws from a generator, recorded, so a test can replay the rounds."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.draws = []

    def laplace(self, loc, scale):
        x = self.rng.laplace(loc, scale)
        self.draws.append((scale, x))
        return x


def transcript(u_s, draws, g, u0):
    """Independent transcription of Algorithm 1: each round's output, from utilities + noise."""
    out, draws, u, step = [], list(draws), u0, 1
    while draws:
        _, noise = draws.pop(0)
        proposal = u + step * g + noise
        hit = None
        for s in range(len(u_s)):
            _, z = draws.pop(0)
            if u_s[s] + z >= proposal:
                hit = s
                break
        out.append(hit)
        u, step = (u + step * g, step * 2) if hit is not None else (u, step // 2)
    return out


def release_from(rounds_out, g, u0):
    """(rounds, u, last recorded, whether the loop wanted another round) as a function
    of the round outputs ONLY."""
    u, step, last = u0, 1, None
    for hit in rounds_out:
        if hit is not None:
            u, step, last = u + step * g, step * 2, hit
        else:
            step //= 2
    return len(rounds_out), u, last, step != 0 and u < 1


@pytest.mark.parametrize("seed", range(20))
def test_rounds_and_level_are_post_processing_of_the_round_outputs(seed):
    rng = np.random.default_rng(1000 + seed)
    n = 30 if seed % 4 < 2 else 2  # few, poor candidates: rounds without a record too
    u_s = rng.uniform(0, 1 if n == 30 else 0.3, n)
    t = ProposeTest([{"i": i} for i in range(n)], epsilon0=0.5, partitions=10,
                    granularity=0.05, lower_bound=0.2, progress=False)
    ledger = Ledger(epsilon=2.0, delta=1e-5, plan=M.PureDP(0.5)) if seed % 2 else Ledger(delta=1e-5)
    spy = ScriptedRng(seed)
    result = t.select(u_s, ledger, rng=spy)
    outs = transcript(u_s, spy.draws, 0.05, 0.2)
    rounds, u, last, wanted_more = release_from(outs, 0.05, 0.2)
    assert result.rounds == rounds == len(ledger.history)  # every round was charged
    assert result.utility_level == pytest.approx(u, abs=1e-12)
    assert result.params == (None if last is None else {"i": last})
    # a refusal ends the loop only when it wanted another round; the ledger (which holds
    # only data-independent PureDP(ε₀) charges) decides it from the number of rounds
    assert result.stopped_by_refusal == wanted_more
    assert result.stopped_by_refusal == (not ledger.can_afford(M.PureDP(0.5)) and wanted_more)


def test_worst_case_bound_is_advanced_composition():
    t = tuner(granularity=0.01)
    T = t.worst_case_rounds()
    assert T == 201
    expected = np.sqrt(2 * T * np.log(1e5)) * 0.1 + T * 0.1 * np.expm1(0.1)
    assert t.worst_case_epsilon(1e-5) == pytest.approx(expected)


def test_run_end_to_end_releases_only_the_selection():
    t = ProposeTest({"lr": [0.1, 1.0]}, epsilon0=1.0, partitions=3, granularity=0.1, seed=0,
                    progress=False)
    result = t.run(lambda p, idx: 0.9 if p["lr"] == 1.0 else 0.1, Ledger(delta=1e-5), 30)
    assert set(vars(result)) == {"selected", "params", "rounds", "stopped_by_refusal",
                                 "utility_level", "seeded"}


def test_an_interrupt_leaks_no_utility():
    accuracies = {i: 0.31 + (i + 1) / 7919 for i in range(6)}  # distinctive values
    calls = []

    def objective(params, idx):
        calls.append(1)
        if len(calls) == 10:
            raise KeyboardInterrupt
        return accuracies[params["i"]]

    t = ProposeTest([{"i": i} for i in range(6)], epsilon0=0.5, partitions=3, progress=False)
    ledger = Ledger(delta=1e-5)
    exc = interrupt_of(lambda: t.run(objective, ledger, 60))
    assert exc.__context__ is None and exc.__cause__ is None and ledger.history == ()
    text = "".join(traceback.TracebackException.from_exception(exc, capture_locals=True).format())
    text += repr([f.f_locals for f, _ in traceback.walk_tb(exc.__traceback__)])
    for value in accuracies.values():
        assert repr(value) not in text and repr(value / 3) not in text
    assert [f.f_code.co_name for f, _ in traceback.walk_tb(exc.__traceback__)] == \
        ["interrupt_of", "<lambda>", "run", "sealed"]


def interrupt_of(call):
    try:
        call()
    except KeyboardInterrupt as exc:
        return exc
    raise AssertionError("not interrupted")


def test_no_room_for_one_round_runs_nothing():
    ran = []
    ledger = Ledger(epsilon=0.05, delta=1e-5)
    result = tuner(epsilon0=0.1).run(lambda p, idx: ran.append(1) or 0.5, ledger, 100)
    assert ran == [] and ledger.history == ()
    assert (result.selected, result.rounds, result.stopped_by_refusal) == (False, 0, True)
