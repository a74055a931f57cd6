"""Leftovers of the last stop in the callbacks and the tuners' executors (task cb)."""

from __future__ import annotations

import ast
import json
import shutil
import types

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402
from test_huggingface import BATCH, N, PoissonTrainer, make_trainer, two_runs_at_the_same_step  # noqa: E402

from privguard import Ledger, LedgerStateError  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations.huggingface import LEDGER_FILE  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
STEP = M.SubsampledGaussian(1.0, BATCH / N)


# ---- 1. a weights-only resume (the checkpoint's weights loaded by hand, training at step 0)

def _load_weights(trainer, folder):
    trainer.model.load_state_dict(load_file(str(folder / "model.safetensors")))


def test_training_from_a_checkpoints_weights_carries_its_charges_with_a_warning(tmp_path):
    # A model loaded with a checkpoint's weights and trained with train() (no resume) started
    # at step 0 with a fresh in-memory ledger: its ε left out the 4 steps that trained the
    # weights, silently. The entry records the weights; the run carries its charges.
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=4, save_steps=4)
    trainer.train()
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=2, save_strategy="no")
    _load_weights(trainer, tmp_path / "checkpoint-4")
    with pytest.warns(UserWarning, match="checkpoint's 4 charges"):
        trainer.train()
    assert [r.mechanism for r in fresh.history] == [STEP] * 6  # 4 carried + 2 new
    foreign = Ledger(delta=1e-5)  # a ledger that spent something else: refused, not reset
    foreign.charge(M.Gaussian(5.0), label="another run")
    trainer, _ = make_trainer(tmp_path, foreign, max_steps=2, save_strategy="no")
    _load_weights(trainer, tmp_path / "checkpoint-4")
    with pytest.raises(LedgerStateError, match="starts at step 0 with the weights saved"):
        trainer.train()
    assert len(foreign.history) == 1
    untouched = Ledger(delta=1e-5)  # other weights (a fresh model): a fresh budget, no warning
    trainer, _ = make_trainer(tmp_path, untouched, max_steps=2, save_strategy="no", seed=3)
    trainer.train()
    assert len(untouched.history) == 2


def test_sharded_weights_are_not_tied_and_plain_ones_are_by_value_not_by_name():
    from privguard.integrations._weights import weights_digest

    plain, wrapped = torch.nn.Linear(3, 2), torch.nn.Sequential(torch.nn.Linear(3, 2))
    wrapped[0].load_state_dict(plain.state_dict())
    assert weights_digest(plain) == weights_digest(wrapped) is not None
    with torch.no_grad():
        wrapped[0].bias[0] += 1e-6
    assert weights_digest(plain) != weights_digest(wrapped)
    plain.weight.ds_id = 0  # a DeepSpeed ZeRO-3 partition: each process holds its share
    assert weights_digest(plain) is None and weights_digest(object()) is None


def test_a_weights_only_start_with_the_file_that_trained_them_goes_on_from_it(tmp_path):
    # A file-backed ledger already holds the steps that trained the weights: nothing to
    # carry, no warning; a fresh in-memory ledger is refused nothing but carries them.
    import warnings

    db = str(tmp_path / "ledger.db")
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5, path=db, lease=1), max_steps=4,
                              save_steps=4)
    trainer.train()
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5, path=db, lease=1), max_steps=2,
                              save_strategy="no")
    _load_weights(trainer, tmp_path / "checkpoint-4")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpoint's")
        trainer.train()
    assert len(Ledger.open(db).history) == 6
    other = str(tmp_path / "other.db")  # another file: refused, nothing charged to it
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5, path=other), max_steps=2,
                              save_strategy="no")
    _load_weights(trainer, tmp_path / "checkpoint-4")
    with pytest.raises(LedgerStateError, match=r"ledger\.db"):
        trainer.train()
    assert len(Ledger.open(other).history) == 0


# ---- 2. a trainer_state.json copied whole from another run

