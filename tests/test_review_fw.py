"""Task fw: the Hugging Face callback's resumes carry every branch of a run's lineage, or
refuse where one in-memory ledger cannot hold them all."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("transformers")
pytest.importorskip("opacus")

from test_huggingface import BATCH, N, make_trainer

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard.integrations.huggingface import LEDGER_FILE

STEP = M.SubsampledGaussian(1.0, BATCH / N)


def _run_to_4(tmp_path):
    """A run to step 4, checkpoints at 2 and 4 (4 charges)."""
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=4, save_steps=2)
    trainer.train()


def test_a_checkpoint_resumed_twice_keeps_the_steps_of_the_first_resume(tmp_path):
    # The run went to checkpoint-4; a resume from its checkpoint-2 carried them (4), ran
    # steps 3 and 4 again (6 charges) and saved checkpoint-4 over the run's. A second resume
    # from checkpoint-2 found no later entry of the run (checkpoint-4 was the first resume's,
    # a train() of another run id): the fresh ledger held 2 charges, not the 6 steps that ran.
    _run_to_4(tmp_path)
    first = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, first, max_steps=4, save_steps=2)
    with pytest.warns(UserWarning, match="later checkpoints"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert len(first.history) == 6
    second = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, second, max_steps=3, save_strategy="no")
    with pytest.warns(UserWarning, match="later checkpoints"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [r.mechanism for r in second.history] == [STEP] * 7


def test_branches_that_did_not_carry_each_other_are_refused_not_taken_as_one(tmp_path):
    # The run's checkpoint-4 was moved aside while a resume from checkpoint-2 ran steps 3
    # and 4 (4 charges: it could not see them); moved back beside it, the two checkpoints
    # at step 4 hold journals alike charge for charge (same label, same step), so the
    # prefix check took them for one sequence (4 charges) while 6 steps ran. Each train()
    # records the charges it began with: a branch that began below another's is a fork.
    _run_to_4(tmp_path)
    aside = tmp_path / "aside"
    shutil.move(str(tmp_path / "checkpoint-4"), str(aside))
    first = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, first, max_steps=4, save_steps=2)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert len(first.history) == 4
    (tmp_path / "trial").mkdir()
    shutil.move(str(aside), str(tmp_path / "trial" / "checkpoint-4"))
    second = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, second, max_steps=3, save_strategy="no")
    with pytest.raises(LedgerStateError, match="fork"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert len(second.history) == 2  # the checkpoint resumed from, nothing of either branch


def test_a_forked_entry_of_the_run_refuses_the_resume_and_leaves_the_ledger(tmp_path):
    # An entry of the run at a step below the one resumed from that holds more charges
    # (another branch's) was never looked at (only later steps were): its charges ran.
    _run_to_4(tmp_path)
    entry = json.loads((tmp_path / "checkpoint-4" / LEDGER_FILE).read_text())
    other = Ledger.load_state_dict(
        json.loads((tmp_path / "checkpoint-2" / LEDGER_FILE).read_text())["state"])
    other.charge(M.SubsampledGaussian(1.0, BATCH / N), label="other branch", times=3)
    from privguard.integrations._checkpoint import ledger_entry

    forked = ledger_entry(other)
    forked["checkpoint"] = dict(entry["checkpoint"], step=3, weights="0" * 64)
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / LEDGER_FILE).write_text(json.dumps(forked))
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=5, save_strategy="no")
    with pytest.raises(LedgerStateError, match="fork"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert len(fresh.history) == 4


def test_lightnings_weights_only_is_read_from_any_trainer_method_that_takes_it():
    # The fit's weights_only was read from a frame named "_run" only: a Lightning whose
    # method that takes it has another name (fit, _fit_impl, a renamed _run) fell back to
    # torch's default silently. Any method of the trainer with the argument is read; outside
    # one, None (torch's default, under which a full-load-only checkpoint refuses the resume).
    pytest.importorskip("lightning")
    from privguard.integrations.lightning import _fit_weights_only

    class Trainer:
        def _launch(self, weights_only=None):
            return _fit_weights_only(self)

        def other(self, weights_only):
            return _fit_weights_only(object())  # not this trainer's frame

    assert Trainer()._launch(weights_only=False) is False
    assert Trainer()._launch(weights_only=True) is True
    assert Trainer()._launch() is None
    assert Trainer().other(weights_only=False) is None
    assert _fit_weights_only(Trainer()) is None


def test_an_unreadable_entry_of_another_run_still_refuses_a_start_at_step_0(tmp_path):
    # Kept (task fw, item 4; passes on main too): an entry that cannot be read names no run
    # and no weights, so it may be the one saved with the weights this train() starts from
    # (or a later entry of the resumed run's branches). The folder's trainer_state.json
    # does not prove otherwise: a hyperparameter_search trial's entry sits next to a
    # checkpoint, and a save without the callback replaces trainer_state.json, not the entry.
    _run_to_4(tmp_path)
    (tmp_path / "checkpoint-2" / LEDGER_FILE).write_text('{"format": "privguard.chec')
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=1, save_strategy="no", seed=3)
    with pytest.raises(LedgerStateError, match="unreadable"):
        trainer.train()
    assert len(fresh.history) == 0
