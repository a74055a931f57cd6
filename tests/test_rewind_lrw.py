"""Review lrw: a Lightning resume (``ckpt_path=``) from an earlier checkpoint of a run takes
that run's later entries too (those steps ran; a ledger never goes backwards), as Hugging
Face's callback does since review rcb2."""

from __future__ import annotations

import shutil
import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from _lightning_quiet import QUIET  # noqa: E402
from _tiny_lightning import TinyDP  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from privguard import Ledger, LedgerStateError  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations._checkpoint import ledger_entry  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402

pytestmark = [QUIET, pytest.mark.filterwarnings(
    "ignore:.*callbacks used to create the checkpoint.*", "ignore:.*exists and is not empty.*",
    "ignore:.*You called `self.log.*", "ignore:.*Checkpoint directory.*")]
CARRIED = "later checkpoints"  # the warning of a carried entry


def _fit(ledger, steps, folder=None, name="{step}", ckpt_path=None):
    """Fit to ``steps`` steps, saving every 2 steps into ``folder`` (when given)."""
    cb = LedgerCallback(ledger)
    callbacks = [cb] + ([] if folder is None else [ModelCheckpoint(
        dirpath=folder, filename=name, every_n_train_steps=2, save_top_k=-1)])
    trainer = pl.Trainer(callbacks=callbacks, accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=folder is not None, limit_val_batches=0,
                         max_steps=steps, default_root_dir=None)
    trainer.fit(TinyDP(), ckpt_path=ckpt_path)
    return cb


def _resume_refused(folder, match):
    """A fresh ledger's resume from step 2 is refused (``match``) and holds only that
    checkpoint's 2 charges."""
    fresh = Ledger(delta=1e-5)
    with pytest.raises(LedgerStateError, match=match):
        _fit(fresh, 5, ckpt_path=folder / "step=2.ckpt")
    assert len(fresh.history) == 2


def _resume_carries(ledger, folder, match):
    """``ledger``'s resume from step 2 carries the run's later entry (a warning matching
    ``match``): it holds that entry's 6 charges and the 1 of the 3 steps run after step 6."""
    with pytest.warns(UserWarning, match=match):
        _fit(ledger, 3, ckpt_path=folder / "step=2.ckpt")
    assert len(ledger.history) == 7


def test_a_resume_from_an_earlier_checkpoint_takes_the_runs_later_entry(tmp_path):
    # The run went on to steps 4 and 6, and their checkpoints are in the folder: a resume
    # from step 2 into a fresh in-memory ledger went back to 2 charges (then 3 after one
    # step), while a file-backed ledger keeps all 6 (and 7 after one step).
    _fit(Ledger(delta=1e-5), 6, tmp_path / "ckpts")
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=r"step=6\.ckpt \(6 charges, 4 carried over"):
        _fit(fresh, 3, ckpt_path=tmp_path / "ckpts" / "step=2.ckpt")
    assert len(fresh.history) == 7


def test_the_later_entries_are_found_in_the_model_checkpoints_dirpath(tmp_path):
    # the checkpoint resumed from was copied elsewhere; the run's later ones are in the
    # dirpath of the resuming trainer's ModelCheckpoint
    _fit(Ledger(delta=1e-5), 6, tmp_path / "ckpts")
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "ckpts" / "step=2.ckpt", tmp_path / "copy" / "at2.ckpt")
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=CARRIED):
        _fit(fresh, 3, tmp_path / "ckpts", name="again-{step}",
             ckpt_path=tmp_path / "copy" / "at2.ckpt")
    assert len(fresh.history) == 7


def test_an_unrelated_runs_entry_in_the_same_folder_is_not_taken(tmp_path):
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 4, folder, name="a-{step}")
    _fit(Ledger(delta=1e-5), 6, folder, name="b-{step}")  # another run, more charges
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=r"a-step=4\.ckpt \(4 charges, 2 carried over"):
        _fit(fresh, 3, ckpt_path=folder / "a-step=2.ckpt")
    assert len(fresh.history) == 5  # run a's 4, and one step: none of run b's


def _recorded_fit(ledger, ckpt_path):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _fit(ledger, 5, ckpt_path=ckpt_path)
    return [str(w.message) for w in seen if CARRIED in str(w.message)]


