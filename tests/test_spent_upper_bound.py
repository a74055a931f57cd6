"""The ledger's spent curve is never below the exact (rational) sum of the charged float
curves, at every order (task sr, docs/theory.md §6, "Rounding up"): in memory, with repeats
and leases on a SQLite file, across checkpoints and reopening. Before, the journal summed
``base + n × curve`` to nearest, up to about an ulp per run below the exact sum
(``python scripts/rul_spent_rounding.py``)."""

from __future__ import annotations

import random
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from test_sqlite import cli_verify

from privguard import Ledger, RDPCurve, single_order
from privguard import mechanisms as M
from privguard._accounting import _fastpath, _journal
from privguard._curves._upward import below_nearest_sums, sum_up, times_up
from privguard._stores import _rows, _sqlite

ORDERS = [1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0]


def _mechanisms():
    zero_at_low = RDPCurve(ORDERS, [0.0, 0.0, 1e-3, 0.1, 0.3, 0.7, 1.9, 3.1])  # exact 0s kept
    return [M.Gaussian(3.0), M.Gaussian(7.1), M.SubsampledGaussian(1.1, 0.013),
            M.SubsampledGaussian(0.9, 0.3, steps=7), M.Laplace(40.0), M.PureDP(0.013),
            M.ZCDP(1e-3), zero_at_low]


def _exact(ledger):
    """Σ over the journal's runs of count × the run's float curve, in rationals."""
    acc = ledger._acc
    total = [Fraction(0)] * ledger.orders.size
    for run in ledger.runs:
        curve = acc.curve(run.mechanism).tolist()
        total = [t + run.count * Fraction(c) for t, c in zip(total, curve)]
    return total


def _never_below(ledger):
    exact = _exact(ledger)
    spent = ledger.spent.tolist()
    for alpha, s, e in zip(ORDERS, spent, exact):
        assert Fraction(s) >= e, (alpha, s, float(e))
        assert (s == 0) == (e == 0), (alpha, s)  # an exact 0 stays 0
    return exact


@pytest.mark.parametrize("seed", range(4))
def test_in_memory_spent_is_never_below_the_exact_sum(seed):
    rng = random.Random(seed)
    ledger = Ledger(orders=ORDERS, epsilon=1e6, delta=1e-5)
    mechanisms = _mechanisms()
    for _ in range(60):
        mech = rng.choice(mechanisms)
        for _ in range(rng.choice([1, 1, 2, 5])):  # repeats: a streak, the repeat lane
            ledger.charge(mech, label=rng.choice(["a", "b"]), times=rng.choice([1, 1, 3]))
        _never_below(ledger)


def test_three_mechanisms_in_turn_the_case_main_summed_below():
    # scripts/rul_spent_rounding.py's sequence (main: 486 u below the exact sum at 3,000)
    ledger = Ledger(orders=ORDERS, epsilon=1e6, delta=1e-5)
    mechanisms = [M.Gaussian(3.0), M.Gaussian(7.1), M.SubsampledGaussian(1.1, 0.013)]
    for i in range(600):
        ledger.charge(mechanisms[i % 3])
    _never_below(ledger)


@pytest.mark.parametrize("seed", range(2))
def test_file_ledger_with_leases_checkpoints_and_reopening(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 3)  # as at 512 rows, sooner
    rng = random.Random(seed)
    path = tmp_path / "l.db"
    mechanisms = _mechanisms()
    ledger = Ledger(orders=ORDERS, epsilon=1e6, delta=1e-5, path=path)  # leases on
    for round_ in range(4):
        for _ in range(15):
            mech = rng.choice(mechanisms)
            for _ in range(rng.choice([1, 4, 9])):
                ledger.charge(mech, label=rng.choice(["a", "b"]))
            _never_below(ledger)  # the journal's spent includes the prepaid lease steps
        before = ledger.spent.copy()
        ledger.close()
        ledger = Ledger.open(path)  # resumed from the newest checkpoint, rows after replayed
        _never_below(ledger)
        assert np.array_equal(ledger.spent, before)  # the same floats as before closing
    replayed = _replay(ledger)
    assert np.array_equal(replayed.spent, ledger.spent)
    ledger.close()


def _replay(ledger):
    """An in-memory ledger charged with the file's runs, run by run (the genesis replay)."""
    fresh = Ledger(orders=ORDERS, epsilon=1e6, delta=1e-5)
    for run in ledger.runs:
        fresh.charge(run.mechanism, label=run.label, times=run.count)
    return fresh


