"""The Hugging Face TrainerCallback on a tiny model: charges, logs ε, stops, checkpoints."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
import transformers  # privguard[huggingface], installed by the test extra
from opacus import GradSampleModule
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.utils.data import DataLoader, Dataset

from privguard import InvalidArgumentError, Ledger, LedgerStateError, PipelineMismatchError
from privguard import mechanisms as M
from privguard.integrations.huggingface import LEDGER_FILE, LedgerTrainerCallback
from privguard.integrations.opacus import NonPoissonSamplingError, attach

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
N, BATCH = 256, 32


class Pairs(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, 10, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 2)

    def forward(self, x, labels=None, **unused):
        logits = self.lin(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class PoissonTrainer(transformers.Trainer):
    """Feeds Poisson-sampled batches (Opacus' DPDataLoader), as the accounting assumes."""

    def get_train_dataloader(self):
        base = DataLoader(self.train_dataset, batch_size=BATCH,
                          collate_fn=transformers.default_data_collator)
        return DPDataLoader.from_data_loader(base)


def make_trainer(tmp_path, ledger, trainer_cls=None, cb_kwargs=None, eval_dataset=None, **kw):
    torch.manual_seed(0)
    model = GradSampleModule(Tiny())
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                      max_grad_norm=1.0, expected_batch_size=BATCH)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH, logging_steps=1,
        report_to=[], use_cpu=True, remove_unused_columns=False, disable_tqdm=True, **kw)
    cb = LedgerTrainerCallback(ledger, **(cb_kwargs or {}))  # the rate: from the loader
    return (trainer_cls or PoissonTrainer)(model=model, args=args, train_dataset=Pairs(),
                                           eval_dataset=eval_dataset, optimizers=(opt, None),
                                           callbacks=[cb]), cb


def test_charges_logs_and_stops_at_exhaustion(tmp_path):
    step = M.SubsampledGaussian(1.0, BATCH / N)
    ledger = Ledger(3.0, 1e-5, plan=step)
    allowed = ledger.remaining(step).repeats
    trainer, _cb = make_trainer(tmp_path, ledger, num_train_epochs=100, save_strategy="no")
    trainer.train()
    assert len(ledger.history) == allowed == trainer.state.global_step
    logged = [h["privacy_epsilon"] for h in trainer.state.log_history if "privacy_epsilon" in h]
    assert logged and logged[-1] == pytest.approx(ledger.epsilon())


def test_state_round_trips_through_a_checkpoint(tmp_path):
    ledger = Ledger(delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, ledger, max_steps=4, save_strategy="steps", save_steps=4)
    trainer.train()
    ckpt = tmp_path / "checkpoint-4"
    assert (ckpt / LEDGER_FILE).exists()
    fresh = Ledger(delta=1e-5)
    trainer2, _ = make_trainer(tmp_path, fresh, max_steps=6, save_strategy="no")
    trainer2.train(resume_from_checkpoint=str(ckpt))
    assert len(fresh.history) == 6  # 4 restored + 2 new
    assert {r.mechanism.sample_rate for r in fresh.history} == {BATCH / N}  # read from the loader


def test_a_plain_trainer_shuffled_loader_is_refused_before_any_step(tmp_path):
    ledger = Ledger(delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, ledger, trainer_cls=transformers.Trainer, max_steps=3,
                               save_strategy="no")
    with pytest.raises(NonPoissonSamplingError) as info:
        trainer.train()
    assert info.value.argument == "train_dataloader" and len(ledger.history) == 0
    opted_out = Ledger(delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, opted_out, trainer_cls=transformers.Trainer,
                               cb_kwargs={"check_poisson": False, "sample_rate": BATCH / N},
                               max_steps=3, save_strategy="no")
    trainer.train()
    assert len(opted_out.history) == 3  # the explicit, documented opt-out


def _train_and_save(tmp_path, ledger):
    trainer, _cb = make_trainer(tmp_path, ledger, max_steps=4, save_strategy="steps",
                               save_steps=4)
    trainer.train()
    return tmp_path / "checkpoint-4"


