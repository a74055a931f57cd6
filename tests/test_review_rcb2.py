"""Review rcb2 of task cb: the weights digest and the Hugging Face entry's write."""

from __future__ import annotations

import tracemalloc

import pytest

torch = pytest.importorskip("torch")

from privguard.integrations._weights import weights_digest  # noqa: E402


def test_the_digest_reads_each_parameter_in_place_not_as_a_bytes_copy():
    # .numpy().tobytes() made a second host copy of every parameter (of the largest, an
    # embedding say, at once); the array's buffer is hashed as it is. Same digest.
    import hashlib

    model = torch.nn.Linear(1024, 1024)  # a 4 MiB weight
    expected = hashlib.sha256()
    for _name, p in model.named_parameters():
        t = p.detach().contiguous()
        expected.update(f"{t.dtype}{tuple(t.shape)};".encode())
        expected.update(bytes(t.reshape(-1).view(torch.uint8).numpy()))
    tracemalloc.start()
    try:
        digest = weights_digest(model)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest == expected.hexdigest()
    assert peak < 1 << 20  # no 4 MiB bytes object


def test_a_meta_or_conjugate_parameter_does_not_raise_a_builtin_exception():
    # A meta parameter (accelerate's offload) raised NotImplementedError and a conjugate
    # view RuntimeError, out of on_save and on_train_begin. Meta holds no values here: not
    # tied (None, as sharded weights); a conjugate view is digested by its values.
    assert weights_digest(torch.nn.Linear(3, 2, device="meta")) is None
    values = torch.randn(2, 3, dtype=torch.cfloat)
    viewed, resolved = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    viewed.weight = torch.nn.Parameter(values.conj())
    resolved.bias, resolved.weight = viewed.bias, torch.nn.Parameter(values.conj().resolve_conj())
    assert weights_digest(viewed) == weights_digest(resolved) is not None


def test_an_interrupted_entry_write_leaves_the_previous_entry_whole(tmp_path, monkeypatch):
    # on_save wrote privguard_ledger.json in place: a save interrupted mid-write (a full
    # disk, a kill) left a truncated entry, and since task cb every train() at step 0 in
    # that output_dir was refused ("unreadable"), whatever weights it started from. The
    # entry is written aside and renamed over the old one.
    import json

    pytest.importorskip("transformers")
    from test_huggingface import make_trainer

    from privguard import Ledger
    from privguard.integrations import huggingface as hf

    trainer, cb = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=2, save_steps=2)
    trainer.train()
    path = tmp_path / "checkpoint-2" / hf.LEDGER_FILE
    before = path.read_text()

    def interrupted(obj, fh, **kw):
        fh.write(json.dumps(obj)[:20])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf.json, "dump", interrupted)
    with pytest.raises(OSError):
        cb.on_save(trainer.args, trainer.state, trainer.control, model=trainer.model)
    monkeypatch.undo()
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir() if "privguard" in p.name) == \
        [hf.LEDGER_FILE]
    fresh = Ledger(delta=1e-5)  # a fresh run in that output_dir, from other weights
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=1, save_strategy="no", seed=3)
    trainer.train()
    assert len(fresh.history) == 1


def test_a_weights_only_start_from_the_best_checkpoint_carries_the_whole_run(tmp_path):
    # With load_best_model_at_end the Trainer ends holding the weights of the checkpoint
    # that scored best after all the run's steps ran: those weights were picked with the
    # later steps' checkpoints (released to the evaluation), so they cost the whole run.
    # A train() at step 0 from them carried only their own checkpoint's charges (2 of 4).
    # It carries every entry of the run that saved them (a file-backed ledger keeps them
    # all on a rewind too).
    pytest.importorskip("transformers")
    from test_huggingface import Pairs, make_trainer

    from privguard import Ledger

    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), eval_dataset=Pairs(), max_steps=4,
                              save_steps=2, eval_strategy="steps", eval_steps=2,
                              load_best_model_at_end=True, metric_for_best_model="score",
                              label_names=["labels"])
    scores = iter([1.0, 0.0])  # step 2's checkpoint scores best
    trainer.compute_metrics = lambda _prediction: {"score": next(scores)}
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and best.endswith("checkpoint-2")  # not the last one
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=1, save_strategy="no")
    trainer.model.load_state_dict(weights)
    with pytest.warns(UserWarning, match="4 charges"):
        trainer.train()
    assert len(fresh.history) == 4 + 1


def test_a_resume_from_an_earlier_checkpoint_of_a_run_keeps_its_later_charges(tmp_path):
    # A rewind: the run went on to checkpoint-4; resuming from its checkpoint-2 brought a
    # fresh in-memory ledger to 2 charges, while steps 3 and 4 ran (their checkpoint and
    # logs are out) and a file-backed ledger keeps them. The run's later entries are taken.
    pytest.importorskip("transformers")
    from test_huggingface import BATCH, N, make_trainer

    from privguard import Ledger
    from privguard import mechanisms as M

    trainer, _ = make_trainer(tmp_path, Ledger(delta=1e-5), max_steps=4, save_steps=2)
    trainer.train()
    fresh = Ledger(delta=1e-5)
    trainer, _ = make_trainer(tmp_path, fresh, max_steps=3, save_strategy="no")
    with pytest.warns(UserWarning, match="went on to later checkpoints"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [r.mechanism for r in fresh.history] == [M.SubsampledGaussian(1.0, BATCH / N)] * 5