def test_k_fold_curves_are_the_journals_sums_so_a_child_admits_its_declared_run():
    # a mechanism of k steps is k × one step rounded up: the floats the journal sums k
    # charges of one step to, so a child whose budget is that run admits k steps, no more
    step = M.SubsampledGaussian(1.1, 0.013)
    run = M.SubsampledGaussian(1.1, 0.013, steps=37)
    kid = Ledger(orders=ORDERS).child(run)
    for _ in range(37):
        kid.charge(step)
    assert np.array_equal(kid.spent, run.rdp(ORDERS))
    assert not kid.can_afford(step)


def test_the_rounding_up_is_the_exact_value_rounded_toward_infinity():
    rng = random.Random(5)
    for _ in range(400):
        n = rng.choice([1, 2, 3, 250, 2**26 + 3, rng.randrange(1, 2**53)])  # below 2⁵³
        curve = np.array([rng.choice([0.0, rng.random(), rng.random() * 10 ** rng.randint(-300, 290),
                                      0.5, 2.0 ** -1070]) for _ in range(6)])
        base = np.array([rng.choice([0.0, rng.random(), 1e-310, 3.0]) for _ in range(6)])
        prod = times_up(n, curve)
        total = sum_up(base, prod)
        for c, p, b, t in zip(curve.tolist(), prod.tolist(), base.tolist(), total.tolist()):
            exact_p, exact_t = n * Fraction(c), Fraction(b) + Fraction(p)
            assert Fraction(p) >= exact_p and Fraction(t) >= exact_t
            if 2.0 ** -900 <= c <= 2.0 ** 900:  # the error-free product: the smallest float above
                assert p == 0 or Fraction(np.nextafter(p, 0.0)) < exact_p
            assert t == 0 or Fraction(np.nextafter(t, 0.0)) < exact_t


OLD_V6 = Path(__file__).parent / "data" / "ledger-curves6-5a474ed.db"
"""Written by privguard main 5a474ed (checkpoints of curve version 6) itself:
``python scripts/make_curves6_fixture.py tests/data/ledger-curves6-5a474ed.db /tmp/sr-base``
(the script's docstring). 530 charges, three mechanisms in turn and every 23rd a
SubsampledGaussian of 7 steps, leases on; one checkpoint, at row 512."""


