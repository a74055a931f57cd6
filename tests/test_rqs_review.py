"""Review rqs of task qs (issue 26: what a lease costs on a durable ledger).

A leased step decides through the ledger's one lease predicate (``_lease_open``) and breaks
the ledger through its one guard (``_guard``): qs wrote both out in the leased step's path,
twins of code still used beside them (``_lease_open`` after a sync, ``_guard`` at every
transaction), so a check added to one would have been missing from the other. The repeat
lane's key test (``Lease.same_key``, the lease mechanism's type first) answers as before.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from unittest import mock

import pytest

from privguard import Ledger
from privguard import mechanisms as M
from privguard._ledger._ledger import Ledger as LedgerClass
from privguard._mechanisms._base import Mechanism

Q = 256 / 60_000


def _leased(tmp_path) -> Ledger:
    ledger = Ledger(epsilon=8.0, delta=1e-5, path=str(tmp_path / "l.db"), lease=64)
    for _ in range(40):  # a streak long enough for a lease of several steps
        ledger.charge(M.SubsampledGaussian(1.1, Q), label="step")
    assert ledger._lease is not None and ledger._lease.left > 1
    return ledger


@pytest.mark.parametrize("times", [1, 2])  # the repeat lane, and the ordinary path's
def test_a_leased_step_decides_through_the_one_predicate_and_guard(tmp_path, monkeypatch,
                                                                     times):
    ledger = _leased(tmp_path)
    lease, left = ledger._lease, ledger._lease.left
    calls: list[str] = []
    lease_open, guard = LedgerClass._lease_open, LedgerClass._guard
    monkeypatch.setattr(LedgerClass, "_lease_open",
                        lambda self, *a: calls.append("open") or lease_open(self, *a))
    monkeypatch.setattr(LedgerClass, "_guard",
                        lambda self, *a, **k: calls.append("guard") or guard(self, *a, **k))
    ledger.charge(M.SubsampledGaussian(1.1, Q), label="step", times=times)
    assert ledger._lease is lease and lease.left == left - times  # a leased step
    assert calls == ["open", "guard"]
    # and a predicate that refuses is obeyed: no step from the lease
    monkeypatch.setattr(LedgerClass, "_lease_open", lambda self, *a: False)
    before = lease.left
    ledger.charge(M.SubsampledGaussian(1.1, Q), label="step", times=times)
    assert lease.left == before
    ledger.close()


class _Sub(M.SubsampledGaussian):
    pass


def _old_same_key(lease, mechanism, label, pid) -> bool:  # main's, before task qs
    return (isinstance(mechanism, Mechanism) and pid == lease.pid and label == lease.label
            and (mechanism is lease.mechanism or mechanism == lease.mechanism))


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # a Mock with a spec has no parameters to compare: raised
        return type(exc)


@pytest.mark.parametrize("other", [
    M.SubsampledGaussian(1.1, Q), M.SubsampledGaussian(1.2, Q), _Sub(1.1, Q),
    M.Gaussian(1.1), mock.ANY, mock.Mock(spec=M.SubsampledGaussian), 1.1, None])
@pytest.mark.parametrize("label", ["step", None, "other"])
def test_same_key_answers_as_before_task_qs(tmp_path, other, label):
    ledger = _leased(tmp_path)
    lease = ledger._lease
    for pid in (lease.pid, lease.pid + 1):
        assert _outcome(lease.same_key, other, label, pid) == \
            _outcome(_old_same_key, lease, other, label, pid)
    lease.mechanism = _Sub(1.1, Q)  # a lease of a subclass's mechanism
    assert lease.same_key(M.SubsampledGaussian(1.1, Q), "step", lease.pid) == \
        _old_same_key(lease, M.SubsampledGaussian(1.1, Q), "step", lease.pid)
    ledger.close()


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _quickstart_cost(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("quickstart_cost")


def test_quickstart_cost_times_each_round_after_a_warm_up(tmp_path, monkeypatch):
    """``--against`` timed each run in a fresh process, cold (the curves, the δ shares and
    SQLite's side computed or imported inside the timed run): in memory took 0.11–0.21 s
    there against 0.08 s in process, and the ratios to it were not the issue's."""
    script = _quickstart_cost(monkeypatch)
    runs: list[tuple] = []
    monkeypatch.setattr(script, "quick_start",
                        lambda path, lease=None, prefetch=None:
                        runs.append((path is not None, lease, prefetch)) or (1.0, 7))
    got = script.one_round(["in memory", "path=, lease=1"], str(tmp_path), "t")
    assert got == [(1.0, 7), (1.0, 7)]
    assert runs == [(False, None, None), (True, None, None),  # the warm-up, untimed
                    (False, None, None), (True, 1, None)]


def test_against_refuses_a_checkout_whose_package_was_not_imported(tmp_path, monkeypatch):
    script = _quickstart_cost(monkeypatch)
    (tmp_path / "elsewhere").mkdir()  # no privguard/ in tmp_path: another one, or none, loads
    with pytest.raises(RuntimeError, match=r"the package imported was|failed"):
        script.in_subprocess(str(tmp_path), "1")
    root = str(BENCHMARKS.parent)  # this checkout: its own package, the call's value back
    assert script.in_subprocess(root, "q.VARIANTS['in memory']") == [False, None, None]