def test_a_trainer_state_copied_from_another_run_does_not_bring_that_runs_entry(tmp_path):
    # Run A's checkpoint-3 copied aside; run B (σ = 4) saves its own checkpoint-3 in
    # output_dir; B's trainer_state.json (its run id included) copied over A's. The Trainer
    # loads A's weights and B's state, and the callback took B's entry (its run and step):
    # A's fresh ledger held B's weaker charges. The entry names the weights saved with it.
    out = two_runs_at_the_same_step(tmp_path)
    shutil.copy(out / "checkpoint-3" / "trainer_state.json", tmp_path / "copy")
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(out, fresh, max_steps=5, save_strategy="no")
    with pytest.raises(LedgerStateError, match="other weights"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "copy"))
    assert len(fresh.history) == 0


# ---- 3. hyperparameter_search: each trial saves into its own folder

class TrialTrainer(PoissonTrainer):
    """Saves as hyperparameter_search does for a trial: into <output_dir>/<run name>."""

    run_name = "run-0"

    def _get_output_dir(self, trial):
        return str(self.args.output_dir) + "/" + self.run_name


def test_under_hyperparameter_search_each_trials_entry_is_next_to_its_checkpoint(tmp_path):
    # The entry went to <output_dir>/checkpoint-<step>, shared by every trial: trial 1's
    # overwrote trial 0's, and resuming trial 0 was refused (or, with one trial, the entry
    # was not in the checkpoint folder a user copies).
    for name in ("run-0", "run-1"):
        trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), trainer_cls=TrialTrainer,
                                  max_steps=3, save_steps=3)
        trainer.run_name = name
        trainer.train()
        assert (tmp_path / name / "checkpoint-3" / LEDGER_FILE).exists()
    assert not (tmp_path / "checkpoint-3").exists()
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, trainer_cls=TrialTrainer, max_steps=5,
                              save_strategy="no")
    trainer.train(resume_from_checkpoint=str(tmp_path / "run-0" / "checkpoint-3"))
    assert [r.mechanism for r in fresh.history] == [STEP] * 5


# ---- 4. save_on_each_node: every node's first process writes the entry

def test_with_save_on_each_node_each_nodes_saving_process_writes_the_entry(tmp_path):
    # Only the world's first process wrote the entry, while with save_on_each_node every
    # node's first process saves the checkpoint (args.should_save): a resume on another node
    # found no entry and was refused.
    trainer, cb = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=2, save_strategy="no")
    trainer.train()
    state = trainer.state
    state.is_world_process_zero, state.is_local_process_zero = False, True  # node 1, rank 0
    args = types.SimpleNamespace(output_dir=str(tmp_path / "node1"), save_on_each_node=True,
                                 should_save=True)
    cb.on_save(args, state, trainer.control, model=trainer.model)
    assert (tmp_path / "node1" / f"checkpoint-{state.global_step}" / LEDGER_FILE).exists()
    args.should_save = False  # a process that does not save writes nothing
    cb.on_save(args, state, trainer.control, model=trainer.model)
    shutil.rmtree(tmp_path / "node1")
    cb.on_save(args, state, trainer.control, model=trainer.model)
    assert not (tmp_path / "node1").exists()


# ---- 5. the Trainer's console prints ε rounded up

def test_the_epsilon_the_trainer_prints_is_never_below_the_ledgers(tmp_path, capsys):
    # PrinterCallback (disable_tqdm=True) and ProgressCallback print floats as f"{v:.4g}",
    # rounded to nearest: about every other printed ε was below the one in log_history.
    ledger = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, ledger, max_steps=16, save_strategy="no")
    trainer.train()
    printed = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines()
               if line.startswith("{") and "privacy_epsilon" in line]
    exact = [h["privacy_epsilon"] for h in trainer.state.log_history if "privacy_epsilon" in h]
    assert len(printed) == len(exact) >= 16
    for shown, epsilon in zip(printed, exact):
        assert float(shown["privacy_epsilon"]) >= epsilon
    assert type(exact[0]) is float and json.loads(json.dumps(exact)) == exact
