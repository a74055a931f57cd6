"""Review rfw: adversarial review of task fw (Hugging Face / Lightning rewinds: lineage,
branches, weights-only starts)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from _lightning_quiet import QUIET  # noqa: E402
from _tiny_lightning import TinyDP  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from privguard import Ledger, LedgerStateError  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402

pytestmark = [QUIET, pytest.mark.filterwarnings(
    "ignore:.*callbacks used to create the checkpoint.*", "ignore:.*exists and is not empty.*",
    "ignore:.*You called `self.log.*", "ignore:.*Checkpoint directory.*")]


def _trainer(cb, checkpoints, steps):
    return pl.Trainer(callbacks=[cb, *checkpoints], accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=bool(checkpoints), limit_val_batches=0,
                      max_steps=steps)


def _every(folder, n, name="{step}"):
    return ModelCheckpoint(dirpath=folder, filename=name, every_n_train_steps=n, save_top_k=-1)


def test_a_weights_only_load_carries_the_runs_entries_in_its_other_dirpath(tmp_path):
    # The run saved into two ModelCheckpoints' dirpaths: d1 every 2 steps (2, 4), d2 every 5
    # (5). A resume (ckpt_path=d1/step=4.ckpt) looks in the folders the entry names and
    # carries step 5; a weights-only load of the same checkpoint then fit with d1 only
    # looked in d1 alone and carried 4 charges: step 5 ran (its weights are saved) and was
    # not charged.
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    _trainer(LedgerCallback(Ledger(delta=1e-5)), [_every(d1, 2), _every(d2, 5)], 5).fit(TinyDP())
    resumed = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match="later checkpoints"):
        _trainer(LedgerCallback(resumed), [], 5).fit(TinyDP(), ckpt_path=d1 / "step=4.ckpt")
    assert len(resumed.history) == 5 + 1
    fresh = Ledger(delta=1e-5)
    cb = LedgerCallback(fresh)
    with pytest.warns(UserWarning, match="load_from_checkpoint"):
        _trainer(cb, [_every(d1, 2, "again-{step}")], 1).fit(
            TinyDP.load_from_checkpoint(d1 / "step=4.ckpt"))
    assert len(fresh.history) == 5 + 1
    assert str(d2) in cb._dirs  # its entries name the run's folders: a resume looks there



def test_a_resume_takes_the_runs_entries_in_the_folders_its_later_entries_name(tmp_path):
    # Run A's first fit saved step=2, step=4 in d1 (its entries name d1). Its second fit,
    # resumed from step=4, saved step=6 in d1 and step=7 in d2 (its entries name d1 and d2).
    # A resume from step=2 looked in d1 and the folders the resumed entry names (d1): the
    # run's step=7 in d2 was missed (6 charges carried where 7 ran), though the run's entry
    # at step=6, found, names d2.
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    _trainer(LedgerCallback(Ledger(delta=1e-5)), [_every(d1, 2)], 4).fit(TinyDP())
    _trainer(LedgerCallback(Ledger(delta=1e-5)), [_every(d1, 2), _every(d2, 7)], 7).fit(
        TinyDP(), ckpt_path=d1 / "step=4.ckpt")
    assert (d2 / "step=7.ckpt").exists()
    fresh = Ledger(delta=1e-5)
    with pytest.warns(UserWarning, match=r"step=7\.ckpt \(7 charges"):
        _trainer(LedgerCallback(fresh), [], 3).fit(TinyDP(), ckpt_path=d1 / "step=2.ckpt")
    assert len(fresh.history) == 7 + 1


def _run_to_4(folder):
    _trainer(LedgerCallback(Ledger(delta=1e-5)), [_every(folder, 2)], 4).fit(TinyDP())


def _fresh_fit_refused(folder, ledger, match):
    """A fit without ckpt_path= of step=4's weights saving into ``folder`` is refused, and
    ``ledger`` is left as it was."""
    held = (len(ledger.history), ledger.state_dict())
    with pytest.raises(LedgerStateError, match=match):
        _trainer(LedgerCallback(ledger), [_every(folder, 2, "again-{step}")], 1).fit(
            TinyDP.load_from_checkpoint(folder / "step=4.ckpt"))
    assert (len(ledger.history), ledger.state_dict()) == held


@pytest.mark.parametrize("file_backed", [False, True])
def test_the_same_weights_in_two_runs_entries_refuse_a_fresh_fit(tmp_path, file_backed):
    # docs/reference.md "Framework callbacks" (task fw): the same weights in two runs' entries refuse the fit (a copy of a
    # checkpoint whose entry names another run), the ledger left as it was (a file-backed
    # one's journal too)
    folder = tmp_path / "ckpts"
    _run_to_4(folder)
    saved = torch.load(folder / "step=4.ckpt", weights_only=False)
    state = saved["callbacks"][LedgerCallback(Ledger(delta=1e-5)).state_key]["privguard"]
    state["checkpoint"]["run"] = "0" * 32
    torch.save(saved, folder / "copy.ckpt")
    ledger = Ledger(delta=1e-5, path=str(tmp_path / "l.db")) if file_backed \
        else Ledger(delta=1e-5)
    _fresh_fit_refused(folder, ledger, "2 runs")


def test_an_unreadable_checkpoint_in_the_folders_refuses_a_fresh_fit(tmp_path):
    # docs/reference.md "Framework callbacks" (task fw): a .ckpt in the folders a fit without ckpt_path= saves to that cannot
    # be read refuses the fit (it may hold the module's weights), the ledger left as it was
    folder = tmp_path / "ckpts"
    _run_to_4(folder)
    (folder / "partial.ckpt").write_bytes((folder / "step=2.ckpt").read_bytes()[:100])
    _fresh_fit_refused(folder, Ledger(delta=1e-5), r"partial\.ckpt: unreadable")
