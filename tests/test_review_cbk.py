"""Review cbk: the Lightning and Hugging Face callbacks run as a user runs them (resume from a
checkpoint, the logged ε)."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from _lightning_quiet import QUIET  # noqa: E402
from _tiny_lightning import TinyDP  # noqa: E402

from privguard import Ledger, LedgerStateError  # noqa: E402
from privguard.integrations.lightning import LedgerCallback  # noqa: E402

pytestmark = [QUIET, pytest.mark.filterwarnings("ignore:.*callbacks used to create the checkpoint.*",
                                                "ignore::UserWarning")]


def _trainer(callbacks, **kw):
    return pl.Trainer(callbacks=callbacks, accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, limit_val_batches=0, **kw)


def _checkpoint_at(tmp_path, callbacks, steps=4):
    trainer = _trainer(callbacks, max_steps=steps)
    trainer.fit(TinyDP())
    path = tmp_path / "at.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.mark.parametrize("written_by", ["another label", "no callback"])
def test_a_lightning_resume_from_a_checkpoint_without_the_callbacks_state_is_refused(
        tmp_path, written_by):
    # The checkpoint's model took 4 noisy steps; its callback state is under another state_key
    # (LedgerCallback(label=...) names it) or absent. Lightning then never calls
    # load_state_dict, and the fresh ledger charged only the steps after the resume: the
    # reported ε left out the 4 steps the resumed model holds (Hugging Face's callback refuses
    # the same resume with LedgerStateError).
    written = [LedgerCallback(Ledger(delta=1e-5), label="pretrain")] \
        if written_by == "another label" else []
    path = _checkpoint_at(tmp_path, written)
    fresh = Ledger(delta=1e-5)
    trainer = _trainer([LedgerCallback(fresh)], max_steps=8)
    with pytest.raises(LedgerStateError, match=re.escape("privguard.LedgerCallback[step]")):
        trainer.fit(TinyDP(), ckpt_path=path)
    assert len(fresh.history) == 0
    assert trainer.global_step == 4  # refused before any step after the resume


def test_a_lightning_resume_with_the_callbacks_state_and_fits_without_a_checkpoint_go_on(
        tmp_path):
    ledger = Ledger(delta=1e-5)
    path = _checkpoint_at(tmp_path, [LedgerCallback(ledger)])
    fresh = Ledger(delta=1e-5)
    callback = LedgerCallback(fresh)
    trainer = _trainer([callback], max_steps=6)
    trainer.fit(TinyDP(), ckpt_path=path)
    assert len(fresh.history) == 6  # 4 restored + 2
    trainer.fit_loop.epoch_loop.max_steps = 7  # the same trainer again: no checkpoint
    trainer.fit(TinyDP())
    assert len(fresh.history) == 7


class _LoggedEpsilon(pl.Callback):
    """Records, after every batch, the ε the LedgerCallback logged and the ledger's ε."""

    def __init__(self, ledger):
        self.ledger, self.seen = ledger, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        logged = trainer.callback_metrics["privacy/epsilon"]
        self.seen.append((logged.dtype, float(logged), self.ledger.epsilon()))


def test_the_epsilon_lightning_logs_is_never_below_the_ledgers():
    # Lightning stores a logged float as a float32 tensor, rounded to nearest: ε = 4.97676677
    # after 7 steps was logged as 4.97676659, below the ledger's ε. It is rounded up now.
    ledger = Ledger(delta=1e-5)
    probe = _LoggedEpsilon(ledger)
    _trainer([LedgerCallback(ledger), probe], max_steps=8).fit(TinyDP())
    assert len(probe.seen) == 8
    for dtype, logged, epsilon in probe.seen:
        assert dtype == torch.float32
        assert epsilon <= logged <= epsilon * (1 + 2e-7)


def test_prog_bar_must_be_a_flag():
    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as info:
        LedgerCallback(Ledger(delta=1e-5), prog_bar="no")  # was taken, and meant "on"
    assert info.value.argument == "prog_bar"
    assert LedgerCallback(Ledger(delta=1e-5), prog_bar=False).prog_bar is False


@pytest.mark.parametrize("flush_denormal", [False, True])
def test_the_float32_rounding_is_up_for_every_float(flush_denormal):
    # Review rcb: under torch.set_flush_denormal(True) a tiny ε (a subnormal float32) was
    # rounded to 0, below the ε; what a float32 tensor of the result holds is never below it
    import math
    import random

    from privguard.integrations._frameworks import float32_up as _float32_up

    rng = random.Random(0)
    values = [0.0, 1.0, 4.97676677, 0.1, 2.0 ** -149, 1e-45, 1e-40, 2.0 ** -126, 1e-50,
              5e-324, 3.4028234663852886e38, 3.5e38, 1e300, math.inf]
    values += [rng.uniform(1, 10) * 10.0 ** rng.uniform(-50, 39) for _ in range(2000)]
    if flush_denormal and not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        for value in values:
            up = _float32_up(value)
            held = float(torch.tensor(up, dtype=torch.float32))
            assert held == up >= value, value
    finally:
        torch.set_flush_denormal(False)


def test_a_lightning_resume_from_the_last_checkpoint_goes_on(tmp_path):
    # Review rcb: the refusal of a resume without the callback's state must not refuse
    # ModelCheckpoint(save_last=True) with fit(ckpt_path="last"), nor a user-managed
    # trainer.ckpt_path, which Lightning loads again at the next fit
    from lightning.pytorch.callbacks import ModelCheckpoint

    def trainer(ledger, steps):
        return pl.Trainer(callbacks=[LedgerCallback(ledger),
                                     ModelCheckpoint(dirpath=tmp_path, save_last=True)],
                          accelerator="cpu", logger=False, enable_progress_bar=False,
                          enable_model_summary=False, limit_val_batches=0, max_steps=steps)

    trainer(Ledger(delta=1e-5), 4).fit(TinyDP())
    fresh = Ledger(delta=1e-5)
    resumed = trainer(fresh, 6)
    resumed.fit(TinyDP(), ckpt_path="last")
    assert resumed.global_step == 6 and len(fresh.history) == 6  # 4 restored + 2
    again = Ledger(delta=1e-5)
    managed = trainer(again, 7)
    managed.ckpt_path = tmp_path / "last.ckpt"
    managed.fit(TinyDP())
    assert managed.global_step == 7 and len(again.history) == 7  # 6 restored + 1
