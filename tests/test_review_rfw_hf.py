"""Review rfw: Hugging Face resumes and the lineage of a run's branches (task fw)."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest

pytest.importorskip("transformers")
pytest.importorskip("opacus")

from test_huggingface import make_trainer

from privguard import Ledger, LedgerStateError


def test_a_branch_whose_parents_checkpoints_were_removed_is_still_carried(tmp_path):
    # Run A: checkpoint-2 (2 charges), checkpoint-4. Branch B resumed A's checkpoint-2
    # (carrying A's 4), ran to step 6 (checkpoint-4, -6: 8 charges); branch C resumed B's
    # checkpoint-6 and ran to step 8 (checkpoint-8: 10 charges). B's checkpoints removed (a
    # clean-up), a resume from A's checkpoint-2 found no entry connected to A: C's entries
    # named only B as the run they began from. The fresh ledger held 2 charges, not 10.
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=4, save_steps=2)
    trainer.train()
    with pytest.warns(UserWarning, match="later checkpoints"):
        trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=6, save_steps=2)
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    c = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, c, max_steps=8, save_steps=2)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert len(c.history) == 10
    for step in (4, 6):
        shutil.rmtree(tmp_path / f"checkpoint-{step}")
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=3, save_strategy="no")
    with pytest.warns(UserWarning, match="later checkpoints"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert len(fresh.history) == 10 + 1


def test_siblings_of_a_parent_whose_checkpoints_were_removed_are_still_checked(tmp_path):
    # Run A (output_dir tmp_path/a): checkpoint-2, -4. Branches B and C each resumed A's
    # checkpoint-2 into their own output_dir (tmp_path/b, tmp_path/c), neither seeing the
    # other, and ran steps 3 and 4: they fork. A's checkpoints removed, a resume from B's
    # checkpoint-4 took B's entries alone (A named as B's parent was no node of the lineage,
    # for it had no entry left), and carried B's charges while C's 2 steps ran beside it.
    trainer, _ = make_trainer(tmp_path / "a", Ledger(delta=1e-5), max_steps=4, save_steps=2)
    trainer.train()
    for name in ("b", "c"):
        at = str(tmp_path / "a" / "checkpoint-2")
        trainer, _ = make_trainer(tmp_path / name, Ledger(delta=1e-5), max_steps=4,
                                  save_steps=2, resume_from_checkpoint=at)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train(resume_from_checkpoint=at)
    shutil.rmtree(tmp_path / "a")
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=5, save_strategy="no")
    with pytest.raises(LedgerStateError, match="fork"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-4"))


def test_a_resume_from_outside_output_dir_takes_the_runs_later_checkpoints_beside_it(tmp_path):
    # Run A saved checkpoint-2 and checkpoint-4 in tmp_path/a; a resume from its
    # checkpoint-2 into another output_dir (TrainingArguments(resume_from_checkpoint=), as
    # the callback asks for a folder outside output_dir) looked for the run's later entries
    # in the new output_dir only, and the fresh ledger held 2 charges where 4 ran.
    trainer, _ = make_trainer(tmp_path / "a", Ledger(delta=1e-5), max_steps=4, save_steps=2)
    trainer.train()
    at = str(tmp_path / "a" / "checkpoint-2")
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path / "b", fresh, max_steps=3, save_strategy="no",
                              resume_from_checkpoint=at)
    with pytest.warns(UserWarning, match="later checkpoints"):
        trainer.train(resume_from_checkpoint=at)
    assert len(fresh.history) == 4 + 1


@pytest.mark.parametrize("edit", ["from removed", "base above charges"])
def test_an_edited_branch_entry_refuses_rather_than_carry_less(tmp_path, edit):
    # Run A: checkpoint-2, -4; branch B resumed A's checkpoint-2 and saved checkpoint-6 in
    # tmp_path/b. With "from" removed from B's entry (its "base" kept: task fw writes both)
    # B was no branch of A's, and a resume from A's checkpoint-2 carried A's 4 charges, not
    # B's 6; a base above the entry's own charges passed too.
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=4, save_steps=2)
    trainer.train()
    at = str(tmp_path / "checkpoint-2")
    trainer, _ = make_trainer(tmp_path / "b", Ledger(delta=1e-5), max_steps=4, save_steps=4,
                              resume_from_checkpoint=at)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=at)
    path = tmp_path / "b" / "checkpoint-4" / "privguard_ledger.json"
    entry = json.loads(path.read_text())
    assert entry["checkpoint"]["from"] and entry["charges"] == 6
    if edit == "from removed":
        del entry["checkpoint"]["from"]
    else:
        entry["checkpoint"]["base"] = 7
    path.write_text(json.dumps(entry))
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=3, save_strategy="no")
    with pytest.raises(LedgerStateError, match="edited"):
        trainer.train(resume_from_checkpoint=at)