def test_no_later_entry_leaves_the_resume_as_it_was(tmp_path):
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 4, folder)
    fresh = Ledger(delta=1e-5)
    assert _recorded_fit(fresh, folder / "step=4.ckpt") == []  # the run's last checkpoint
    assert len(fresh.history) == 5


def test_a_checkpoint_written_before_run_ids_still_resumes_as_before(tmp_path):
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 6, folder)
    for name in ("step=2.ckpt", "step=4.ckpt", "step=6.ckpt"):  # entries as fin13 wrote them
        saved = torch.load(folder / name, weights_only=False)
        saved["callbacks"]["privguard.LedgerCallback[step]"]["privguard"].pop("checkpoint", None)
        torch.save(saved, folder / name)
    fresh = Ledger(delta=1e-5)
    assert _recorded_fit(fresh, folder / "step=2.ckpt") == []  # no run id: none found
    assert len(fresh.history) == 5


def test_a_file_backed_ledger_keeps_its_charges_and_takes_no_entry(tmp_path):
    db = str(tmp_path / "ledger.db")
    _fit(Ledger(delta=1e-5, path=db, lease=1), 6, tmp_path / "ckpts")
    reopened = Ledger(delta=1e-5, path=db, lease=1)
    assert _recorded_fit(reopened, tmp_path / "ckpts" / "step=2.ckpt") == []
    assert len(Ledger.open(db).history) == 9  # the file kept all 6, and 3 more steps


def test_a_fork_of_the_runs_entries_is_refused(tmp_path):
    # an entry naming the run whose journal does not extend the resumed one (an edited
    # checkpoint, or a branch of the run that spent other charges): never merged, and not
    # dropped either
    folder = tmp_path / "ckpts"
    cb = _fit(Ledger(delta=1e-5), 4, folder)
    other = Ledger(delta=1e-5)
    for _ in range(5):
        other.charge(M.Gaussian(5.0), label="elsewhere")
    saved = torch.load(folder / "step=4.ckpt", weights_only=False)
    entry = ledger_entry(other)
    entry["checkpoint"] = {"run": cb._run}
    saved["callbacks"]["privguard.LedgerCallback[step]"]["privguard"] = entry
    torch.save(saved, folder / "branch.ckpt")
    _resume_refused(folder, "fork")


def test_an_unreadable_checkpoint_in_the_folder_refuses_the_resume(tmp_path):
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 4, folder)
    (folder / "step=6.ckpt").write_bytes(b"truncated")
    _resume_refused(folder, r"step=6\.ckpt: unreadable")


def test_a_resumed_fits_checkpoints_belong_to_the_run_it_resumed(tmp_path):
    # the fit resumed from step 2 went on to step 6 again (its checkpoints beside the first
    # ones, in the same folder): a second resume from step 2 takes its entry, which holds the
    # first fit's 6 charges and the resumed fit's 4
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 6, folder)
    with pytest.warns(UserWarning, match=CARRIED):
        cb = _fit(Ledger(delta=1e-5), 6, folder, ckpt_path=folder / "step=2.ckpt")
    assert len(cb.ledger.history) == 10
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=r"\(10 charges, 8 carried over"):
        _fit(fresh, 3, ckpt_path=folder / "step=2.ckpt")
    assert len(fresh.history) == 11


class _Setting:  # a hyperparameter torch.load(weights_only=True) does not load
    pass


class _WithSetting(TinyDP):
    def __init__(self):
        super().__init__()
        self.save_hyperparameters({"setting": _Setting()})


def test_the_resumed_checkpoint_is_not_read_again(tmp_path):
    # the user resumes with fit(weights_only=False) from a checkpoint that needs it: the
    # search for later entries does not load that checkpoint a second time with torch's
    # default (it refused a resume that went through before)
    ledger = Ledger(delta=1e-5)
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger)], accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_steps=2)
    trainer.fit(_WithSetting())
    trainer.save_checkpoint(tmp_path / "at2.ckpt")
    fresh = Ledger(delta=1e-5)
    resumed = pl.Trainer(callbacks=[LedgerCallback(fresh)], accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, max_steps=3)
    resumed.fit(_WithSetting(), ckpt_path=tmp_path / "at2.ckpt", weights_only=False)
    assert len(fresh.history) == 3


def _fit_with_setting(ledger, steps, folder, ckpt_path=None, weights_only=None):
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger), ModelCheckpoint(
        dirpath=folder, filename="{step}", every_n_train_steps=2, save_top_k=-1)],
        accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, max_steps=steps)
    trainer.fit(_WithSetting(), ckpt_path=ckpt_path, weights_only=weights_only)


