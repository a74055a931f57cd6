"""A Hugging Face ``transformers`` TrainerCallback that charges a privguard ledger.

Install: ``pip install 'privguard[huggingface]'``.

    from privguard.integrations.huggingface import LedgerTrainerCallback
    trainer = MyPoissonTrainer(..., optimizers=(dp_optimizer, None),
                               callbacks=[LedgerTrainerCallback(ledger)])

The model is an Opacus ``GradSampleModule`` and the optimizer an Opacus
``DPOptimizer``. The accounting assumes Poisson-sampled batches, which the
default Trainer does not produce (it shuffles into fixed-size batches):
override ``get_train_dataloader`` to return Opacus' ``DPDataLoader``. When
training begins the callback checks the training loader the Trainer passes
to callbacks and refuses a non-Poisson one with
:class:`~privguard.integrations.opacus.NonPoissonSamplingError`
(``check_poisson=False`` is the explicit opt-out); the sample rate is read
from the loader's Poisson sampler unless ``sample_rate`` is given. It then
attaches the ledger to the optimizer (unwrapping accelerate's wrapper;
"stop" mode): each real noisy step is charged before its update. After each
step it sets ``control.should_training_stop`` when the ledger would refuse
the next one; at each log it adds the running ε to the Trainer's logs (rounded up to a float32,
which trackers such as TensorBoard keep; the Trainer's console prints it with 4 digits,
rounded up too).

Logs. The Trainer calls the ``report_to`` integrations (TensorBoard, W&B, ...)
before the callbacks passed to it, so they receive each log without the ε
(``state.log_history``, the printed logs and later callbacks have it). To send
it to them, move the callback first:
``trainer.callback_handler.callbacks.insert(0, trainer.pop_callback(LedgerTrainerCallback))``.
The Trainer's own entries ``loss`` and ``grad_norm`` (the norm of the batch's
gradient before Opacus clips and noises it, logged even for a refused step)
are computed from the training data without noise: the ledger's ε does not
cover them, so do not publish those logs as part of the private release.

Random allocation: ``get_train_dataloader`` may instead return a loader
whose batch sampler is :class:`~privguard.integrations.RandomAllocationSampler`
(each example once per epoch); each epoch is then charged whole,
``RandomAllocation(σ, t)``, before its first step, as ``attach`` does (an
epoch stopped early stays charged; σ changed inside an epoch is refused;
``gradient_accumulation_steps`` > 1 is refused, and so is DDP unless the
sampler is ``DistributedRandomAllocationSampler``). Under DDP (torchrun, the
process group from ``TrainingArguments``, Opacus' ``DistributedDPOptimizer``)
each epoch is charged once for all ranks, the same decision on every rank
(tested with 2 gloo processes); return the loader from
``get_train_dataloader`` without ``self.accelerator.prepare``: accelerate's
sharding wrapper re-deals the batches and is refused by name.

Checkpoints: at each save it writes the ledger's checkpoint entry as
``privguard_ledger.json`` into the checkpoint folder (an in-memory ledger's
whole state, a file-backed ledger's path and journal fingerprint). When
training resumes (``state.global_step > 0``) it brings the ledger to the
entry of the checkpoint resumed from, looked up in
``args.resume_from_checkpoint`` and then ``<output_dir>/checkpoint-<step>``
(each ``train()`` puts a random run id into ``TrainerState.stateful_callbacks``,
saved in every checkpoint's ``trainer_state.json``, and into each entry with its
step; an entry is taken only if it names the run and step of the state the
Trainer loaded, so an entry of another run or step is passed over; a
malformed run id raises :class:`privguard.LedgerStateError`; an entry written
before run ids, naming none, is taken only for a state without one, from a
folder whose ``trainer_state.json`` is at the resumed step with the same log
history; an entry also records a digest of the model's weights saved with it, and is
taken only if the resumed model holds them, so a ``trainer_state.json`` copied whole
from another run is refused; entries are written next to each checkpoint, under
``hyperparameter_search`` in the trial's folder ``<output_dir>/<run>/checkpoint-<step>``,
by every process that saves it (``args.should_save``: each node's first with
``save_on_each_node``), and looked up there too):
a fresh in-memory ledger loads it, a file-backed ledger must be the same
file, and a ledger is never rewound. A resume without an entry raises
:class:`privguard.LedgerStateError` rather than start a fresh budget. A ``train()``
at step 0 whose model holds the weights an entry found there was saved with (loaded by
hand: a weights-only resume) carries that entry's charges, with a ``UserWarning``
(weights copied elsewhere without their checkpoint folder are not recognised); it
carries every entry found of the run that saved them (weights picked after later steps
ran, ``load_best_model_at_end``'s, cost those steps), and a resume from an earlier
checkpoint of a run takes that run's later entries too (review rcb2). Each ``train()`` is
a branch (its own run id; its entries name the runs it resumed from and the charges it
began with): a resume takes the entries of every branch connected to it by resumes, and
refuses branches that are not one sequence (task fw: :mod:`privguard.integrations._later`).
An unreadable entry in a folder looked in refuses a resume and a start at step 0: its run
and weights are unknown, so it may hold charges of these weights (task fw: fail closed).

The Trainer clears gradients with ``model.zero_grad()``, which does not clear
Opacus' per-sample state; the callback therefore calls the DPOptimizer's
``zero_grad`` after every optimizer step (``on_step_end``), as Opacus requires.

A step whose optimizer holds more backward passes than the Trainer's micro-batches of
that step (a ``training_step`` that backpropagates its inputs twice: one draw at weight
2) is refused before its charge and update, ``InvalidArgumentError`` naming
``optimizer`` (task adv7, :mod:`privguard.integrations._reused_batches`).
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import types
import warnings
from collections.abc import Callable
from typing import Any

from privguard import _validation as check
from privguard._accounting._results import upper
from privguard._errors import LedgerStateError
from privguard._ledger._ledger import Ledger
from privguard.integrations import _sampling
from privguard.integrations._aligned import guard_for
from privguard.integrations._allocation import allocation_sampler
from privguard.integrations._checkpoint import is_entry, ledger_entry, restore
from privguard.integrations._frameworks import (
    AttachedCallback,
    check_callback_arguments,
    delta_name,
    find_dp_optimizer,
    float32_up,
    require,
    running_statement,
)
from privguard.integrations._later import carry_later, lineage
from privguard.integrations._reused_batches import BatchSets
from privguard.integrations._weights import weights_digest
from privguard.integrations.opacus import AttachHandle, attach

_tf = require("transformers", "huggingface")

__all__ = ["LEDGER_FILE", "LedgerTrainerCallback"]

LEDGER_FILE = "privguard_ledger.json"
_RUN_KEY = "privguard"  # in TrainerState.stateful_callbacks, saved in every trainer_state.json


class _PrintedUp(float):
    """The ε in the Trainer's logs: a float whose ``format`` with ``.Ng`` or ``.Nf`` rounds
    up, never to nearest. Task cb: the Trainer's console printers (``ProgressCallback``,
    ``PrinterCallback``) show every float as ``f"{v:.4g}"``, which printed about every other
    ε below the ledger's. Everything else (``repr``, JSON, ``float(v)``) is the float's."""

    def __format__(self, spec: str) -> str:
        if re.fullmatch(r"\.\d+[fg]", spec):
            return upper(float(self), spec)
        return float(self).__format__(spec)

    def __reduce__(self) -> tuple:  # pickles (a tracker's queue) as the plain float
        return (float, (float(self),))


def _run_of(state: Any) -> str | None:
    """The run id the callback put into ``state`` (loaded from the checkpoint resumed from),
    or None for a checkpoint written before it did (or a transformers without the field).
    A malformed one (an edited trainer_state.json) raises LedgerStateError."""
    stored = getattr(state, "stateful_callbacks", None)
    if not isinstance(stored, dict) or _RUN_KEY not in stored:
        return None
    run = stored[_RUN_KEY]
    for key in ("attributes", "run"):
        run = run.get(key) if isinstance(run, dict) else None
    if not isinstance(run, str):
        raise LedgerStateError(f"the resumed trainer_state.json's stateful_callbacks"
                               f"[{_RUN_KEY!r}] is malformed: {stored[_RUN_KEY]!r}")
    return run


def _checkpoint_folders(output_dir: str, step: int | None) -> list[str]:
    """The folders in which the Trainer saves checkpoints (of ``step``, or every step):
    ``<output_dir>/checkpoint-<step>``, and under ``hyperparameter_search``
    ``<output_dir>/<trial run name>/checkpoint-<step>`` (the run name is the Trainer's
    ``hp_name(trial)`` or ``run-<id>``, which a callback does not see: one level is listed)."""
    name = "checkpoint-*" if step is None else f"checkpoint-{step}"
    return sorted(glob.glob(os.path.join(glob.escape(output_dir), name))) + \
        sorted(glob.glob(os.path.join(glob.escape(output_dir), "*", name)))


def _looked_in(args: Any, *resumed: str) -> list[str]:
    """The folders whose entries a resume or a weights-only start reads: the checkpoint
    folders ``resumed`` and ``TrainingArguments(resume_from_checkpoint=)``, the checkpoints
    beside them (review rfw: a resume from a checkpoint outside output_dir took none of its
    run's later checkpoints, saved beside it, while Lightning's looks in the resumed
    checkpoint's folder), and output_dir's (:func:`_checkpoint_folders`), each once."""
    folders = [folder for folder in (*resumed, getattr(args, "resume_from_checkpoint", None))
               if isinstance(folder, str) and folder]
    beside = [found for folder in folders
              for found in _checkpoint_folders(os.path.dirname(os.path.abspath(folder)), None)]
    return list(dict.fromkeys(folders + beside + _checkpoint_folders(args.output_dir, None)))


def _saved_by(folder: str, run: str) -> bool:
    """Whether ``folder``'s trainer_state.json names the run ``run`` (it was saved by it)."""
    try:
        with open(os.path.join(folder, "trainer_state.json")) as fh:
            stored = json.load(fh).get("stateful_callbacks")
        return _run_of(types.SimpleNamespace(stateful_callbacks=stored)) == run
    except (OSError, ValueError, AttributeError, LedgerStateError):
        return False  # not the folder this run just saved into


def _write_entry(path: str, entry: dict) -> None:
    """Write ``entry`` to ``path`` whole or not at all (review rcb2: written in place, an
    interrupted save, a full disk say, left a truncated entry, which refused the resume from
    that checkpoint and, since task cb, every train() at step 0 in that output_dir)."""
    partial = f"{path}.{secrets.token_hex(8)}.tmp"
    try:
        with open(partial, "w") as fh:
            json.dump(entry, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(partial, path)
    except BaseException:
        try:
            os.remove(partial)
        except OSError:
            pass
        raise


def _read_entry(path: str) -> Any:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise LedgerStateError(f"{path}: unreadable ({exc})") from exc


def _entries(folders: list[str]) -> list[tuple[str, Any, Any]]:
    """``(path, entry, its "checkpoint" field or None)`` for each folder that holds an
    entry, in order; an unreadable one raises LedgerStateError (:func:`_read_entry`)."""
    found = []
    for folder in folders:
        path = os.path.join(folder, LEDGER_FILE)
        if os.path.exists(path):
            saved = _read_entry(path)
            found.append((path, saved, saved.get("checkpoint") if is_entry(saved) else None))
    return found


def _lineage(entries: list[tuple[str, Any, Any]], runs: set[str]) -> list[tuple[str, Any]]:
    """``(path, entry)`` of the ``entries`` (:func:`_entries`) of the branches connected to
    ``runs`` by resumes (:func:`~privguard.integrations._later.lineage`: refuses a fork)."""
    return lineage([(path, saved) for path, saved, named in entries
                    if isinstance(named, dict) and isinstance(named.get("run"), str)], runs)


def _resumed_from(folder: str, state: Any) -> bool:
    """Whether ``folder`` holds the checkpoint training resumed from: its trainer_state.json
    is at the resumed step, with the same log history. A folder without one is not: the
    Trainer resumes at a step > 0 only from a folder with one, and writes one into every
    checkpoint (the entry alone in ``<output_dir>/checkpoint-<step>`` is one written under
    ``hyperparameter_search``, whose checkpoints go to a folder per trial).

    Review cbk: the Trainer resumes from ``train(resume_from_checkpoint=...)``, which the
    callback does not see. A stale ``TrainingArguments(resume_from_checkpoint=...)`` naming
    an earlier checkpoint brought the ledger to that checkpoint's charges, fewer than the
    resumed model's steps; ``<output_dir>/checkpoint-<step>`` written by another run at the
    same step (resuming from a copy elsewhere) brought it to that run's charges.
    """
    path = os.path.join(folder, "trainer_state.json")  # transformers' TRAINER_STATE_NAME
    if not os.path.exists(path):
        return False
    try:
        with open(path) as fh:
            written = json.load(fh)
        step, history = written.get("global_step"), written.get("log_history")
    except (OSError, ValueError, AttributeError) as exc:
        raise LedgerStateError(f"{path}: unreadable ({exc})") from exc
    # compared as JSON text: a NaN loss is equal to itself there
    return step == state.global_step and \
        json.dumps(history, sort_keys=True) == json.dumps(state.log_history, sort_keys=True)


class LedgerTrainerCallback(AttachedCallback, _tf.TrainerCallback):  # type: ignore[name-defined]
    """Charge every real DP-SGD step to ``ledger``; log ε; stop at exhaustion.

    Args:
        ledger: the privguard ledger.
        sample_rate: Poisson rate (or a callable giving the current one);
            default: the rate of the training loader's Poisson sampler, else
            of Opacus' accountant hook on the optimizer. A number outside
            (0, 1] is refused here, with :class:`InvalidArgumentError`.
        log_name: key of the running ε in the Trainer's logs; the δ it is
            stated at is logged beside it, under ``log_name`` with its last
            ``epsilon`` made ``delta`` (``privacy_delta``).
        label: label of each charge.
        check_poisson: refuse a training loader that does not sample by
            Poisson sampling (default True). ``False`` is the explicit
            opt-out: the reported ε then does not hold unless the batches are
            Poisson.
        aligned_micro_batches: with ``gradient_accumulation_steps`` k > 1,
            charge ``AccumulatedSubsampledGaussian(σ, q, k, aligned=True)``
            (docs/theory.md §14) instead of the default ``aligned=False``
            (§14.2): your assertion that no dropout or other per-draw
            randomness runs in the model or the data pipeline (see
            :func:`~privguard.integrations.opacus.attach`). The Trainer's
            model is checked when training begins: a dropout layer with a
            rate > 0 is refused in either mode (the Trainer trains in
            training mode), and again before every step's charge. Off by
            default.
        witnesses: check every step against its charge before charging it, as
            :func:`~privguard.integrations.opacus.attach` does with
            ``witnesses=True`` (noise, clipping, and sampling against the
            training loader; needs a ledger with an (ε, δ) target, refused
            when training begins otherwise, nothing charged). A mismatch
            raises :class:`privguard.PipelineMismatchError` out of
            ``trainer.train()`` with the step not applied, and every later
            step of the optimizer is refused until the next ``train()``,
            which attaches afresh (its witnesses start over). Off by default.

    Example:
        >>> from privguard import Ledger
        >>> LedgerTrainerCallback(Ledger(delta=1e-5)).log_name
        'privacy_epsilon'
    """

    witnesses = False  # (a callback pickled before the option: off)
    _run: str | None = None  # id of the running train(), in its checkpoints (review rcb)
    _from: tuple[str, ...] = ()  # the runs of the lineage this train() began from (task fw, rfw)
    _base = 0  # the ledger's charges when this train() began (task fw)
    _substeps = 0  # micro-batches of the current step before its last (task adv7)
    _stepped = 0  # the handle's charged steps at the end of the last Trainer step (radv7)
    _sets: BatchSets | None = None  # per-sample gradient sets against micro-batches (radv7)

    def __init__(self, ledger: Ledger, *, sample_rate: float | Callable[[], float] | None = None,
                 log_name: str = "privacy_epsilon", label: str = "step",
                 check_poisson: bool = True, aligned_micro_batches: bool = False,
                 witnesses: bool = False) -> None:
        check_callback_arguments(ledger, log_name, label, check_poisson, sample_rate)
        self.aligned_micro_batches = check.flag("aligned_micro_batches", aligned_micro_batches)
        self.witnesses = check.flag("witnesses", witnesses)
        self.ledger = ledger
        self.sample_rate = sample_rate
        self.log_name = log_name
        self.label = label
        self.check_poisson = check_poisson
        self.handle: AttachHandle | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                       train_dataloader: Any = None, model: Any = None, **kwargs: Any) -> None:
        self._detach()  # a previous train() that ended in an exception
        optimizer = find_dp_optimizer(optimizer)
        if self.aligned_micro_batches:  # the Trainer calls model.train() at every step
            guard_for(model, assume_training=True)
        if train_dataloader is not None and self.check_poisson and \
                allocation_sampler(train_dataloader) is None:  # attach charges it per epoch
            _sampling.check_poisson(train_dataloader, "train_dataloader")
        if state.global_step > 0:
            parents = self._resume(args, state, model)
        else:
            parents = self._carry_weights(args, model)
        self._run = secrets.token_hex(16)  # names this train()'s checkpoints (_resume)
        # task fw: the branches this one began from, and the charges it began with (lineage)
        self._from, self._base = tuple(parents), len(self.ledger.history)
        if isinstance(getattr(state, "stateful_callbacks", None), dict):
            state.stateful_callbacks[_RUN_KEY] = {"args": {}, "attributes": {"run": self._run}}
        accumulation = getattr(args, "gradient_accumulation_steps", 1)  # theory §14
        self.handle = attach(optimizer, self.ledger, sample_rate=self.sample_rate,
                             data_loader=train_dataloader, label=self.label,
                             on_exhausted="stop", check_poisson=self.check_poisson,
                             micro_batches=accumulation if isinstance(accumulation, int) else None,
                             aligned_micro_batches=self.aligned_micro_batches,
                             model=model if self.aligned_micro_batches else None,
                             witnesses=self.witnesses)
        # task adv7: the Trainer's micro-batches of the step (on_substep_end counts all but
        # the last); more backward passes than that (a training_step that backpropagates
        # one batch twice) is one draw at weight 2, refused before the step's charge
        # (review radv7: also per micro-batch, and a second real step within one Trainer
        # step, a training_step that calls optimizer.step() itself, has no batch since)
        self._substeps, self._stepped = 0, self.handle.steps_charged
        sets = self._sets = BatchSets(optimizer)
        self.handle.step_checks.append(lambda: sets.check(1, self._batches_since_step()))

    def _batches_since_step(self) -> int:
        """The micro-batches of this Trainer step (0 once a real step was charged in it)."""
        if self.handle is None or self.handle.steps_charged != self._stepped:
            return 0
        return self._substeps + 1

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._sets is not None:
            self._sets.start()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._substeps += 1
        if self._sets is not None:
            self._sets.end(1)  # review radv7: one draw, at most one set

    def _resume(self, args: Any, state: Any, model: Any) -> list[str]:
        """Bring the ledger to the entry saved with the checkpoint resumed from; return the
        runs of its lineage (:meth:`_later_of_run`; none for an entry written before run
        ids)."""
        folders = []
        if isinstance(getattr(args, "resume_from_checkpoint", None), str):
            folders.append(args.resume_from_checkpoint)
        folders += [folder for folder in _checkpoint_folders(args.output_dir, state.global_step)
                    if folder not in folders]
        run = _run_of(state)
        digest: list[str | None] = []  # computed once, when an entry records one
        other_weights = []
        for folder in folders:
            path = os.path.join(folder, LEDGER_FILE)
            if not os.path.exists(path) or (run is None and not _resumed_from(folder, state)):
                continue
            saved = _read_entry(path)
            # Review rcb: the checkpoint's trainer_state.json names the run that wrote it; the
            # entry must be the one that run wrote at the resumed step (another run's folder at
            # the same step has the same log history when nothing was logged before the save);
            # an entry that names a run is not taken for a state without one (the id removed)
            named = saved.get("checkpoint") if isinstance(saved, dict) else None
            if run is None:
                if named is not None:
                    continue
            elif not isinstance(named, dict) or \
                    (named.get("run"), named.get("step")) != (run, state.global_step):
                continue
            elif "weights" in named:
                # Task cb: a trainer_state.json copied whole from another run names that run,
                # whose entry at the step was taken for weights it did not train; the entry
                # records the weights saved with it, and the model must hold them
                if not digest:
                    digest.append(weights_digest(model))
                if digest[0] is not None and named["weights"] != digest[0]:  # None: sharded
                    other_weights.append(folder)
                    continue
            if is_entry(saved):
                restore(self.ledger, saved, where=path)
            else:  # a bare ledger state, written by privguard 0.1
                self.ledger.load_state_dict(saved)
            if run is None:
                return []
            return self._later_of_run(args, run, path, saved)
        why = "" if not other_weights else (
            f" ({other_weights} hold the entry the resumed trainer_state.json names, saved with "
            "other weights than the model holds: that trainer_state.json was copied from "
            "another run's checkpoint, or the model's parameters (their dtype, say) differ "
            "from the ones saved?)")
        raise LedgerStateError(
            f"training resumes at step {state.global_step} but no {LEDGER_FILE} written with "
            f"the checkpoint resumed from was found in {folders}{why}: the ledger would start a "
            "fresh budget. Resume from a checkpoint written with this callback (set "
            "TrainingArguments(resume_from_checkpoint=<folder>) when it is outside "
            "output_dir)")

    def _later_of_run(self, args: Any, run: str, resumed: str, saved: Any) -> list[str]:
        """Review rcb2: a resume from a checkpoint of run ``run`` while that run's later
        checkpoints are in output_dir (a rewind: the later steps ran, and their checkpoints
        and logs are out) brought a fresh in-memory ledger to the resumed step's charges
        only, while a file-backed one keeps them all. The entries of every branch connected
        to the run by resumes are taken (:func:`~privguard.integrations._later.lineage`,
        task fw: a resume from the same checkpoint twice lost the first resume's steps, whose
        train() had another run id; branches that did not carry each other are refused),
        with a warning. An in-memory ledger takes the one with the most charges, all of
        them one prefix chain (:func:`~privguard.integrations._later.carry_later`: a fork
        refuses, the ledger left at the resumed entry's charges); a file-backed one must hold
        each.

        Returns the runs of the lineage (``run`` and every branch connected to it), which
        this train()'s entries name as the ones it began from (review rfw: with its parent
        alone, a branch whose parent's entries were all removed, a clean-up of the middle
        checkpoints, was no longer connected to the runs before it, and a resume from one
        of their checkpoints lost its steps)."""
        every = _entries(_looked_in(args, os.path.dirname(resumed)))
        if resumed not in [path for path, _s, _n in every]:  # its branch is one of them
            every.append((resumed, saved, saved.get("checkpoint")))
        found = _lineage(every, {run})
        carry_later(self.ledger, found, resumed=resumed, stacklevel=5)
        return sorted({run} | {entry["checkpoint"]["run"] for _path, entry in found})

    def _carry_weights(self, args: Any, model: Any) -> list[str]:
        """A run at step 0 whose model holds the weights a checkpoint's entry was saved with
        (loaded by hand, a weights-only resume) carries that entry's charges: the ledger is
        brought to it as a resume would (:func:`restore`: a fresh ledger loads it, another
        file or other charges are refused), with a warning. Task cb: it started a fresh budget
        whose ε left out the steps that trained the weights. Entries are looked up where a
        resume looks (``args.resume_from_checkpoint`` and output_dir's checkpoints).

        Review rcb2: the charges carried are those of every entry of the run that saved the
        weights, its later checkpoints' included: weights picked after later steps ran
        (``load_best_model_at_end``, or a checkpoint chosen by hand among the run's) were
        picked with those steps' outputs, and cost them (a file-backed ledger keeps them on
        a rewind too). Only the matching checkpoint's charges were carried."""
        every = _entries(_looked_in(args))
        found = [(path, saved, named) for path, saved, named in every
                 if isinstance(named, dict) and isinstance(named.get("weights"), str)]
        if not found:
            return []
        digest = weights_digest(model)
        if digest is None:  # sharded: not recognised
            return []
        matching = [(path, saved) for path, saved, named in found
                    if named["weights"] == digest]
        if not matching:
            return []
        runs = {named["run"] for _p, _s, named in found
                if named["weights"] == digest and isinstance(named.get("run"), str)}
        same = _lineage(every, runs)
        same += [(path, saved) for path, saved in matching if (path, saved) not in same]
        start = len(self.ledger.history)
        said = (f"training starts at step 0 with the weights saved with {matching[0][0]} "
                "(weights trained for another ledger's budget: train them from an output_dir "
                "without that checkpoint only if their earlier steps are accounted there)")
        last = carry_later(self.ledger, same, resumed=matching[0][0], context=said)
        entries = dict(same)
        if last is not None:
            warnings.warn(
                "training starts at step 0 with the weights saved with "
                f"{', '.join(path for path, _s in matching)}: "
                f"the ledger now holds the entry {last}, that checkpoint's {entries[last]['charges']} "
                "charges (the steps of the run that saved these weights, up to its last "
                f"checkpoint; it held {start}) rather than a fresh budget. To resume, use "
                "trainer.train(resume_from_checkpoint=<that folder>)", stacklevel=2)
        # every run of the lineage, not only those that saved these weights (review rfw)
        return sorted(runs | {saved["checkpoint"]["run"] for _path, saved in same
                              if isinstance(saved.get("checkpoint"), dict)
                              and isinstance(saved["checkpoint"].get("run"), str)})

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._substeps = 0
        if self.handle is None:
            return
        self._stepped = self.handle.steps_charged
        self.handle.optimizer.zero_grad(set_to_none=True)
        if self.handle.should_stop:
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
               **kwargs: Any) -> None:
        stated = None if logs is None else running_statement(self.ledger)
        if stated is None or logs is None:
            return
        # trackers such as TensorBoard keep a float32 (review rcb); the δ it is stated at
        # beside it, rounded up too (review radv9)
        eps, delta = float32_up(stated[0]), float32_up(stated[1])
        logs[self.log_name] = _PrintedUp(eps)
        logs[delta_name(self.log_name)] = delta
        if state.log_history:
            state.log_history[-1][self.log_name] = eps
            state.log_history[-1][delta_name(self.log_name)] = delta

    def on_save(self, args: Any, state: Any, control: Any, model: Any = None,
                **kwargs: Any) -> None:
        # one writer per checkpoint folder: the process that saved it (args.should_save); with
        # save_on_each_node, each node's first process (task cb: only the world's first wrote
        # one, and a resume on another node was refused)
        if not getattr(args, "should_save", getattr(state, "is_world_process_zero", True)):
            return
        run = self._run if self._run is not None and _run_of(state) == self._run else None
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if run is not None:  # the folder this run just saved into (task cb: under
            # hyperparameter_search, <output_dir>/<trial>/checkpoint-<step>)
            folder = next((f for f in _checkpoint_folders(args.output_dir, state.global_step)
                           if _saved_by(f, run)), folder)
        os.makedirs(folder, exist_ok=True)
        entry = ledger_entry(self.ledger)
        if run is not None:
            entry["checkpoint"] = {"run": run, "step": state.global_step,
                                   "from": list(self._from), "base": self._base}
            weights = weights_digest(model)
            if weights is not None:  # None: sharded weights, not tied (as before task cb)
                entry["checkpoint"]["weights"] = weights
        _write_entry(os.path.join(folder, LEDGER_FILE), entry)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._detach()