def test_a_resume_never_rewinds_and_never_starts_a_fresh_budget(tmp_path):
    ledger = Ledger(delta=1e-5)
    ckpt = _train_and_save(tmp_path, ledger)
    ledger.charge(M.SubsampledGaussian(1.0, BATCH / N), label="a later step")
    trainer, _ = make_trainer(tmp_path, ledger, max_steps=6, save_strategy="no")
    trainer.train(resume_from_checkpoint=str(ckpt))
    assert len(ledger.history) == 7  # 4 + the later one (not rewound) + 2 new
    foreign = Ledger(delta=1e-5)
    foreign.charge(M.Gaussian(5.0), label="another run")
    trainer, _ = make_trainer(tmp_path, foreign, max_steps=6, save_strategy="no")
    with pytest.raises(LedgerStateError):
        trainer.train(resume_from_checkpoint=str(ckpt))
    (ckpt / LEDGER_FILE).unlink()
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=6, save_strategy="no")
    with pytest.raises(LedgerStateError, match="fresh budget"):
        trainer.train(resume_from_checkpoint=str(ckpt))


def test_a_file_backed_ledger_resumes_from_its_file(tmp_path):
    db = str(tmp_path / "ledger.db")
    ckpt = _train_and_save(tmp_path, Ledger(delta=1e-5, path=db, lease=1))  # exact counts
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=6, save_strategy="no")
    with pytest.raises(LedgerStateError, match=r"ledger\.db"):
        trainer.train(resume_from_checkpoint=str(ckpt))
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5, path=db, lease=1), max_steps=6,
                              save_strategy="no")
    trainer.train(resume_from_checkpoint=str(ckpt))
    assert len(Ledger.open(db).history) == 6


def test_the_callback_pickles_without_its_live_attachment():
    ledger = Ledger(delta=1e-5)
    model = GradSampleModule(Tiny())
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                      max_grad_norm=1.0, expected_batch_size=BATCH)
    cb = LedgerTrainerCallback(ledger)
    cb.handle = attach(opt, ledger, sample_rate=BATCH / N, check_poisson=False)
    ledger.charge(M.SubsampledGaussian(1.0, BATCH / N))
    copy = pickle.loads(pickle.dumps(cb))
    assert copy.handle is None and len(copy.ledger.history) == 1


def test_bad_arguments():
    for kwargs, name in [({"check_poisson": "no"}, "check_poisson"), ({"label": 1}, "label"),
                         ({"log_name": None}, "log_name"), ({"witnesses": "yes"}, "witnesses")]:
        with pytest.raises(InvalidArgumentError) as info:
            LedgerTrainerCallback(Ledger(delta=1e-5), **kwargs)
        assert info.value.argument == name


def test_gradient_accumulation_steps_are_charged_as_accumulation(tmp_path):
    # issue 27: gradient_accumulation_steps=2 is two Poisson micro-batches per step,
    # charged AccumulatedSubsampledGaussian(σ, q, 2), not SubsampledGaussian(σ, 2q)
    ledger = Ledger(delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, ledger, max_steps=3, save_strategy="no",
                               gradient_accumulation_steps=2)
    trainer.train()
    assert trainer.state.global_step == 3
    assert [r.mechanism for r in ledger.history] == [
        M.AccumulatedSubsampledGaussian(1.0, BATCH / N, 2)] * 3