def test_the_runs_other_checkpoints_are_loaded_as_the_fit_loads_the_resumed_one(tmp_path):
    # review rlrw: the user resumes with fit(weights_only=False) (their checkpoints hold a
    # hyperparameter torch's weights-only load refuses); the run's later checkpoints, saved
    # the same way, were loaded with torch's default and refused the resume
    folder = tmp_path / "ckpts"
    _fit_with_setting(Ledger(delta=1e-5), 6, folder)
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=r"step=6\.ckpt \(6 charges, 4 carried over"):
        _fit_with_setting(fresh, 3, folder, ckpt_path=folder / "step=2.ckpt",
                          weights_only=False)
    assert len(fresh.history) == 7


def test_a_sibling_the_default_load_refuses_says_what_to_do(tmp_path):
    # review rlrw: without fit(weights_only=False) the resume is refused (the resumed file
    # itself loaded), and the message names the two ways out (it said "move the file out",
    # which drops the charges of a checkpoint of this run)
    folder = tmp_path / "ckpts"
    _fit_with_setting(Ledger(delta=1e-5), 4, folder)
    _fit(Ledger(delta=1e-5), 2, tmp_path / "plain")
    plain = tmp_path / "plain" / "step=2.ckpt"
    fresh = Ledger(delta=1e-5)
    with pytest.raises(LedgerStateError, match=r"(?s)ckpts/step=\d\.ckpt.*weights_only=False.*"
                       r"add_safe_globals") as caught:
        _fit(fresh, 3, folder, name="again-{step}", ckpt_path=plain)
    assert "move the file" not in str(caught.value)


def test_the_other_checkpoints_are_memory_mapped_not_read(tmp_path, monkeypatch):
    # review rlrw: every sibling .ckpt was read in full (GBs with large models) to find one
    # small entry; a local checkpoint is now memory-mapped, its tensors never read
    _fit(Ledger(delta=1e-5), 6, tmp_path / "ckpts")
    calls = []
    real = torch.load

    def spy(f, *args, **kwargs):
        calls.append((str(f), kwargs.get("mmap")))
        return real(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=CARRIED):
        _fit(fresh, 3, ckpt_path=tmp_path / "ckpts" / "step=2.ckpt")
    siblings = [mmap for f, mmap in calls if f.endswith(("step=4.ckpt", "step=6.ckpt"))]
    assert siblings == [True, True]
    assert len(fresh.history) == 7


def test_checkpoints_in_sub_folders_of_the_dirpath_are_found(tmp_path):
    # review rlrw: ModelCheckpoint(filename="{epoch}/{step}") saves each epoch's checkpoints
    # in a sub-folder of dirpath; a resume from epoch 0's step 2 found epoch 0's step 8 (the
    # resumed checkpoint's folder) but not epoch 1's step 12: 8 charges, not 12
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 12, folder, name="{epoch}/{step}")
    assert (folder / "epoch=1" / "step=12.ckpt").exists()
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=r"step=12\.ckpt \(12 charges, 10 carried over"):
        _fit(fresh, 3, folder, name="again-{step}", ckpt_path=folder / "epoch=0" / "step=2.ckpt")
    assert len(fresh.history) == 13


def _fit_logged(ledger, steps, root, ckpt_path=None):
    """Lightning's default layout: a logger, and ModelCheckpoint's dirpath left to Lightning
    (<root>/lightning_logs/version_N/checkpoints, a new version for each fit)."""
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger), ModelCheckpoint(
        filename="{step}", every_n_train_steps=2, save_top_k=-1)], accelerator="cpu",
        default_root_dir=root, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, max_steps=steps)
    trainer.fit(TinyDP(), ckpt_path=ckpt_path)


def test_the_runs_checkpoints_in_other_logger_versions_are_found(tmp_path):
    # review rlrw: under Lightning's default layout each fit writes its checkpoints into a
    # new version folder. The run went to step 6 (version_0); a resume from step 2 went on to
    # step 6 again (version_1, 10 charges); a second resume from step 2 (version_2) found
    # version_0's and version_2's folders only: 6 charges carried, version_1's 4 lost
    _fit_logged(Ledger(delta=1e-5), 6, tmp_path)
    at2 = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "step=2.ckpt"
    with pytest.warns(UserWarning, match=CARRIED):
        _fit_logged(Ledger(delta=1e-5), 6, tmp_path, ckpt_path=at2)
    assert (tmp_path / "lightning_logs" / "version_1" / "checkpoints" / "step=6.ckpt").exists()
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=r"version_1.*\(10 charges, 8 carried over"):
        _fit_logged(fresh, 3, tmp_path, ckpt_path=at2)
    assert len(fresh.history) == 11


