"""Review bd: bad input and fail-closed leftovers.

Unknown journal event kinds refuse to load; huge curves charged again stay warning-free
and refused; messages name the argument the user passed; arguments are checked before a
store is touched.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _tiny_opacus import private_linear

from privguard import (
    BudgetExhausted,
    InvalidArgumentError,
    Ledger,
    LedgerStateError,
    Odometer,
    Plan,
    mechanism_from_dict,
)
from privguard import mechanisms as M
from privguard._accounting._accounting import Change
from privguard._stores._integrity import Integrity
from privguard.audit import guess_and_count
from privguard.tuning import (
    dpsgd_cost,
    paper_extrapolation,
    project_bounded_simplex,
    project_density,
)

STEP = M.SubsampledGaussian(1.0, 0.01)
NOTE = {"event": "note", "time": 0.0, "pid": 1}  # as a newer version might write one


def _log_event(ledger, body):
    """What the ledger does for an event it logs (a lease's remainder), with ``body``:
    a journal that a newer version, writing an event this one does not know, left."""
    with ledger._synced(write=True) as txn:
        ledger._acc.replay_event(body)
        txn.write(ledger._acc, [Change("event", body=body)])


# -- 1. an unknown event kind fails closed ---------------------------------------------------
def _with_a_note(path):
    """``path``'s ledger, charged once and then given a "note" event; returns ``path``."""
    ledger = Ledger(3.0, 1e-5, path=path)
    ledger.charge(STEP)
    _log_event(ledger, NOTE)
    ledger.close()
    return path


def test_a_sqlite_journal_with_an_unknown_event_kind_never_opens(tmp_path):
    path = _with_a_note(tmp_path / "l.db")
    with pytest.raises(LedgerStateError, match="'note', unknown to this privguard"):
        Ledger.open(path)


def test_an_unknown_event_kind_appended_by_another_process_is_refused(tmp_path):
    path = tmp_path / "l.db"
    reader = Ledger(3.0, 1e-5, path=path)
    reader.charge(STEP)
    writer = Ledger.open(path)
    _log_event(writer, NOTE)
    writer.close()
    with pytest.raises(LedgerStateError, match="'note', unknown to this privguard"):
        reader.charge(STEP)


def test_a_postgres_journal_with_an_unknown_event_kind_never_opens(pg):
    srv, db, name = pg
    url = _with_a_note(srv.url("budget_owner", db, name))
    with pytest.raises(LedgerStateError, match="'note', unknown to this privguard"):
        Ledger.open(url)


@pytest.mark.parametrize("body", [NOTE, {"event": 3}, {"time": 0.0}, {"event": None}])
def test_a_state_with_an_unknown_event_kind_never_loads(body):
    ledger = Ledger(3.0, 1e-5)
    ledger.charge(STEP)
    state = ledger.state_dict()
    state["journal"].append(["event", body])
    state["checksum"] = Integrity(None).digest(
        "state", {k: v for k, v in state.items() if k != "checksum"})
    for load in (Ledger.load_state_dict, Ledger(3.0, 1e-5).load_state_dict):
        with pytest.raises(LedgerStateError, match="unknown to this privguard"):
            load(state)


# -- 2. a huge curve charged again: +inf, refused, no warning ----------------------------------
@pytest.mark.parametrize("make", [lambda: M.PureDP(1e308), lambda: M.ZCDP(1e308)],
                         ids=["pure", "zcdp"])
def test_a_huge_curve_charged_again_is_inf_without_a_warning(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unbudgeted = Ledger(delta=1e-5)
        unbudgeted.charge(make(), times=3)
        unbudgeted.charge(make())
        assert (unbudgeted.spent == float("inf")).any()
        budgeted = Ledger(epsilon=1e308, delta=1e-5)
        with pytest.raises(BudgetExhausted, match="refused"):
            for _ in range(3):
                budgeted.charge(make())
        assert len(budgeted.history) <= 1


def test_the_repeated_charge_search_past_the_float_range_is_warning_free():
    # the streak's limit search (privguard/_accounting/_fastpath.py) probes base + n × curve
    # past 1.8e308 for a curve of 1e307 under a budget of 1.7e308
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ledger = Ledger(epsilon=1.7e308, delta=1e-5)
        for _ in range(3):
            ledger.charge(M.PureDP(1e307))
        assert len(ledger.history) == 3


# -- 4. every argument is checked before the store is touched ----------------------------------
@pytest.mark.parametrize("bad", [5, "print", [print, 1], [None]])
def test_bad_listeners_are_refused_before_the_ledger_file_is_created(tmp_path, bad):
    path = tmp_path / "l.db"
    with pytest.raises(InvalidArgumentError) as info:
        Ledger(3.0, 1e-5, path=path, listeners=bad)
    assert info.value.argument == "listeners" and "listeners=" in str(info.value)
    assert not path.exists()


def test_bad_listeners_are_refused_before_a_ledger_file_is_opened(tmp_path, monkeypatch):
    path = tmp_path / "l.db"
    Ledger(3.0, 1e-5, path=path).close()
    import privguard._ledger._ledger as _ledger

    monkeypatch.setattr(_ledger, "open_store", lambda *a, **k: pytest.fail("store opened"))
    with pytest.raises(InvalidArgumentError) as info:
        Ledger.open(path, listeners=[1])
    assert info.value.argument == "listeners"


# -- 3. a refusal names the argument the caller passed ---------------------------------------
def _parent():
    return Ledger(3.0, 1e-5)


@pytest.mark.parametrize("call,name", [
    (lambda: mechanism_from_dict(5), "data"),
    (lambda: mechanism_from_dict({"type": "Gaussian"}), "data"),
    (lambda: Plan.from_dict(5), "data"),
    (lambda: _parent().child(5), "budget"),
    (lambda: _parent().child([1.0, -1.0]), "budget"),
    (lambda: _parent().child(float("nan")), "budget"),
    (lambda: _parent().add_listener(5), "fn"),
    (lambda: _parent().remove_listener(print), "fn"),
])
def test_a_refusal_names_the_public_argument(call, name):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert info.value.argument == name and str(info.value).startswith(f"{name}=")


def test_a_child_still_names_delta():
    with pytest.raises(InvalidArgumentError) as info:
        _parent().child(M.PureDP(1.0), delta=2.0)
    assert info.value.argument == "delta"


# -- 5. plot -o DIRECTORY: refused (as cc -o, curl -o), naming it and a file inside it -----------
def test_plot_to_a_directory_is_refused_naming_it_and_a_file_to_write(tmp_path, capsys):
    from privguard._cli._cli import main

    ledger = Ledger(3.0, 1e-5, path=tmp_path / "l.db")
    ledger.charge(STEP)
    ledger.close()
    out = tmp_path / "out"
    out.mkdir()
    assert main(["plot", str(tmp_path / "l.db"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and str(out / "eps.png") in err
    assert list(out.iterdir()) == [] and not (tmp_path / "out.png").exists()


# -- 6. an absurd hybrid target is refused before any PLD search ------------------------------
@pytest.mark.parametrize("epsilon", [100.5, 1e3, 1e6, 1e300])
@pytest.mark.parametrize("plan", [None, STEP, M.Gaussian(1e-3)], ids=["none", "sgm", "gauss"])
def test_a_hybrid_target_beyond_its_range_is_refused_before_any_pld_search(
        monkeypatch, epsilon, plan):
    from privguard._accounting import _hybrid

    monkeypatch.setattr(_hybrid, "_envelope_steps", lambda *a: pytest.fail("PLD search"))
    with pytest.raises(InvalidArgumentError) as info:
        Ledger(epsilon, 1e-5, filter="hybrid", plan=plan)
    assert info.value.argument == "epsilon" and "filter='rdp'" in str(info.value)


def test_the_hybrid_range_refuses_no_rdp_ledger_and_keeps_its_end():
    assert Ledger(1e6, 1e-5, plan=STEP).target == (1e6, 1e-5)
    assert Ledger(100.0, 1e-5, filter="hybrid").target == (100.0, 1e-5)


def test_a_stored_hybrid_ledger_beyond_the_range_still_opens(tmp_path, monkeypatch):
    from privguard._accounting import _hybrid

    path = tmp_path / "l.db"
    with monkeypatch.context() as mp:  # as a version before the range wrote it
        mp.setattr(_hybrid, "MAX_EPSILON", 1e9, raising=False)
        Ledger(150.0, 1e-5, filter="hybrid", path=path).close()
    assert Ledger.open(path).target == (150.0, 1e-5)


# -- the sweep -------------------------------------------------------------------------------
ARRAY = np.array([1.0, 2.0])


@pytest.mark.parametrize("call,name", [
    (lambda: Ledger(3.0, 1e-5, odometer=ARRAY), "odometer"),
    (lambda: Ledger(3.0, 1e-5, odometer=np.array("tight")), "odometer"),
    (lambda: Ledger(3.0, 1e-5, filter=ARRAY), "filter"),
    (lambda: Odometer([2.0, 3.0], mode=ARRAY), "mode"),
    (lambda: Odometer([2.0, 3.0], mode="fast"), "mode"),
    (lambda: paper_extrapolation(optimizer=ARRAY), "optimizer"),
])
def test_an_array_where_a_name_goes_is_refused_naming_it(call, name):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert info.value.argument == name


@pytest.mark.parametrize("params,name", [
    (None, "params"), ({}, "params"), ({"sample_rate": 0.01}, "params"),
    ({"sample_rate": "0.01", "steps": 10}, "sample_rate"),
    ({"sample_rate": 10**400, "steps": 10}, "sample_rate"),
    ({"sample_rate": ARRAY, "steps": 10}, "sample_rate"),
    ({"sample_rate": 0.01, "steps": float("nan")}, "steps"),
    ({"sample_rate": 0.01, "steps": float("inf")}, "steps"),
    ({"sample_rate": 0.01, "steps": 10.7}, "steps"),
    ({"sample_rate": 0.01, "steps": True}, "steps"),
    ({"sample_rate": 0.01, "steps": ARRAY}, "steps"),
])
def test_dpsgd_cost_checks_each_candidate(params, name):
    with pytest.raises(InvalidArgumentError) as info:
        dpsgd_cost(3.0, 1e-5)(params)
    assert info.value.argument == name


def test_dpsgd_cost_takes_a_whole_float_step_count():
    cost = dpsgd_cost(3.0, 1e-5)
    assert cost({"sample_rate": 0.01, "steps": 100.0}) == cost({"sample_rate": 0.01, "steps": 100})


P = np.array([0.5, 0.5])


@pytest.mark.parametrize("call,name", [
    (lambda: project_bounded_simplex({}, P * 0, P * 2), "p"),
    (lambda: project_bounded_simplex(["a", "b"], P * 0, P * 2), "p"),
    (lambda: project_bounded_simplex(P, [10**400, 0], P * 2), "lower"),
    (lambda: project_bounded_simplex(P, P * 0, [1j, 1j]), "upper"),
    (lambda: project_density(P, P, None, 0.5), "C"),
    (lambda: project_density(P, P, "2", 0.5), "C"),
    (lambda: project_density(P, P, 2.0, 10**400), "c"),
    (lambda: project_density(P, [1e308, 1e308], 2.0, 0.5), "upper"),
    (lambda: project_density(P, "", 2.0, 0.5), "prior"),
])
def test_the_projections_check_their_arguments(call, name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidArgumentError) as info:
            call()
    assert info.value.argument == name


SCORES, INCLUDED = np.array([3.0, 2.0, 1.0, 0.0]), np.array([True, False, True, False])


@pytest.mark.parametrize("kw,name", [
    (dict(scores=float("nan")), "scores"),
    (dict(included=float("nan")), "included"),
    (dict(included=INCLUDED[:3]), "included"),
    (dict(included=INCLUDED.astype(float)), "included"),
    (dict(k_in=float("nan")), "k_in"),
    (dict(k_in=ARRAY), "k_in"),
    (dict(k_in=np.uint64(2**64 - 1)), "k_in"),
    (dict(k_out=-1), "k_out"),
    (dict(k_in=3, k_out=2), "k_out"),
])
def test_guess_and_count_checks_its_arguments(kw, name):
    args = dict(scores=SCORES, included=INCLUDED, k_in=1, k_out=1) | kw
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidArgumentError) as info:
            guess_and_count(**args)
    assert info.value.argument == name


def test_guess_and_count_still_counts():
    assert guess_and_count(SCORES, INCLUDED, 1, 1) == (2, 2)
    assert guess_and_count(SCORES, INCLUDED, 2, 2) == (4, 2)


@pytest.mark.parametrize("name", ["", "a b", "a&sslmode=disable", "a#b", 5])
def test_server_init_names_a_bad_ledger_name_as_ledger(name):
    pytest.importorskip("psycopg")
    from privguard._stores._pgadmin import server_init

    with pytest.raises(InvalidArgumentError) as info:  # before any connection is tried
        server_init("postgresql://x@127.0.0.1:1/db", name, 1.0, 1e-5)
    assert info.value.argument == "ledger"


@pytest.mark.parametrize("bad", ["no", 1, None, np.array([True, False])])
def test_ledger_accountant_charge_is_a_flag(bad):
    pytest.importorskip("opacus")
    from privguard.integrations.opacus import LedgerAccountant

    with pytest.raises(InvalidArgumentError) as info:
        LedgerAccountant(Ledger(delta=1e-5), charge=bad)
    assert info.value.argument == "charge"


def test_a_dp_hypo_prior_beyond_the_float_range_is_refused_naming_it():
    from privguard.tuning import Choice, DPHyPOSearch, TruncatedNegativeBinomial

    with pytest.raises(InvalidArgumentError) as info:
        DPHyPOSearch({"a": Choice([1, 2])}, TruncatedNegativeBinomial(0.5, gamma=0.5),
                     cost=STEP, prior=10**400, update=lambda h, p: p, progress=False)
    assert info.value.argument == "prior"


@pytest.mark.parametrize("bad", [-1, 3, 10**9, 1.0, "1", True, np.array([1, 2]), None])
def test_a_runs_record_outside_the_run_is_refused(bad):
    ledger = Ledger(3.0, 1e-5)
    ledger.charge(STEP, times=3)
    run = ledger.runs[0]
    with pytest.raises(InvalidArgumentError) as info:
        run.record(bad)
    assert info.value.argument == "i"
    assert [run.record(i) for i in range(3)] == list(ledger.history)


def _opacus_step(sample_rate):
    """An Opacus optimizer (PRV accountant hooked) attached with ``sample_rate``; one step."""
    torch = pytest.importorskip("torch")
    model, opt, loader = private_linear()  # (skips without Opacus)
    from privguard.integrations.opacus import attach

    # no target: a rate below the hook's q = 0.25 is charged at 0.25 (review lo2), which an
    # (ε = 3, δ) filter refuses for σ = 1
    ledger = Ledger(delta=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the designed AccountantWarning (PRV engine)
        attach(opt, ledger, sample_rate=sample_rate, check_poisson=False)
    x, y = next(iter(loader))
    torch.nn.functional.mse_loss(model(x), y).backward()
    try:
        opt.step()
    finally:
        assert len(ledger.history) <= 1
    return ledger


@pytest.mark.parametrize("bad", ["0.1", None, True, 10**400, [0.1, 0.2], float("nan")],
                         ids=["str", "none", "bool", "huge-int", "list", "nan"])
def test_a_sample_rate_callable_returning_a_bad_value_is_refused_uncharged(bad):
    with pytest.raises(InvalidArgumentError) as info:
        _opacus_step(lambda: bad)
    assert info.value.argument == "sample_rate"


def test_a_subnormal_sample_rate_attaches_under_a_prv_engine():
    # the PRV warning's epoch of 1/q steps was inf: OverflowError escaped attach
    assert len(_opacus_step(1e-320).history) == 1


@pytest.mark.parametrize("name", ["num_cpus", "num_gpus"])
@pytest.mark.parametrize("bad", [10**400, -1, float("nan"), True, "1"], ids=str)
def test_ray_resources_beyond_the_float_range_are_refused_naming_them(name, bad):
    from privguard.integrations.ray import RayExecutor

    with pytest.raises(InvalidArgumentError) as info:
        RayExecutor(**{name: bad})
    assert info.value.argument == name


def test_a_checkpoint_listing_an_unknown_event_kind_is_unreadable():
    # a store opened from a checkpoint takes the events before it from the checkpoint's list
    from privguard._accounting._accounting import Accounting

    ledger = Ledger(3.0, 1e-5)
    ledger.charge(STEP)
    ledger._acc.replay_event(NOTE)  # fresh: a newer version's own event
    snap = ledger._acc.snapshot()
    with pytest.raises(LedgerStateError, match="'note', unknown to this privguard"):
        Accounting.from_snapshot(snap)


@pytest.fixture()
def infinite_ledger(tmp_path):
    path = tmp_path / "inf.db"
    ledger = Ledger(delta=1e-5, path=path)
    ledger.charge(M.PureDP(1e308), times=3)  # spent +inf at every order
    ledger.close()
    return path


def test_report_json_of_an_infinite_epsilon_is_strict_json(infinite_ledger, capsys):
    import json

    from privguard._cli._cli import main

    assert main(["report", str(infinite_ledger), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["running_epsilon"] == "inf" and data["naive_epsilon_not_a_guarantee"] == "inf"


def test_plot_of_an_infinite_epsilon_draws_without_a_warning(infinite_ledger, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from privguard._cli._cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["plot", str(infinite_ledger), "-o", str(tmp_path / "e.png")]) == 0
    assert (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"