def test_gradient_accumulation_steps_under_a_hybrid_ledger_with_the_plan(tmp_path):
    # issue 27 (docs/theory.md §2b.1, §14.2): the PLD envelope of an accumulated step is
    # proved for aligned=True only; the callback charges the default (it cannot see
    # dropout or augmentation): a default plan is refused under the hybrid filter, and
    # under an aligned plan the charges are outside, so part A closes
    from privguard import Plan

    step = M.AccumulatedSubsampledGaussian(1.0, BATCH / N, 2)
    with pytest.raises(InvalidArgumentError, match="aligned=True"):
        Ledger(epsilon=8.0, delta=1e-5, plan=Plan(step, steps=3), filter="hybrid")
    aligned = M.AccumulatedSubsampledGaussian(1.0, BATCH / N, 2, aligned=True)
    ledger = Ledger(epsilon=40.0, delta=1e-5, plan=Plan(aligned, steps=3), filter="hybrid")
    trainer, _ = make_trainer(tmp_path, ledger, max_steps=3, save_strategy="no",
                               gradient_accumulation_steps=2)
    with pytest.warns(UserWarning, match="left the plan"):
        trainer.train()
    assert [r.mechanism for r in ledger.history] == [step] * 3
    assert not ledger._acc.filter.a_alive


@pytest.mark.parametrize("created", [(), (None, 1e-6)])
def test_the_logged_epsilon_after_a_retarget_is_at_the_delta_fixed_first(tmp_path, created):
    # The callback logged ledger.epsilon() at the retargeted δ (chosen after outputs); for
    # a ledger created without δ it now has no δ to log at, and must not stop training.
    db = str(tmp_path / "r.db")
    with Ledger(*created, path=db, lease=1) as ledger:
        ledger.charge(M.SubsampledGaussian(1.0, BATCH / N), times=10)
    ledger = Ledger(delta=1e-3, path=db, lease=1, retarget="after outputs")
    trainer, _ = make_trainer(tmp_path, ledger, max_steps=3, save_strategy="no")
    trainer.train()
    logged = [h["privacy_epsilon"] for h in trainer.state.log_history if "privacy_epsilon" in h]
    if created:
        assert logged and logged[-1] == pytest.approx(ledger.epsilon(1e-6)) \
            and logged[-1] > ledger.epsilon(1e-3)
    else:
        assert not logged
    assert len(ledger.history) == 13
    ledger.close()


# ------------------------------------------------------------------ witnesses (task gc)
WITNESS_LABEL = "witnesses: δ set aside for false alarms"


def test_witnesses_check_every_step_and_set_their_delta_aside_once(tmp_path, monkeypatch):
    # the option LedgerCallback has: attach(..., witnesses=True) under the Trainer
    import privguard.integrations.huggingface as hf

    ledger = Ledger(epsilon=10.0, delta=1e-5)
    trainer, cb = make_trainer(tmp_path, ledger, cb_kwargs={"witnesses": True}, max_steps=4,
                               save_strategy="no")
    checked = []

    def spy(*args, **kwargs):  # keeps the handle, which on_train_end detaches and drops
        checked.append(attach(*args, **kwargs))
        return checked[-1]

    monkeypatch.setattr(hf, "attach", spy)
    trainer.train()
    (handle,) = checked
    assert handle.witnesses is not None and handle.witnesses.steps == 4
    labels = [r.label for r in ledger.history]
    assert labels.count(WITNESS_LABEL) == 1 and labels.count("step") == 4
    assert cb.witnesses is True


def test_witnesses_refuse_a_step_without_noise_before_it_is_charged_or_applied(tmp_path):
    ledger = Ledger(epsilon=10.0, delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, ledger, cb_kwargs={"witnesses": True}, max_steps=4,
                                save_strategy="no")
    opt = trainer.optimizer

    def add_noise():  # a pipeline bug: the noise is never added
        for p in opt.params:
            p.grad = p.summed_grad.clone().view_as(p)

    opt.add_noise = add_noise
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(PipelineMismatchError) as info:
        trainer.train()
    assert info.value.witness == "noise"
    assert len(ledger.history) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_witnesses_need_a_target_and_the_run_charges_nothing(tmp_path):
    ledger = Ledger(delta=1e-5)
    trainer, _cb = make_trainer(tmp_path, ledger, cb_kwargs={"witnesses": True}, max_steps=2,
                                save_strategy="no")
    with pytest.raises(InvalidArgumentError) as info:
        trainer.train()
    assert info.value.argument == "witnesses" and len(ledger.history) == 0