def _record_broadcasts(monkeypatch):
    """The objects this callback broadcasts (tuples, or None; Lightning broadcasts its log
    dir too), recorded as they are sent."""
    from lightning.pytorch.strategies import SingleDeviceStrategy

    sent = []
    real = SingleDeviceStrategy.broadcast

    def record(self, obj, src=0):
        if isinstance(obj, tuple) or obj is None:
            sent.append(obj)
        return real(self, obj, src)

    monkeypatch.setattr(SingleDeviceStrategy, "broadcast", record)
    return sent


def test_every_rank_carries_what_rank_0_found(tmp_path, monkeypatch):
    # review rlrw: under DDP every rank read its own disk; a rank whose node lacks the run's
    # later checkpoints (node-local disks: only rank 0 saves them) carried fewer charges
    # than rank 0 (or refused alone, the others waiting for it). Rank 0 now reads them and
    # broadcasts what it found: here rank 0's broadcast is recorded, the later checkpoints
    # are removed (the other node's disk), and a fit as rank 1 receives rank 0's finding
    from lightning.pytorch.strategies import SingleDeviceStrategy

    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 6, folder)
    sent = _record_broadcasts(monkeypatch)
    rank0 = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=CARRIED):
        _fit(rank0, 3, ckpt_path=folder / "step=2.ckpt")
    assert len(rank0.history) == 7 and len(sent) == 1
    for name in ("step=4.ckpt", "step=6.ckpt"):
        (folder / name).unlink()
    monkeypatch.setattr(SingleDeviceStrategy, "broadcast",  # what rank 1 receives from rank 0
                        lambda self, obj, src=0: sent[0] if obj is None else obj)
    monkeypatch.setattr(pl.Trainer, "is_global_zero", property(lambda self: False))
    _resume_carries(Ledger(delta=1e-5), folder, r"step=6\.ckpt \(6 charges, 4 carried over")


def test_a_refusal_on_rank_0_is_raised_on_every_rank(tmp_path, monkeypatch):
    from lightning.pytorch.strategies import SingleDeviceStrategy

    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 4, folder)
    monkeypatch.setattr(pl.Trainer, "is_global_zero", property(lambda self: False))
    monkeypatch.setattr(SingleDeviceStrategy, "broadcast",
                        lambda self, obj, src=0: ("refused", "rank 0: x.ckpt: unreadable")
                        if obj is None else obj)
    _resume_refused(folder, r"rank 0: x\.ckpt: unreadable")


def test_a_dangling_link_in_the_folder_does_not_refuse_the_resume(tmp_path):
    # review rlrw: ModelCheckpoint(save_last="link") writes last.ckpt as a link; one left
    # pointing at a removed file holds no entry, and refused the resume as "unreadable"
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 6, folder)
    (folder / "last.ckpt").symlink_to(folder / "gone.ckpt")
    _resume_carries(Ledger(delta=1e-5), folder, r"step=6\.ckpt \(6 charges, 4 carried over")


def test_an_unexpected_error_on_rank_0_is_sent_before_it_is_raised(tmp_path, monkeypatch):
    # review rlrw: rank 0 raising anything but LedgerStateError while it searched left the
    # other ranks waiting in the broadcast; it is sent as a refusal, then raised
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 4, folder)
    sent = _record_broadcasts(monkeypatch)

    def boom(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(LedgerCallback, "_find_later", boom)
    with pytest.raises(OSError, match="disk gone"):
        _fit(Ledger(delta=1e-5), 5, ckpt_path=folder / "step=2.ckpt")
    assert sent == [("refused", "OSError: disk gone")]


def test_the_runs_own_dirpath_is_searched_when_the_resuming_trainer_saves_elsewhere(tmp_path):
    # review rlrw: the run saved each epoch in a sub-folder of its dirpath; a resume from
    # epoch 0's step 2 by a trainer that saves nowhere (or elsewhere) found epoch 0's step 8
    # only. Each entry now names the folders its run saved in
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 12, folder, name="{epoch}/{step}")
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=r"step=12\.ckpt \(12 charges, 10 carried over"):
        _fit(fresh, 3, ckpt_path=folder / "epoch=0" / "step=2.ckpt")
    assert len(fresh.history) == 13


