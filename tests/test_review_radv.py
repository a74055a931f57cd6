"""Review radv (of branch adv, "review fs"): regressions and gaps in its input checks.

Each test failed on adv's head (960c27a).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from test_adv_fs_forged_state import _engine_attached, _RaisingCompare

from privguard import InvalidArgumentError, LedgerStateError


def test_dp_hypo_sampler_takes_an_optuna_history_with_an_infinite_value():
    # Optuna completes a trial whose value is inf; DPHyPOSampler hands the rule such a
    # history (as on main). adv refused it in density(), and sample_relative's fallback
    # then drew every later trial from the prior, silently.
    optuna = pytest.importorskip("optuna")
    from privguard.integrations.optuna import DPHyPOSampler, TPERule

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = {"x": [0, 1, 2, 3], "y": [0, 1]}
    sampler = DPHyPOSampler(space, rule=TPERule(space, n_samples=16, seed=0))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({"x": 3, "y": 1})
    study.optimize(lambda t: (math.inf if (t.suggest_categorical("x", [0, 1, 2, 3]),
                                           t.suggest_categorical("y", [0, 1])) == (3, 1)
                              else 1.0), n_trials=1)
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert study.trials[0].value == math.inf
    for history in ([(7, math.inf), (0, 1.0)], [(7, -math.inf)]):
        density = sampler.density(history)
        assert density.shape == (8,) and abs(density.sum() - 1.0) < 1e-12
        assert not np.allclose(density, sampler.prior)  # the rule's, not the fallback
    # the rule itself, as on main
    assert TPERule(space, n_samples=8, seed=0)([(7, math.inf)], None).sum() == 8


def test_nan_and_the_gp_rules_infinite_scores_are_still_refused():
    optuna = pytest.importorskip("optuna")
    pytest.importorskip("sklearn")
    from privguard.integrations.optuna import DPHyPOSampler, TPERule
    from privguard.tuning import GPUpdate

    del optuna
    space = {"x": [0, 1, 2, 3]}
    with pytest.raises(InvalidArgumentError, match="history"):
        DPHyPOSampler(space, rule=TPERule(space, n_samples=4)).density([(0, math.nan)])
    with pytest.raises(InvalidArgumentError, match="history"):
        GPUpdate()([(0, math.inf)], np.zeros((4, 1)))


@pytest.mark.parametrize("forge", ["charges", "version", "not a dict"])
def test_an_engine_checkpoint_with_a_malformed_entry_leaves_opacus_record_as_it_was(forge):
    # adv checked Opacus' history before loading it, but the entry only in restore(), after
    # Opacus' accountant had taken the checkpoint's history: a refused load left the engine's
    # record moved and the ledger not (a later checkpoint then paired them)
    engine, _ = _engine_attached()
    state = copy.deepcopy(engine.accountant.state_dict())
    state["history"] = [(2.0, 0.25, 3)]
    if forge == "charges":
        state["privguard"]["charges"] = -1
    elif forge == "version":
        state["privguard"]["version"] = 99
    else:
        state["privguard"] = {"format": state["privguard"]["format"], "x": 1}
    fresh, ledger = _engine_attached()
    record, before = copy.deepcopy(fresh.accountant.history), ledger.epsilon()
    with pytest.raises((InvalidArgumentError, LedgerStateError)):
        fresh.accountant.load_state_dict(state)
    assert fresh.accountant.history == record != [(2.0, 0.25, 3)]
    assert ledger.epsilon() == before


def _payload_pickle(payload: object) -> bytes:
    """A pickle of a Ledger whose __setstate__ payload is ``payload`` (an edited pickle)."""
    import pickle

    from privguard import Ledger

    class _Edited:
        def __reduce__(self):
            return (Ledger.__new__, (Ledger,), payload)

    return pickle.dumps(_Edited())


@pytest.mark.parametrize("store", [None, 5, "p.db", {"path": "p.db"}], ids=repr)
def test_a_pickle_payload_with_a_state_beside_a_store_is_refused(store):
    # {"store": None, "state": ...} passed adv's check and raised TypeError (None["path"]);
    # __getstate__ writes one or the other, never both
    import pickle

    from privguard import Ledger
    from privguard import mechanisms as M

    ledger = Ledger(epsilon=8.0, delta=1e-5)
    ledger.charge(M.Gaussian(5.0), "b")
    with pytest.raises(LedgerStateError, match="pickle"):
        pickle.loads(_payload_pickle({"store": store, "state": ledger.state_dict()}))
    # the payloads privguard writes still load
    assert pickle.loads(_payload_pickle({"state": ledger.state_dict()})).epsilon() == \
        ledger.epsilon()


@pytest.mark.parametrize("bad_row", [(1.0, 0.25), "junk", (1.0, 0.25, 2.5), (1.0, 0.25, -3)],
                         ids=repr)
def test_attach_refuses_an_opacus_record_with_a_malformed_row(bad_row):
    # history_of read a record with one malformed row as [] (nothing recorded): attach then
    # charged none of the 100 steps the well-formed row recorded (main and adv alike)
    import warnings

    torch = pytest.importorskip("torch")
    pytest.importorskip("opacus")
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from privguard import Ledger
    from privguard.integrations.opacus import attach

    def attached(history):
        model = torch.nn.Linear(2, 1)
        loader = DataLoader(TensorDataset(torch.randn(20, 2), torch.randn(20, 1)),
                            batch_size=5)
        engine = PrivacyEngine(accountant="rdp")
        ledger = Ledger(epsilon=80.0, delta=1e-5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, optimizer, loader = engine.make_private(
                module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0)
            engine.accountant.load_state_dict({"history": history, "mechanism": "rdp"})
            attach(optimizer, ledger, data_loader=loader, privacy_engine=engine)
        return ledger

    assert len(attached([(1.0, 0.25, 100)]).history) == 100
    assert len(attached([(1.0, 0.25, 100), (1.0, 0.25, 0)]).history) == 100  # 0 steps: none
    with pytest.raises(LedgerStateError, match="Opacus' accountant history"):
        attached([(1.0, 0.25, 100), bad_row])


@pytest.mark.parametrize("file_id", [np.array([1, 2]), None, 5], ids=repr)
def test_an_edited_pickle_of_a_file_ledger_with_a_forged_file_id_is_refused(tmp_path, file_id):
    # an array as the reference's file_id raised ValueError (an array's truth value) out
    # of pickle.loads; None and 5 were refused already
    import pickle

    from privguard import Ledger
    from privguard import mechanisms as M

    ledger = Ledger(epsilon=8.0, delta=1e-5, path=tmp_path / "f.db")
    try:
        ledger.charge(M.Gaussian(5.0), "b")
        payload = ledger.__getstate__()
        payload["store"] = dict(payload["store"], file_id=file_id)
        with pytest.raises(LedgerStateError, match="not the ledger that was pickled"):
            pickle.loads(_payload_pickle(payload))
        copy_ = pickle.loads(pickle.dumps(ledger))
        assert copy_.epsilon() == ledger.epsilon()
        copy_.close()
    finally:
        ledger.close()


@pytest.mark.parametrize("checksum", [np.array([1.0, 2.0]), np.array(["a", "b"]),
                                      _RaisingCompare(), "é" * 64, None],
                         ids=["float array", "str array", "raising ==", "non-ASCII", "None"])
def test_a_version_1_state_with_a_forged_checksum_is_refused(checksum):
    # adv typed load()'s header fields, but a 0.1 state (version 1) is read by _load_v1,
    # whose checksum comparison let ValueError (an array) or the raising == escape
    import json
    import pathlib

    from privguard import Ledger

    path = pathlib.Path(__file__).parent / "data" / "state-0.1.json"
    state = json.loads(path.read_text())
    assert Ledger.load_state_dict(state).epsilon() > 0  # the state as 0.1 wrote it loads
    with pytest.raises(LedgerStateError, match="checksum"):
        Ledger.load_state_dict(dict(state, checksum=checksum))


@pytest.mark.parametrize("field", ["version", "path"])
def test_a_checkpoint_entry_whose_field_cannot_be_shown_is_refused(field):
    # the refusal's message showed the field with !r: an object whose repr raises (what a
    # pickled checkpoint can carry) let RuntimeError escape
    pytest.importorskip("opacus")
    from privguard import Ledger
    from privguard import mechanisms as M
    from privguard.integrations.opacus import LedgerAccountant

    source = LedgerAccountant(Ledger(epsilon=8.0, delta=1e-5))
    source.step(noise_multiplier=1.1, sample_rate=0.01)
    state = copy.deepcopy(dict(source.state_dict()))
    state["privguard"][field] = _RaisingCompare()
    if field == "path":  # a file's entry (no state) that this ledger does not hold
        state["privguard"]["state"] = None
    target = LedgerAccountant(Ledger(epsilon=8.0, delta=1e-5))
    target.ledger.charge(M.Gaussian(5.0))
    with pytest.raises(LedgerStateError, match="repr failed"):
        target.load_state_dict(state)
    assert len(target.ledger.history) == 1 and target.history == []