def test_a_callback_pickled_before_the_witnesses_option_has_them_off():
    cb = LedgerTrainerCallback(Ledger(delta=1e-5))
    del cb.__dict__["witnesses"]  # as unpickled from a version without the option
    copy = pickle.loads(pickle.dumps(cb))
    assert copy.witnesses is False


def test_a_resume_reads_the_ledger_of_the_checkpoint_at_the_resumed_step(tmp_path):
    # Review cbk: TrainingArguments(resume_from_checkpoint=...) is read first, but the Trainer
    # resumes from train(resume_from_checkpoint=...): a stale argument naming checkpoint-3
    # while training resumed from checkpoint-6 loaded 3 charges into the fresh ledger, and the
    # 8-step model was charged 5 steps. An entry is taken only from a folder whose
    # trainer_state.json is at the resumed step.
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=6, save_steps=3)
    trainer.train()
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=8, save_strategy="no",
                              resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert trainer.state.global_step == 8
    assert len(fresh.history) == 8  # 6 restored + 2
    (tmp_path / "checkpoint-6" / LEDGER_FILE).unlink()  # and no entry at step 6: refused
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=8, save_strategy="no",
                              resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    with pytest.raises(LedgerStateError, match="fresh budget"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))


def test_the_epsilon_reaches_a_callback_before_it_only_once_the_callback_is_moved_first(
        tmp_path):
    # The module docstring's advice for report_to trackers, which the Trainer calls before
    # the callbacks passed to it
    class Seen(transformers.TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs))

    seen = Seen()
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=2, save_strategy="no")
    trainer.callback_handler.callbacks.insert(0, seen)  # where report_to's callbacks sit
    trainer.train()
    assert seen.logs and all("privacy_epsilon" not in logs for logs in seen.logs)
    seen.logs.clear()
    trainer.callback_handler.callbacks.insert(0, trainer.pop_callback(LedgerTrainerCallback))
    trainer.train()
    assert seen.logs and all("privacy_epsilon" in logs for logs in seen.logs)


def two_runs_at_the_same_step(tmp_path):
    """Run A's checkpoint-3 copied to ``tmp_path/copy``, then run B (σ = 4) saving its own
    checkpoint-3 into the same output_dir, ``tmp_path/out`` (returned)."""
    import shutil

    out = tmp_path / "out"
    trainer, _ = make_trainer(out, Ledger(delta=1e-5), max_steps=3, save_steps=3)
    trainer.train()
    shutil.copytree(out / "checkpoint-3", tmp_path / "copy")
    trainer, _ = make_trainer(out, Ledger(delta=1e-5), max_steps=3, save_steps=3, seed=1)
    trainer.optimizer.noise_multiplier = 4.0
    trainer.train()
    return out


def test_a_resume_does_not_take_the_entry_of_another_run_at_the_same_step(tmp_path):
    # Review cbk: run A's checkpoint-3 is copied aside; run B (σ = 4) then writes its own
    # checkpoint-3 into the same output_dir. Resuming A from the copy read B's entry from
    # <output_dir>/checkpoint-3 (the step matches): A's fresh ledger took B's weaker charges.
    # The folder's trainer_state.json must be the resumed one (its log history too).
    out = two_runs_at_the_same_step(tmp_path)
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(out, fresh, max_steps=5, save_strategy="no")
    with pytest.raises(LedgerStateError, match="fresh budget"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "copy"))
    assert len(fresh.history) == 0
    trainer, _ = make_trainer(out, fresh, max_steps=5, save_strategy="no",
                              resume_from_checkpoint=str(tmp_path / "copy"))
    trainer.train(resume_from_checkpoint=str(tmp_path / "copy"))
    assert [r.mechanism for r in fresh.history] == [M.SubsampledGaussian(1.0, BATCH / N)] * 5