def test_a_malformed_folder_list_in_the_entry_refuses_the_resume(tmp_path):
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 2, folder)
    saved = torch.load(folder / "step=2.ckpt", weights_only=False)
    saved["callbacks"]["privguard.LedgerCallback[step]"]["privguard"]["checkpoint"]["dirs"] = 5
    torch.save(saved, folder / "step=2.ckpt")
    fresh = Ledger(delta=1e-5)
    with pytest.raises(LedgerStateError, match="checkpoint field is malformed"):
        _fit(fresh, 3, ckpt_path=folder / "step=2.ckpt")


def test_the_folders_an_entry_names_are_absolute(tmp_path, monkeypatch):
    # a relative default_root_dir: a resume run from another working folder still finds them
    import os

    monkeypatch.chdir(tmp_path)
    _fit_logged(Ledger(delta=1e-5), 2, "root")
    saved = torch.load(tmp_path / "root" / "lightning_logs" / "version_0" / "checkpoints" /
                       "step=2.ckpt", weights_only=False)
    dirs = saved["callbacks"]["privguard.LedgerCallback[step]"]["privguard"]["checkpoint"]["dirs"]
    assert dirs and all(os.path.isabs(d) for d in dirs)


def test_a_folder_whose_name_holds_glob_characters_is_searched(tmp_path):
    # review rlrw: the folders were searched with a glob pattern built from their names;
    # "run[1]" matched "run1", not itself, and the run's later checkpoints went unseen
    folder = tmp_path / "run[1]" / "ckpts"
    _fit(Ledger(delta=1e-5), 6, folder)
    _resume_carries(Ledger(delta=1e-5), folder, r"step=6\.ckpt \(6 charges, 4 carried over")


def test_branches_alike_charge_for_charge_are_refused_not_taken_as_one(tmp_path):
    # Task fw: step=4.ckpt was moved aside while a resume from step=2 ran steps 3 and 4
    # again (again-step=4.ckpt, 4 charges: it could not see the first 4); moved back, the
    # two entries at step 4 hold journals alike charge for charge, so carry_later's prefix
    # check took them for one sequence (4 charges) while 6 steps ran. Each fit records the
    # charges it began with: a branch that began below another's writes is a fork, from
    # either checkpoint (the resumed one's branch counts too).
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 4, folder)
    shutil.move(str(folder / "step=4.ckpt"), str(tmp_path / "aside.ckpt"))
    _fit(Ledger(delta=1e-5), 4, folder, name="again-{step}", ckpt_path=folder / "step=2.ckpt")
    shutil.move(str(tmp_path / "aside.ckpt"), str(folder / "step=4.ckpt"))
    _resume_refused(folder, "fork")
    fresh = Ledger(delta=1e-5)
    with pytest.raises(LedgerStateError, match="fork"):
        _fit(fresh, 5, ckpt_path=folder / "again-step=4.ckpt")
    assert len(fresh.history) == 4


def test_a_weights_only_load_then_fit_carries_the_charges_of_the_run_that_saved_them(tmp_path):
    # Task fw: LightningModule.load_from_checkpoint, then fit without ckpt_path=, started a
    # fresh budget (documented): the ε left out the steps that trained the weights. Each
    # entry records the weights saved with it; a fit whose module holds them carries the
    # charges of the run that saved them (its later checkpoints' too), with a warning.
    folder = tmp_path / "ckpts"
    _fit(Ledger(delta=1e-5), 6, folder)
    model = TinyDP.load_from_checkpoint(folder / "step=2.ckpt")
    fresh = Ledger(delta=1e-5)
    cb = LedgerCallback(fresh)
    trainer = pl.Trainer(callbacks=[cb, ModelCheckpoint(
        dirpath=folder, filename="again-{step}", every_n_train_steps=2, save_top_k=-1)],
        accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, max_steps=1)
    with pytest.warns(UserWarning, match="load_from_checkpoint"):
        trainer.fit(model)
    assert len(fresh.history) == 6 + 1
    other = Ledger(delta=1e-5)  # a fresh module's weights match no entry: a fresh budget
    _fit(other, 1, folder, name="fresh-{step}")
    assert len(other.history) == 1