def _open_counting(path, monkeypatch, read_only=True):
    """The ledger at ``path`` and the number of journal rows replayed to open it."""
    count = [0]
    real = _rows.replay_row

    def counting(*args, **kw):
        count[0] += 1
        return real(*args, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(_rows, "replay_row", counting)
        ledger = Ledger.open(path, read_only=read_only)
    return ledger, count[0]


def test_a_version_6_file_main_wrote_opens_replayed_and_nothing_fell(tmp_path, monkeypatch):
    path = str(tmp_path / "v6.db")
    shutil.copy(OLD_V6, path)
    ledger, rows = _open_counting(path, monkeypatch)
    assert rows == 531  # from the genesis: its checkpoint summed to nearest (version 6)
    _never_below_on(ledger)
    spent, eps = ledger.spent, ledger.epsilon()
    ledger.close()
    with monkeypatch.context() as patch:  # what resuming from main's checkpoint would hold
        patch.setattr(_rows, "RESUMABLE", frozenset({6}))
        patch.setattr(_rows, "changed", lambda data, version=2: False)
        ledger, forced_rows = _open_counting(path, monkeypatch)
        forced, forced_eps = ledger.spent, ledger.epsilon()
        ledger.close()
    assert forced_rows <= 531 - 512 + 1
    # main's totals lay below the exact sums; today's replay is nowhere below them
    assert np.all(forced <= spent) and np.any(forced < spent) and forced_eps <= eps
    assert cli_verify(path)["checkpoints"] == 1  # the old snapshot accepted as a revision up
    ledger, rows = _open_counting(path, monkeypatch, read_only=False)  # writes version 7
    assert rows == 531 and np.array_equal(ledger.spent, spent)
    ledger.charge(M.Gaussian(3.0), label="a")  # and it goes on charging
    ledger.close()
    ledger, rows = _open_counting(path, monkeypatch)
    assert rows <= 2 and ledger.epsilon() >= eps  # resumed from its version-7 checkpoint
    _never_below_on(ledger)
    ledger.close()


def _never_below_on(ledger):
    assert all(Fraction(s) >= e for s, e in zip(ledger.spent.tolist(), _exact(ledger)))


def _nearest_sum(base, base_bound, n, curve, curve_bound):
    """main 5a474ed's journal sum: base + n × curve, each operation rounded to nearest."""
    with np.errstate(over="ignore"):
        return base + n * curve


PREFIX = [M.Gaussian(30.0), M.Gaussian(71.0), M.Gaussian(43.0)] * 1000  # 3,000 runs in turn


def _prefix(eps, nearest, monkeypatch):
    """An in-memory ledger charged with PREFIX, summing as main did if ``nearest``."""
    with monkeypatch.context() as patch:
        if nearest:
            patch.setattr(_journal, "scaled_sum", _nearest_sum)
            patch.setattr(_fastpath, "scaled_sum", _nearest_sum)
        ledger = Ledger(eps, 1e-5, shares=single_order(8.0))
        for mech in PREFIX:
            ledger.charge(mech)
    return ledger


def _main_edge(eps, monkeypatch):
    """PREFIX charged as main summed (``main``) and as today (``today``), then main charged
    Gaussian(hi): the smallest σ main admitted, to float resolution (it refuses below)."""
    main, today = _prefix(eps, True, monkeypatch), _prefix(eps, False, monkeypatch)
    lo, hi = 0.05, 50.0  # main refuses at lo, admits at hi
    with monkeypatch.context() as patch:
        patch.setattr(_journal, "scaled_sum", _nearest_sum)
        patch.setattr(_fastpath, "scaled_sum", _nearest_sum)
        for _ in range(64):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if main.can_afford(M.Gaussian(mid)) else (mid, hi)
        main.charge(M.Gaussian(hi))
    return main, today, hi


def test_a_journal_main_filled_to_the_edge_still_opens(monkeypatch):
    # The last charge main admitted within ulps of the budget, at its round-to-nearest sums
    # (3,000 runs: up to about 10⁻¹³ below today's, more than task ul's slack): re-read at
    # today's rounded-up sums it would be refused, and the journal would not open.
    # Accounting._readmit falls back to a curve below main's sums (_admitted_at_nearest_sums);
    # new charges are decided at the rounded-up sums alone.
    found = 0
    for k in range(3):
        main, today, hi = _main_edge(40.0 + 3.7 * k, monkeypatch)
        if today.can_afford(M.Gaussian(hi)):
            continue  # today admits it too: not an edge case
        found += 1
        ledger = Ledger.load_state_dict(main.state_dict())  # re-read: every charge decided
        assert len(ledger.history) == len(PREFIX) + 1
        _never_below_on(ledger)
        assert not ledger.can_afford(M.Gaussian(hi))  # nothing more at the edge
    assert found  # the case arises


def test_the_reports_trajectory_ends_at_the_ledgers_own_sums():
    # privguard report sums the runs' streaks as the journal does (rounded up), so its last
    # point is the ledger's own running ε, bit for bit; before, it summed run by run to
    # nearest, other floats than the journal's streaks (main: 25.943353284064457 against
    # the ledger's 25.943353284064425 here)
    from privguard._cli._report import trajectory

    ledger = Ledger(orders=ORDERS, epsilon=1e6, delta=1e-5)
    mechanisms = [M.Gaussian(3.0), M.Gaussian(7.1), M.SubsampledGaussian(1.1, 0.013)]
    for i in range(300):
        ledger.charge(mechanisms[(i // 4) % 3], label="ab"[i % 2])  # streaks of 4, 4 runs each
    out = trajectory(ledger, points=300)
    assert out["charges"][-1] == 300
    delta = 1e-5
    assert out["running_epsilon"][-1] == ledger._acc.odometer(delta).epsilon(ledger.spent, delta)


def test_a_composed_mechanism_is_never_below_the_exact_sum_of_its_parts():
    # Review rsr: Composed summed its parts' curves with numpy, to nearest, below the exact
    # sum at 3 of these 8 orders (RDPCurve's + rounds up); now each sum is rounded up, the
    # floats of charging the parts one after the other.
    parts = (M.Gaussian(3.0), M.SubsampledGaussian(1.1, 0.013), M.ZCDP(1e-3))
    curve = M.Composed(parts).rdp(ORDERS)
    exact = [sum(Fraction(float(p.rdp(ORDERS)[i])) for p in parts) for i in range(len(ORDERS))]
    assert all(Fraction(float(c)) >= e for c, e in zip(curve, exact))
    assert (curve >= np.sum([p.rdp(ORDERS) for p in parts], axis=0)).all()  # never below before
    one, each = Ledger(orders=ORDERS, epsilon=1e6, delta=1e-5), Ledger(orders=ORDERS, epsilon=1e6,
                                                                        delta=1e-5)
    one.charge(M.Composed(parts))
    for p in parts:
        each.charge(p)
    assert one.spent.tolist() == each.spent.tolist()
    big = M.Composed((M.PureDP(1e308), M.PureDP(1e308)))  # past the float range: +inf
    assert np.isinf(big.rdp(ORDERS)).all()


def test_a_journal_main_filled_to_the_edge_with_composed_runs_still_opens(monkeypatch):
    # Review rsr: a Composed of m parts is m − 1 sums, rounded up since the review (numpy
    # summed to nearest); the re-read fallback counted 3 operations per run, too few for
    # a run of Composed(2000 parts) (about 10³ ulps above main's curve at α = 8): main's edge
    # journal did not open. It counts each run's
    # curve's operations now.
    from privguard._mechanisms import _base, _mechanisms

    def main_composed(self, orders):
        return np.sum([m._rdp_checked(orders) for m in self.mechanisms], axis=0)

    parts = M.Composed(tuple(M.Gaussian(36.0 + i / 100) for i in range(2000)))
    prefix = [parts]
    found = 0
    for k in range(4):
        eps = 9.0 + 1.3 * k
        _base._cached_curve.cache_clear()
        with monkeypatch.context() as patch:
            for module in (_journal, _fastpath):
                patch.setattr(module, "scaled_sum", _nearest_sum)
            patch.setattr(_mechanisms.Composed, "_rdp", main_composed)
            main = Ledger(eps, 1e-5, shares=single_order(8.0))
            for mech in prefix:
                main.charge(mech)
            lo, hi = 0.05, 50.0
            for _ in range(64):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if main.can_afford(M.Gaussian(mid)) else (mid, hi)
            main.charge(M.Gaussian(hi))
            state = main.state_dict()
        _base._cached_curve.cache_clear()  # today's Composed curves from here on
        today = Ledger(eps, 1e-5, shares=single_order(8.0))
        for mech in prefix:
            today.charge(mech)
        if today.can_afford(M.Gaussian(hi)):
            continue  # today admits it too: not an edge case
        found += 1
        ledger = Ledger.load_state_dict(state)
        _never_below_on(ledger)
        assert not ledger.can_afford(M.Gaussian(hi))
    assert found


def test_the_re_read_fallback_fails_closed_past_mains_rounding(monkeypatch):
    # Review rsr: the fallback admits a re-read charge only within main's rounding (about
    # 12 ulps per run relative here): a main edge journal edited so that its last charge
    # costs 10⁻¹¹ more (σ lowered), or with one more charge of Gaussian(10⁵) after it,
    # and re-checksummed, does not open.
    import json

    from privguard._errors import LedgerStateError
    from privguard._stores._integrity import Integrity

    for k in range(3):
        main, today, hi = _main_edge(40.0 + 3.7 * k, monkeypatch)
        if not today.can_afford(M.Gaussian(hi)):
            break
    else:
        raise AssertionError("no edge case")
    text = json.dumps(main.state_dict())
    Ledger.load_state_dict(json.loads(text))  # as written, it opens (the fallback)

    def resigned(state):
        body = {key: v for key, v in state.items() if key != "checksum"}
        return {**state, "checksum": Integrity.from_environment().digest("state", body)}

    lowered = json.loads(text.replace(repr(hi), repr(hi * (1 - 1e-11))))
    assert lowered != json.loads(text)
    with pytest.raises(LedgerStateError, match="would be refused by the recorded budget"):
        Ledger.load_state_dict(resigned(lowered))
    more = json.loads(text)
    more["mechanisms"].append(M.Gaussian(1e5).to_dict())
    more["journal"].append([*more["journal"][-1][:1], len(more["mechanisms"]) - 1,
                            *more["journal"][-1][2:]])
    with pytest.raises(LedgerStateError, match="would be refused by the recorded budget"):
        Ledger.load_state_dict(resigned(more))


def test_a_subnormal_product_is_exact_and_the_fallback_stays_below_mains_sums():
    # Review rsr: n × c below the normal range is exact (a multiple of 2⁻¹⁰⁷⁴), yet it was
    # raised by an ulp there (Dekker's range check), an over-count of 1/3000 here that the
    # next product multiplied by 100: below_nearest_sums(spent) then lay 80 ulps above
    # main's round-to-nearest sum (it assumes an ulp per operation, relative or 2⁻¹⁰⁷⁴).
    tiny = 2.0 ** -1074
    c = np.array([3 * tiny, 0.0, 1e-300])
    step = times_up(1000, c)
    assert step[0] == 3000 * tiny and step[1] == 0.0  # exact: kept
    assert Fraction(step[2]) >= 1000 * Fraction(1e-300)
    spent = times_up(100, step)
    assert spent[0] == 300000 * tiny
    main = 100 * (1000 * c)  # main's sums, to nearest
    assert (below_nearest_sums(spent, 9) <= main).all()
    curve = RDPCurve(ORDERS, [3 * tiny] * len(ORDERS)) * 1000  # through a ledger too
    ledger = Ledger(orders=ORDERS, epsilon=1e6, delta=1e-5)
    for _ in range(100):
        ledger.charge(curve)
    assert ledger.spent.tolist() == [300000 * tiny] * len(ORDERS)