def test_a_resume_does_not_take_an_entry_without_the_checkpoints_trainer_state(tmp_path):
    # Review cbk: under hyperparameter_search the Trainer writes each trial's checkpoints to
    # <output_dir>/run-<trial>/checkpoint-<step>, while on_save writes the entry to
    # <output_dir>/checkpoint-<step>, the same folder for every trial: an entry found there
    # without the checkpoint's trainer_state.json may be any trial's (here one at σ = 4,
    # which the resumed trial's fresh ledger took), and is not taken.
    import shutil

    out = tmp_path / "out"
    trainer, _ = make_trainer(out, Ledger(delta=1e-5), max_steps=3, save_steps=3)
    trainer.train()
    shutil.move(out / "checkpoint-3", tmp_path / "run-0")
    other, _ = make_trainer(tmp_path / "other", Ledger(delta=1e-5), max_steps=3, save_steps=3)
    other.optimizer.noise_multiplier = 4.0
    other.train()
    (out / "checkpoint-3").mkdir()
    shutil.copy(tmp_path / "other" / "checkpoint-3" / LEDGER_FILE, out / "checkpoint-3")
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(out, fresh, max_steps=5, save_strategy="no")
    with pytest.raises(LedgerStateError, match="fresh budget"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "run-0"))
    assert len(fresh.history) == 0


@pytest.mark.parametrize("run_id_removed", [False, True])
def test_a_resume_does_not_take_the_entry_of_another_run_with_the_same_log_history(
        tmp_path, run_id_removed):
    # Review rcb: without logs (logging_strategy="no", or logging_steps past the save) every
    # run's trainer_state.json at a step has the same (empty) log history. Run A's
    # checkpoint-3 is copied aside; run B (σ = 4) writes its own checkpoint-3 into output_dir;
    # resuming A from the copy took B's entry from <output_dir>/checkpoint-3, and A's fresh
    # ledger held B's weaker charges. The entry names the run and step it was written for, and
    # the Trainer's state loaded from the checkpoint resumed from names the same run.
    import shutil

    out = tmp_path / "out"
    trainer, _ = make_trainer(out, Ledger(delta=1e-5), max_steps=3, save_steps=3,
                              logging_strategy="no")
    trainer.train()
    shutil.copytree(out / "checkpoint-3", tmp_path / "copy")
    if run_id_removed:  # (the entry names it: not taken as one written before run ids)
        written = json.loads((tmp_path / "copy" / "trainer_state.json").read_text())
        del written["stateful_callbacks"]["privguard"]
        (tmp_path / "copy" / "trainer_state.json").write_text(json.dumps(written))
    trainer, _ = make_trainer(out, Ledger(delta=1e-5), max_steps=3, save_steps=3, seed=1,
                              logging_strategy="no")
    trainer.optimizer.noise_multiplier = 4.0
    trainer.train()
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(out, fresh, max_steps=5, save_strategy="no", logging_strategy="no")
    with pytest.raises(LedgerStateError, match="fresh budget"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "copy"))
    assert len(fresh.history) == 0
    trainer, _ = make_trainer(out, fresh, max_steps=5, save_strategy="no", logging_strategy="no",
                              resume_from_checkpoint=str(tmp_path / "copy"))
    if run_id_removed:  # an edited state: refused even with its own folder named
        with pytest.raises(LedgerStateError, match="fresh budget"):
            trainer.train(resume_from_checkpoint=str(tmp_path / "copy"))
        assert len(fresh.history) == 0
        return
    trainer.train(resume_from_checkpoint=str(tmp_path / "copy"))
    assert [r.mechanism for r in fresh.history] == [M.SubsampledGaussian(1.0, BATCH / N)] * 5


@pytest.mark.parametrize("how", ["latest", "rotated", "best model", "evaluated", "copied",
                                 "legacy entry", "callback states"])
def test_every_ordinary_resume_takes_the_checkpoints_entry(tmp_path, how):
    # Review rcb: the checks that pass over other runs' entries must not refuse a resume a user
    # does: the latest checkpoint (resume_from_checkpoint=True), after save_total_limit rotated
    # the older ones away, with load_best_model_at_end, after trainer.evaluate(), from a copy
    # named in TrainingArguments, from an entry written before entries named their run, and
    # with restore_callback_states_from_checkpoint (which reads stateful_callbacks).
    import shutil

    out = tmp_path / "out"
    kw = {"max_steps": 6, "save_steps": 3}
    if how == "rotated":
        kw["save_total_limit"] = 1
    if how == "best model":
        kw.update(load_best_model_at_end=True, eval_strategy="steps", eval_steps=3,
                  save_total_limit=1, metric_for_best_model="runtime")
    trainer, _ = make_trainer(out, Ledger(delta=1e-5), eval_dataset=Pairs(), **kw)
    trainer.train()
    if how == "evaluated":
        trainer.evaluate()
    folder = out / "checkpoint-6"
    if how == "copied":
        folder = tmp_path / "elsewhere"
        shutil.move(out / "checkpoint-6", folder)
    if how == "legacy entry":  # as written by the callback before review rcb
        entry = json.loads((folder / LEDGER_FILE).read_text())
        del entry["checkpoint"]
        (folder / LEDGER_FILE).write_text(json.dumps(entry))
        written = json.loads((folder / "trainer_state.json").read_text())
        del written["stateful_callbacks"]["privguard"]
        (folder / "trainer_state.json").write_text(json.dumps(written))
    fresh = Ledger(delta=1e-5)
    more = {"restore_callback_states_from_checkpoint": True} if how == "callback states" else {}
    trainer, _ = make_trainer(out, fresh, max_steps=8, save_strategy="no",
                              resume_from_checkpoint=str(folder) if how == "copied" else None,
                              **more)
    latest = how in ("latest", "rotated", "best model")  # (the best one may be checkpoint-3)
    trainer.train(resume_from_checkpoint=True if latest else str(folder))
    assert trainer.state.global_step == 8
    assert len(fresh.history) == 8  # the checkpoint's steps restored, and the rest charged


def test_the_epsilon_a_float32_tracker_records_is_never_below_the_ledgers(tmp_path):
    # Review rcb: the docstring sends ε to report_to trackers (callback moved first); the
    # TensorBoard one stores a float32 rounded to nearest, about every other ε below the
    # ledger's. The callback logs ε rounded up to a float32, as the Lightning one does.
    ledger = Ledger(delta=1e-5)

    class Tracker(transformers.TrainerCallback):
        def __init__(self):
            self.seen = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            stored = float(torch.tensor(logs["privacy_epsilon"], dtype=torch.float32))
            self.seen.append((stored, ledger.epsilon()))

    tracker = Tracker()
    trainer, _ = make_trainer(tmp_path, ledger, max_steps=8, save_strategy="no")
    trainer.callback_handler.callbacks.insert(0, trainer.pop_callback(LedgerTrainerCallback))
    trainer.callback_handler.callbacks.insert(1, tracker)
    trainer.train()
    assert len(tracker.seen) >= 8
    for stored, epsilon in tracker.seen:
        assert epsilon <= stored <= epsilon * (1 + 2e-7)


@pytest.mark.parametrize("stored", [{"attributes": []}, {"attributes": {"run": 7}}, "run"])
def test_a_malformed_run_id_in_the_resumed_trainer_state_is_refused(tmp_path, stored):
    # Review rcb: an edited run id raised AttributeError, or fell back to the weaker check of
    # entries written before run ids; it raises LedgerStateError, nothing charged
    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=3, save_steps=3)
    trainer.train()
    path = tmp_path / "checkpoint-3" / "trainer_state.json"
    written = json.loads(path.read_text())
    written["stateful_callbacks"]["privguard"] = stored
    path.write_text(json.dumps(written))
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=5, save_strategy="no")
    with pytest.raises(LedgerStateError, match="malformed"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert len(fresh.history) == 0
