"""A PyTorch Lightning callback that charges a privguard ledger.

Install: ``pip install 'privguard[lightning]'``.

    from privguard.integrations.lightning import LedgerCallback
    trainer = Trainer(callbacks=[LedgerCallback(ledger)])

The LightningModule trains with an Opacus ``DPOptimizer`` (returned from
``configure_optimizers``, the only optimizer: another one beside it, which manual
optimization would step on unclipped, unnoised gradients, is refused at the start
with ``InvalidArgumentError`` naming ``optimizer``; task adv7) on Poisson-sampled batches (Opacus'
``DPDataLoader``). When training starts the callback checks the training
loader(s) Lightning will use — a loader that does not sample by Poisson
sampling raises :class:`~privguard.integrations.opacus.NonPoissonSamplingError`
before any step (``check_poisson=False`` is the explicit opt-out) — and
attaches the ledger to the optimizer
(:func:`privguard.integrations.opacus.attach`, in "stop" mode): each real
noisy step is charged before its update; steps Opacus does not account are
not charged. After every batch it logs the running ε with ``pl_module.log``
(rounded up to a float32, the type Lightning keeps it in)
and sets ``trainer.should_stop`` when the ledger would refuse the next step
(under DDP the same flag on every rank).

Several training loaders (Lightning's ``CombinedLoader``): attach sees none of
them, so the steps are charged at ``sample_rate`` (or Opacus' hook's rate), and
every loader's Poisson rate must be at most that q, at the start, after
each reload and at every step (a callable ``sample_rate``'s value then), and each
gets attach's records check. Every batch holds one draw
of each loader, possibly of the same records, so a step over b batches of L
loaders is charged as b·L Poisson draws (``AccumulatedSubsampledGaussian``,
docs/theory.md §14): an over-count where the loaders' records are disjoint.

Random allocation: a training loader whose batch sampler is
:class:`~privguard.integrations.RandomAllocationSampler` is charged as
``attach`` charges it, the whole epoch ``RandomAllocation(σ, t)`` before its
first step (the filter admits the epoch or none of it runs; an epoch stopped
early stays charged; σ changed inside an epoch is refused). It must be the
single training loader, with ``accumulate_grad_batches=1``; a loader
reloaded for an epoch (``reload_dataloaders_every_n_epochs``) is followed
to its new sampler. Under DDP a
plain ``RandomAllocationSampler`` is refused (each rank would draw its own
allocation); ``DistributedRandomAllocationSampler`` (one global allocation,
each rank its share, with Opacus' ``DistributedDPOptimizer`` from
``configure_optimizers``) is charged once per epoch for all ranks, the same
decision on every rank (tested under ``strategy="ddp"`` with 2 gloo
processes). It needs ``Trainer(use_distributed_sampler=False)``: Lightning's
default replaces the loader's sampler under a distributed strategy, and the
callback refuses that fit at ``setup`` with ``NonPoissonSamplingError``.

Checkpoints: the callback's state is the ledger's checkpoint entry (an
in-memory ledger's whole state, a file-backed ledger's path and journal
fingerprint). Resuming (``trainer.fit(..., ckpt_path=...)``) brings the
ledger to it: a fresh in-memory ledger loads it, a file-backed ledger must be
the same file, and a ledger is never rewound (one that already holds the
checkpoint's journal and more keeps everything; one that holds something
else raises :class:`privguard.LedgerStateError`). A resume from a checkpoint
that holds no state under this callback's ``state_key`` (written with another
``label``, or without the callback) raises :class:`privguard.LedgerStateError`
rather than start a fresh budget. A resume of an in-memory ledger from an earlier
checkpoint of a run takes the run's later entries in the checkpoint's folder, in every
``ModelCheckpoint``'s ``dirpath`` and in the logger's versions (review lrw, rlrw: those
steps ran; see
:meth:`LedgerCallback._later_of_run`), with a ``UserWarning``; each fit's entries name the
fit and the charges it began with, and fits that did not carry each other's charges are
refused as a fork (task fw). A weights-only load
(``LightningModule.load_from_checkpoint``, then ``fit`` without ``ckpt_path=``) carries
the charges of the run whose entry, in the folders the trainer saves to, was saved with the
module's weights (each entry records their digest; task fw:
:meth:`LedgerCallback._carry_weights`); weights from elsewhere are not recognised (resume
with ``ckpt_path=``, or charge the ledger that trained the weights). Pickling the callback (as
spawn-based strategies do) pickles the ledger, not the live attachment; a
copy of an in-memory ledger is a separate ledger, so prefer a file-backed
ledger when the trainer runs in other processes.
"""

from __future__ import annotations

import inspect
import os
import secrets
import warnings
import zipfile
from collections.abc import Callable
from typing import Any

from privguard import _validation as check
from privguard._accounting._results import exact
from privguard._errors import InvalidArgumentError, LedgerStateError, PrivguardError
from privguard._ledger._ledger import Ledger
from privguard.integrations import _describe, _samplers, _sampling
from privguard.integrations._aligned import guard_for
from privguard.integrations._allocation import allocation_sampler
from privguard.integrations._checkpoint import is_entry, ledger_entry, restore
from privguard.integrations._distributed import is_distributed
from privguard.integrations._frameworks import (
    AttachedCallback,
    check_callback_arguments,
    delta_name,
    find_dp_optimizer,
    float32_up,
    require,
    running_statement,
)
from privguard.integrations._later import carry_later, check_branches
from privguard.integrations._recorded import find_opacus_hook
from privguard.integrations._reused_batches import BatchSets
from privguard.integrations._weights import weights_digest
from privguard.integrations.opacus import AttachHandle, _check_records, attach

_pl = require("lightning.pytorch", "lightning")
from lightning.fabric.utilities.cloud_io import _load as _load_checkpoint  # noqa: E402
from lightning.fabric.utilities.cloud_io import get_filesystem  # noqa: E402

__all__ = ["LedgerCallback"]


def _train_loaders(trainer: Any) -> list:
    """The training loaders Lightning iterates (unwrapping its CombinedLoader)."""
    loader = getattr(trainer, "train_dataloader", None)
    loaders = getattr(loader, "iterables", loader)
    if loaders is None:
        return []
    if isinstance(loaders, dict):
        return list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return list(loaders)
    return [loaders]


def _check_rates(loaders: list, charged: float) -> None:
    """Refuse a Poisson training loader whose rate the charge at q = ``charged`` does not cover.

    One loader: its rate must be q up to float32 rounding (as attach checks it, which then
    charges the larger); several (attach sees none of them): none above q. Never one above
    the charged q (the charge grows with q, docs/theory.md §2b Lemma 1: a larger one stays
    sound).
    """
    for loader in loaders:
        q = _sampling.poisson_rate(loader)
        if q is not None and (q > charged or (len(loaders) == 1 and
                                              not _samplers.within_float32(q, charged))):
            raise InvalidArgumentError(
                "train_dataloader", q,
                f"is the rate a training loader samples at, but the steps are charged at "
                f"q = {exact(charged)} (sample_rate): the charge must be the probability each record "
                "is drawn; keep every loader's rate at most the charged one, and a single "
                "loader's rate across reloads")


def _sized(loader: Any) -> bool:
    """Whether ``len(loader)`` answers (Lightning then fetches no batch ahead)."""
    try:
        len(loader)
    except (TypeError, NotImplementedError, AttributeError):
        return False
    return True


def _charged_rate(sample_rate: Any, optimizer: Any) -> float | None:
    """The q attach will charge without a data loader (several training loaders): the given
    ``sample_rate`` (a callable's current value), else the rate of Opacus' accountant hook;
    None where attach finds none (it then refuses)."""
    if sample_rate is None:
        return find_opacus_hook(optimizer.step_hook)[1]
    return check.sample_rate("sample_rate", sample_rate() if callable(sample_rate)
                             else sample_rate)


def _check_sampler_injection(trainer: Any) -> None:
    """Refuse a distributed fit in which Lightning replaces the training loader's sampler.

    With ``use_distributed_sampler=True`` (Lightning's default) a distributed
    strategy puts its own ``DistributedSampler`` into every training loader
    whose sampler is not one already: a fixed share of a permutation per
    rank, which neither accounting covers. A batch sampler privguard accounts
    (Opacus' Poisson samplers, :class:`~privguard.integrations.RandomAllocationSampler`)
    is not a ``BatchSampler``, so Lightning cannot inject into it and raises a
    ``TypeError`` of its own; any other loader would be refused at
    ``on_train_start`` as not Poisson. Either way the fit cannot be charged,
    so it is refused here, before Lightning reads a loader, by name.
    """
    connector = getattr(trainer, "_accelerator_connector", None)
    if getattr(connector, "use_distributed_sampler", False) is True and \
            getattr(connector, "is_distributed", False) is True:
        raise _sampling.NonPoissonSamplingError(
            "use_distributed_sampler", True,
            f"makes Lightning's {type(trainer.strategy).__name__} replace the training "
            "loader's sampler with its DistributedSampler (each rank a fixed share of a "
            "permutation), which the accounting does not cover. Pass "
            "Trainer(use_distributed_sampler=False) and give the loader a distributed sampler "
            "privguard accounts: DistributedRandomAllocationSampler (one global random "
            "allocation, each rank its share) or Opacus' DPDataLoader.from_data_loader(loader, "
            "distributed=True) (Poisson)")


def _checkpoint_files(folders: list[tuple[str, bool]]) -> list[str]:
    """The ``*.ckpt`` files in ``folders`` (local or fsspec URLs; ``(folder, recursive)``: a
    ModelCheckpoint's ``dirpath`` with its sub-folders, since its ``filename`` may hold a
    ``/``, review rlrw), each once; a folder that does not exist has none, and one that cannot
    be listed raises LedgerStateError (its checkpoints may hold charges: review lrw)."""
    files: list[str] = []
    for folder, recursive in folders:
        try:
            fs = get_filesystem(folder)
            if not fs.isdir(folder):
                continue
            # found, not globbed: a folder's name may hold glob characters ("run[1]")
            listed = sorted(path for path in fs.find(folder, maxdepth=None if recursive else 1)
                            if str(path).endswith(".ckpt"))
        except Exception as exc:  # fsspec's backends raise their own kinds
            raise LedgerStateError(
                f"{folder}: cannot be listed ({type(exc).__name__}: {exc}); a resume looks "
                "for the run's later checkpoints there") from None
        remote = "://" in folder
        for path in listed:
            path = fs.unstrip_protocol(path) if remote else path
            if path not in files:
                files.append(path)
    return files


def _logger_folder(trainer: Any) -> str | None:
    """The folder of the first logger's versions (``<save_dir>/<name>``), where a
    ModelCheckpoint without a ``dirpath`` saves each fit's checkpoints
    (``<version>/checkpoints``, a new version for each fit): review rlrw, a resumed fit's
    checkpoints of the run were in a version that a later resume did not look in."""
    loggers = getattr(trainer, "loggers", None) or []
    if not loggers:
        return None
    try:
        save_dir, name = loggers[0].save_dir, loggers[0].name
    except Exception:  # a logger without these (they are optional): none
        return None
    save_dir = save_dir if save_dir is not None else getattr(trainer, "default_root_dir", None)
    if save_dir is None or not isinstance(name, str) or not name:
        return None
    return os.path.join(str(save_dir), name)


def _save_folders(trainer: Any) -> list[str]:
    """Where this fit saves checkpoints: every ModelCheckpoint's ``dirpath``, then the first
    logger's versions (:func:`_logger_folder`), as given (searched with sub-folders)."""
    dirpaths = [str(cb.dirpath) for cb in getattr(trainer, "checkpoint_callbacks", [])
                if getattr(cb, "dirpath", None) is not None]
    logged = _logger_folder(trainer)
    return dirpaths if logged is None else [*dirpaths, logged]


def _saved_in(trainer: Any, known: tuple[str, ...]) -> tuple[str, ...]:
    """``known`` and the folders this fit saves checkpoints in (every ModelCheckpoint's
    ``dirpath``, the logger's versions): an entry names them all, so that a resume from it
    looks where the run's checkpoints went even when its trainer saves elsewhere (review
    rlrw: ``filename="{epoch}/{step}"``'s later epochs were missed)."""
    dirs = list(known)
    for folder in _save_folders(trainer):  # local ones absolute: a resume may run elsewhere
        folder = folder if not folder or "://" in folder else os.path.abspath(folder)
        if folder and folder not in dirs:
            dirs.append(folder)
    return tuple(dirs)


def _fit_weights_only(trainer: Any) -> bool | None:
    """The ``weights_only`` this ``fit`` loaded its checkpoint with (review rlrw: the run's
    other checkpoints are loaded the same way), read from the innermost frame of a method of
    ``trainer`` that has a ``weights_only`` argument (Lightning keeps the value nowhere else:
    ``Trainer.fit``, ``_fit_impl`` and ``_run`` take it in Lightning 2.4 to 2.6; task fw: only
    a frame named ``_run`` was read, and a Lightning that renamed it fell back silently);
    None (torch's default) where none is found: then a checkpoint that only a full load
    reads refuses the resume as unreadable, naming ``fit(..., weights_only=False)``."""
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if "weights_only" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] \
                and frame.f_locals.get("self") is trainer:
            value = frame.f_locals.get("weights_only")
            return value if isinstance(value, bool) else None
        frame = frame.f_back
    return None


def _from_rank_zero(trainer: Any, find: Callable[[], Any], what: str) -> Any:
    """What ``find()`` returns on the global rank 0, on every rank (review rlrw: each rank
    read its own disk, and carried other charges than rank 0, or one refused while the
    others waited for it in a collective); its refusal is raised on every rank."""
    outcome: tuple[str, Any] | None = None
    failed: Exception | None = None
    if trainer.is_global_zero:
        try:
            outcome = ("found", find())
        except Exception as exc:  # sent to every rank before it is raised (no rank waits)
            failed, outcome = exc, ("refused", f"{type(exc).__name__}: {exc}"
                                    if not isinstance(exc, LedgerStateError) else str(exc))
    outcome = trainer.strategy.broadcast(outcome, src=0)
    if failed is not None:
        raise failed
    if not (isinstance(outcome, tuple) and len(outcome) == 2):
        raise LedgerStateError(f"{what}: rank 0's search of the checkpoint folders sent "
                               "nothing this rank can read")
    if outcome[0] == "refused":
        raise LedgerStateError(outcome[1])
    return outcome[1]


def _named_dirs(entry: dict[str, Any]) -> list[str]:
    """The folders an entry's ``"dirs"`` names (where its run saved checkpoints); a
    malformed one raises LedgerStateError (as :meth:`LedgerCallback.load_state_dict`)."""
    dirs = entry["checkpoint"].get("dirs", [])
    if not (isinstance(dirs, list) and all(isinstance(d, str) for d in dirs)):
        raise LedgerStateError(f"the entry's checkpoint field is malformed (dirs "
                               f"{check.short(dirs)})")
    return dirs


def _load_for_entry(path: str, weights_only: bool | None) -> Any:
    """Load the checkpoint ``path`` to read one small entry: a local zip checkpoint (what
    ``torch.save`` writes) is memory-mapped, so its tensors are not read (review rlrw: every
    sibling was read in full, GBs at a resume with large models); others as Lightning does."""
    import torch  # Lightning's own dependency

    if "://" not in path and zipfile.is_zipfile(path):
        return torch.load(path, map_location="cpu", mmap=True, weights_only=weights_only)
    return _load_checkpoint(path, map_location="cpu", weights_only=weights_only)


class LedgerCallback(AttachedCallback, _pl.Callback):  # type: ignore[name-defined]
    """Charge every real DP-SGD step to ``ledger``; log ε; stop at exhaustion.

    Args:
        ledger: the privguard ledger.
        sample_rate: Poisson rate (or a callable giving the current one);
            default: read from the training loader's Poisson sampler, else
            from Opacus' accountant hook on the optimizer. A number outside
            (0, 1] is refused here, with :class:`InvalidArgumentError`.
        log_name: the metric name for the running ε (logged when the ledger
            has a δ); the δ it is stated at is logged beside it, under
            ``log_name`` with its last ``epsilon`` made ``delta`` (``privacy/delta``).
        label: label of each charge.
        prog_bar: show ε in the progress bar.
        check_poisson: refuse training loaders that do not sample by Poisson
            sampling (default True). ``False`` is the explicit opt-out: the
            reported ε then does not hold unless the batches are Poisson.
        aligned_micro_batches: with ``accumulate_grad_batches`` k > 1,
            charge ``AccumulatedSubsampledGaussian(σ, q, k, aligned=True)``
            (docs/theory.md §14) instead of the default ``aligned=False``
            (§14.2): your assertion that no dropout or other per-draw
            randomness runs in the model or the data pipeline (see
            :func:`~privguard.integrations.opacus.attach`). The
            LightningModule is checked when training starts: a dropout
            layer with a rate > 0 is refused in either mode (Lightning
            trains in training mode), and again before every step's charge.
            Off by default.
        witnesses: check every step against its charge before charging it, as
            :func:`~privguard.integrations.opacus.attach` does with
            ``witnesses=True`` (needs a ledger with an (ε, δ) target). A
            training loader reloaded (``reload_dataloaders_every_n_epochs``)
            is followed by the sampling witness (its dataset size, sampler and
            micro-batch sizes; each test's levels go on where they were), or
            refused where it cannot be (under DDP, several loaders, a dataset
            of unknown size). Off by default.

    Example:
        >>> from privguard import Ledger
        >>> cb = LedgerCallback(Ledger(delta=1e-5))
        >>> cb.state_key
        'privguard.LedgerCallback[step]'
    """

    witnesses = False  # (a callback pickled before the option: off)
    _restored = False  # whether this fit's checkpoint brought its state (load_state_dict)
    _run: str | None = None  # the run id in this fit's entries (review lrw), None before a fit
    _dirs: tuple[str, ...] = ()  # where the run's fits saved checkpoints (review rlrw)
    _branch: str | None = None  # this fit's id, in its entries (task fw: check_branches)
    _base = 0  # the ledger's charges when this fit began (task fw)
    _resumed: Any = None  # the entry this fit's checkpoint brought (load_state_dict)
    _module: Any = None  # the module being fitted: its weights are tied to each entry
    _sets: BatchSets | None = None  # per-sample gradient sets against batches (adv7, radv7)

    def __init__(self, ledger: Ledger, *, sample_rate: float | Callable[[], float] | None = None,
                 log_name: str = "privacy/epsilon", label: str = "step",
                 prog_bar: bool = True, check_poisson: bool = True,
                 aligned_micro_batches: bool = False, witnesses: bool = False) -> None:
        check_callback_arguments(ledger, log_name, label, check_poisson, sample_rate)
        self.aligned_micro_batches = check.flag("aligned_micro_batches", aligned_micro_batches)
        self.witnesses = check.flag("witnesses", witnesses)
        self.ledger = ledger
        self.sample_rate = sample_rate
        self.log_name = log_name
        self.label = label
        self.prog_bar = check.flag("prog_bar", prog_bar)  # review cbk: "no" was taken as on
        self.check_poisson = check_poisson
        self.handle: AttachHandle | None = None
        self._steps_seen, self._batches = -1, 0  # batches since the last real step
        self._declared = 1  # the handle's declared micro-batches at attach
        self._loaders: list = []  # the training loaders the handle charges for

    @property
    def state_key(self) -> str:
        return f"privguard.LedgerCallback[{self.label}]"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":  # Lightning restores a checkpoint's states after setup
            self._restored, self._resumed = False, None
        if stage == "fit" and self.check_poisson:
            _check_sampler_injection(trainer)

    def _check_resumed(self, trainer: Any) -> None:
        """Refuse a fit resumed from a checkpoint that holds no state of this callback.

        Review cbk: Lightning calls ``load_state_dict`` only with a state saved under this
        callback's ``state_key`` (its label). A checkpoint written with another label, or
        without the callback, left the ledger as it was: a fresh ledger charged only the
        steps after the resume, and its ε left out the ones the resumed model holds.
        """
        if self._restored or getattr(trainer, "ckpt_path", None) is None or \
                not getattr(trainer, "global_step", 0):
            return
        raise LedgerStateError(
            f"training resumes at step {trainer.global_step} from {trainer.ckpt_path}, which "
            f"holds no {self.state_key!r} state: the ledger would not hold the steps the "
            "resumed model took. Resume with a LedgerCallback of the label that wrote the "
            "checkpoint. (Loading the weights, LightningModule.load_from_checkpoint, and "
            "fitting without ckpt_path= carries the charges of the steps that trained them "
            "only where their checkpoint is in the folders this trainer saves to.)")

    def _later_of_run(self, trainer: Any) -> None:
        """Review lrw: a resume (``ckpt_path=``) from a checkpoint of a run while that run's
        later checkpoints are saved (a rewind: the later steps ran) brought a fresh in-memory
        ledger to the earlier checkpoint's charges only; a file-backed one keeps them all.
        The run's entries in the resumed checkpoint's folder, in every ModelCheckpoint's
        ``dirpath``, the first logger's ``<save_dir>/<name>`` and the folders the resumed
        entry names (these with their sub-folders: review rlrw) are found (``*.ckpt``, loaded memory-mapped with the fit's
        ``weights_only``), and the ledger takes the one with the most charges
        (:func:`~privguard.integrations._later.carry_later`: they must be one prefix chain).
        A checkpoint that cannot be read there refuses the resume (LedgerStateError).

        Review rlrw: only the global rank 0 reads the folders, and broadcasts what it found
        (or its refusal) to every rank: each rank read its own disk, and ranks whose node
        lacks a later checkpoint carried fewer charges than rank 0 (or one rank refused the
        resume while the others went on to wait for it in a collective)."""
        resumed = str(trainer.ckpt_path)
        found = _from_rank_zero(trainer, lambda: self._find_later(trainer, resumed),
                                f"training resumes from {resumed}")
        # task fw: branches alike charge for charge, each of which ran, pass carry_later's
        # prefix check; the resumed entry's branch is one of them
        check_branches([*found, (resumed, self._resumed)] if is_entry(self._resumed)
                       else found)
        carry_later(self.ledger, found, resumed=resumed, stacklevel=5)
        # review rfw: this fit's entries name where the run's branches saved, so that a
        # resume from one of them looks there too
        self._dirs = tuple(dict.fromkeys(
            [*self._dirs, *(folder for _p, entry in found for folder in _named_dirs(entry))]))

    def _carry_weights(self, trainer: Any, pl_module: Any) -> None:
        """Task fw: a fit without ``ckpt_path=`` whose module holds the weights an entry was
        saved with (``LightningModule.load_from_checkpoint``: a weights-only resume) started
        a fresh budget whose ε left out the steps that trained them. The entries in the
        folders this trainer saves to (every ModelCheckpoint's ``dirpath``, the first
        logger's versions, with their sub-folders) record the weights saved with them; the
        ledger is brought to the run that saved these weights as a resume would (every entry
        of that run found there, one sequence of branches:
        :func:`~privguard.integrations._later.carry_later`), with a ``UserWarning``, and
        this fit goes on as a branch of that run. Weights loaded from a checkpoint outside
        those folders are not recognised (as Hugging Face's)."""
        if pl_module is None:  # no module (a stand-in trainer): no weights to tie
            return
        # rank 0's module and disk decide for every rank (review rlrw's rule)
        found, matching, dirs = _from_rank_zero(
            trainer, lambda: self._find_weights(trainer, weights_digest(pl_module)),
            "training starts with no ckpt_path=")
        if not matching:
            return
        check_branches(found)
        start = len(self.ledger.history)
        carry_later(self.ledger, found, resumed=matching[0], context=(
            f"training starts with the weights saved with {matching[0]} and no ckpt_path= "
            "(to train such weights under another ledger's budget, save to folders without "
            "that checkpoint only if their earlier steps are accounted there)"))
        self._run = found[0][1]["checkpoint"]["run"]  # one run (_find_weights)
        self._dirs = tuple(dirs)  # where that run saved: a later resume looks there too
        if len(self.ledger.history) != start:
            warnings.warn(
                f"training starts with the weights saved with {', '.join(matching)} "
                "(LightningModule.load_from_checkpoint, fit without ckpt_path=): the ledger "
                f"now holds {len(self.ledger.history)} charges (it held {start}), the steps "
                "of the run that saved these weights, rather than a fresh budget. To resume, "
                "use trainer.fit(..., ckpt_path=<that checkpoint>)", UserWarning, stacklevel=4)

    def _find_weights(self, trainer: Any, digest: str | None,
                      ) -> tuple[list[tuple[str, dict[str, Any]]], list[str], list[str]]:
        """``(path, entry)`` of every entry of the run whose entry, in the folders this
        trainer saves to, was saved with the weights ``digest`` (None: sharded, not tied),
        the paths of those saved with them, and the folders that run's entries name (on
        the global rank 0); entries of several runs saved with them refuse
        (LedgerStateError).

        Review rfw: the run's entries were looked for in this trainer's folders only, while
        a resume (``ckpt_path=``) also looks in the folders its entry names (``"dirs"``): a
        run that saved into two ModelCheckpoints' dirpaths (or another logger version) had
        its later entries there missed, and its steps there were not carried."""
        if digest is None:
            return [], [], []
        weights_only = _fit_weights_only(trainer)
        named: list[tuple[str, dict[str, Any]]] = []
        looked: list[str] = []
        read: set[str] = set()
        todo = list(_save_folders(trainer))
        runs: set[str] = set()
        while todo:  # the folders the run's entries name, until none is new
            looked += todo
            for path in _checkpoint_files([(folder, True) for folder in todo]):
                if path in read:
                    continue
                read.add(path)
                if "://" not in path and os.path.islink(path) and not os.path.exists(path):
                    continue  # a dangling link holds nothing
                entry = self._entry_in(path, weights_only)
                field = entry.get("checkpoint") if is_entry(entry) else None
                if isinstance(field, dict) and isinstance(field.get("run"), str):
                    named.append((path, entry))
            runs = {entry["checkpoint"]["run"] for _p, entry in named
                    if entry["checkpoint"].get("weights") == digest}
            if len(runs) > 1:
                raise LedgerStateError(
                    f"training starts with weights saved by {len(runs)} runs' checkpoints in "
                    f"{[p for p, e in named if e['checkpoint'].get('weights') == digest]}: "
                    "copies of one checkpoint into another run; resume with "
                    "trainer.fit(..., ckpt_path=<the checkpoint>)")
            dirs = [folder for _p, entry in named if entry["checkpoint"]["run"] in runs
                    for folder in _named_dirs(entry)]
            todo = [folder for folder in dict.fromkeys(dirs) if folder not in looked]
        ours = [(path, entry) for path, entry in named if entry["checkpoint"]["run"] in runs]
        return (ours,
                [path for path, entry in named if entry["checkpoint"].get("weights") == digest],
                list(dict.fromkeys(folder for _p, entry in ours for folder in _named_dirs(entry))))

    def _find_later(self, trainer: Any, resumed: str) -> list[tuple[str, dict[str, Any]]]:
        """The ``(path, entry)`` of the run's entries in the folders :meth:`_later_of_run`
        names, and in the folders those entries name, until none is new (on the global rank
        0). Review rfw: the folders the resumed entry names only: a first resume from a
        checkpoint that saved into another folder had its entries there missed by a second
        resume from the same checkpoint, and its steps were not carried."""
        folders = [(folder, True) for folder in _save_folders(trainer)]
        if not resumed.startswith("http"):  # a URL's folder cannot be listed
            folders.insert(0, (os.path.dirname(resumed) or ".", False))
        folders += [(folder, True) for folder in self._dirs]  # the run's, as its entry says
        weights_only = _fit_weights_only(trainer)
        found: list[tuple[str, dict[str, Any]]] = []
        looked: list[tuple[str, bool]] = []
        read: set[str] = set()
        while folders:  # review rfw: and the folders the run's entries found name
            looked += folders
            for path in _checkpoint_files(folders):
                if path in read:
                    continue
                read.add(path)
                if "://" not in path and os.path.realpath(path) == os.path.realpath(resumed):
                    continue  # the ledger holds its entry (Lightning loaded it as asked)
                if "://" not in path and os.path.islink(path) and not os.path.exists(path):
                    continue  # a dangling link (save_last="link" to a removed file)
                entry = self._entry_in(path, weights_only)
                named = entry.get("checkpoint") if is_entry(entry) else None
                if isinstance(named, dict) and named.get("run") == self._run:
                    found.append((path, entry))
            named_dirs = [(folder, True) for _p, entry in found for folder in _named_dirs(entry)]
            folders = [folder for folder in dict.fromkeys(named_dirs) if folder not in looked]
        return found

    def _entry_in(self, path: str, weights_only: bool | None) -> Any:
        """This callback's entry in the Lightning checkpoint ``path`` (None where it holds
        none), loaded with the fit's ``weights_only``; an unreadable checkpoint raises
        LedgerStateError (review rcb2's rule)."""
        try:
            saved = _load_for_entry(path, weights_only)
        except Exception as exc:  # torch.load raises many kinds; any of them: unreadable
            how = ("torch.load's default weights_only" if weights_only is None
                   else f"weights_only={weights_only}, as this fit")
            raise LedgerStateError(
                f"{path}: unreadable ({type(exc).__name__}: {exc}); a resume reads every "
                f"checkpoint in the checkpoint folders ({how}) for the run's later entries, "
                "and refuses rather than miss charges. If the file is a checkpoint you trust "
                "that holds objects a weights-only load refuses, resume with "
                "trainer.fit(..., weights_only=False) (privguard then loads the folders' "
                "checkpoints the same way) or allow those objects with "
                "torch.serialization.add_safe_globals([...]) before fit; a file that is no "
                "checkpoint of this run can be moved out of those folders") from None
        states = saved.get("callbacks") if isinstance(saved, dict) else None
        state = states.get(self.state_key) if isinstance(states, dict) else None
        return state.get("privguard") if isinstance(state, dict) else None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._detach()  # a previous fit that ended in an exception
        self._check_resumed(trainer)
        if self._restored and self._run is not None and self.ledger.path is None and \
                getattr(trainer, "ckpt_path", None) is not None:
            self._later_of_run(trainer)
        if not self._restored or self._run is None:
            self._run = secrets.token_hex(16)  # a new run: its checkpoints' entries name it
            self._dirs = ()
        if not self._restored:
            self._carry_weights(trainer, pl_module)  # task fw: a weights-only resume
        # task fw: this fit's branch of the run, and the charges it began with (check_branches)
        self._branch, self._base = secrets.token_hex(16), len(self.ledger.history)
        self._dirs = _saved_in(trainer, self._dirs)
        self._module = pl_module  # its weights' digest goes into each entry (task fw)
        optimizer = find_dp_optimizer(trainer.optimizers)
        loaders = _train_loaders(trainer)
        allocated = [loader for loader in loaders if allocation_sampler(loader) is not None]
        if allocated and len(loaders) > 1:  # attach charges epochs of one loader it can see
            raise InvalidArgumentError(
                "train_dataloader", f"{len(loaders)} loaders",
                "include a RandomAllocationSampler loader: its epochs are charged only when it "
                "is the single training loader; train on it alone")
        if self.check_poisson and not allocated:  # attach charges random allocation per epoch
            for loader in loaders:
                _sampling.check_poisson(loader, "train_dataloader")
        if len(loaders) > 1:
            # Review lr: attach gets none of several loaders, so their rates and records were
            # never checked at the start (a reload checked their rates): a loader at a q above
            # the charged one ran charged at the lower q, and under DDP a non-distributed
            # Poisson sampler (every rank drawing from all records) passed
            charged = _charged_rate(self.sample_rate, optimizer)
            if charged is not None:
                _check_rates(loaders, charged)
            if self.check_poisson:
                for loader in loaders:
                    _check_records(loader, optimizer, self.ledger)
        accumulation = getattr(trainer, "accumulate_grad_batches", 1)  # theory §14
        if self.aligned_micro_batches:  # Lightning calls pl_module.train() itself
            guard_for(pl_module, assume_training=True)
        single, rate = loaders[0] if len(loaders) == 1 else None, self.sample_rate
        if single is not None and not _sampling.is_loader(single):
            # review rnw: attach refuses a data_loader with no batch_sampler, sampler or
            # dataset; Lightning trains on any iterable, which gets here only opted out
            # (check_poisson=False; else refused above): charged at its nominal rate as before,
            # its batches counted by on_train_batch_start, as several loaders' are
            if rate is None:
                rate = _sampling.nominal_rate("train_dataloader", single)
            single = None
        self.handle = attach(optimizer, self.ledger, sample_rate=rate,
                             data_loader=single,
                             label=self.label, on_exhausted="stop",
                             # checked above, or opted out; attach checks one loader's q
                             # against its records (DDP, Opacus #813) besides
                             check_poisson=self.check_poisson and single is not None,
                             micro_batches=accumulation if isinstance(accumulation, int) else None,
                             aligned_micro_batches=self.aligned_micro_batches,
                             model=pl_module if self.aligned_micro_batches else None,
                             witnesses=self.witnesses)
        if self.handle.pairing is not None:  # (adv6) batches Lightning's fetcher draws ahead:
            # one, only where it cannot take the loader's len() (_PrefetchDataFetcher.__iter__
            # in lightning/pytorch/loops/fetchers.py); a sized loader hands one per step, and
            # review radv6: with the allowance a step pairing its batch with one it drew from
            # the loader itself passed (that batch held as drawn ahead), refused a step later
            self.handle.pairing.ahead = 0 if _sized(single) else 1
        self._steps_seen, self._batches = self.handle.steps_charged, 0
        self._declared = self.handle.declared_micro_batches  # accumulate_grad_batches
        # task adv7: a batch backpropagated twice (two manual_backward) is one draw at
        # weight 2, not two draws; refused before the step's charge
        # (review radv7: also per batch, so a batch left untrained does not pay for it)
        sets = self._sets = BatchSets(optimizer)
        self.handle.step_checks.append(
            lambda: sets.check(self._draws(), self._batches_since_step()))
        self._loaders = loaders
        self._watch(self.handle)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        # Review sa: Lightning makes the first epoch's loader iterator before on_train_start
        # (attach), so the micro-batch counter's class swap on the loader never sees that
        # epoch's batches (it counted 0): two batches accumulated into one noise draw through
        # signal_skip_step (the optimizer reports 1) were charged as one. Every batch Lightning
        # hands to training_step is counted here too; the step takes the larger count.
        # Review sc: with no loader counter (several training loaders: attach got no
        # data_loader) this count is the only one that sees signal_skip_step accumulation;
        # it raises the handle's declared k for the step (never below accumulate_grad_batches).
        handle = self.handle
        if handle is None:
            return
        if handle.steps_charged != self._steps_seen:  # a real step ran since the last batch
            self._steps_seen, self._batches = handle.steps_charged, 0
        # Review lr: a batch of several training loaders (Lightning's CombinedLoader) holds one
        # draw of each, from records they may share: len(loaders) Poisson draws, not one (on
        # main two loaders over one dataset were charged SubsampledGaussian(σ, q) a step; an
        # over-count where their records are disjoint)
        self._batches += self._draws()
        if self._sets is not None:
            self._sets.start()
        if handle.counter is not None:
            handle.counter.count = max(handle.counter.count, self._batches)
        else:
            handle.declared_micro_batches = max(self._declared, self._batches)

    def _draws(self) -> int:
        """The Poisson draws in one batch Lightning hands over: one per training loader."""
        return max(1, len(self._loaders))

    def _batches_since_step(self) -> int:
        """The Poisson draws Lightning delivered since the last real step (the count of
        :meth:`on_train_batch_start`, which restarts at the first batch after a step)."""
        handle = self.handle
        if handle is None or handle.steps_charged != self._steps_seen:
            return 0  # a second real step in one batch: no batch delivered since
        return self._batches

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # Review ra: with reload_dataloaders_every_n_epochs Lightning builds a new loader (a
        # new RandomAllocationSampler) for the epoch; the charges follow it, else the epoch's
        # steps were refused as more than t steps of the first loader's last epoch.
        handle = self.handle
        epochs = None if handle is None else handle._epochs
        if handle is not None and epochs is None:
            self._follow_reload(trainer, handle)
        if handle is None or epochs is None:
            return
        loaders = _train_loaders(trainer)
        sampler = allocation_sampler(loaders[0]) if len(loaders) == 1 else None
        if sampler is None:
            raise InvalidArgumentError(
                "train_dataloader", f"{len(loaders)} loader(s)",
                "were reloaded without the single RandomAllocationSampler loader the ledger "
                "was attached with: its epochs are charged only when it is the single training "
                "loader")
        if sampler is not epochs.sampler:
            # review lr: the witnesses' and the counter's watch moves first (it may refuse)
            self._follow_loader(handle, loaders)
        epochs.rebind(sampler, self.ledger,  # attach's checks (review sc)
                      distributed=is_distributed(handle.optimizer))
        self._loaders = loaders

    def _follow_reload(self, trainer: Any, handle: AttachHandle) -> None:
        """Poisson loaders reloaded (``reload_dataloaders_every_n_epochs``): check them as
        :meth:`on_train_start` did; the charge's q follows the single loader's rate where it
        was read from the loader, and is refused where it no longer matches it."""
        # Review sc: the charge read q from the loader seen at attach; a loader reloaded at
        # a higher rate (a batch-size curriculum) was charged at the old q, and a reloaded
        # loader was never checked for Poisson sampling.
        loaders = _train_loaders(trainer)
        if len(loaders) == len(self._loaders) and \
                all(a is b for a, b in zip(loaders, self._loaders, strict=True)):
            return
        if any(allocation_sampler(loader) is not None for loader in loaders):
            raise InvalidArgumentError(
                "train_dataloader", f"{len(loaders)} loader(s)",
                "were reloaded with a RandomAllocationSampler loader in a fit attached to "
                "Poisson loaders: its epochs would be charged as Poisson steps; use it from the "
                "first epoch on")
        if self.check_poisson:
            for loader in loaders:
                _sampling.check_poisson(loader, "train_dataloader")
            # Review lr: attach's records check on the loader it was given (issue 27: a
            # non-distributed Poisson sampler under DDP is refused, Opacus #813 warns), before
            # any step on the reloaded loader is charged or released; on_train_start gives
            # several loaders the same
            for loader in loaders:
                _check_records(loader, handle.optimizer, self.ledger)
        rates = [_sampling.poisson_rate(loader) for loader in loaders]
        rate: float | None = None
        if self.sample_rate is None and len(loaders) == 1:  # q was read from the loader
            # check_poisson=False on a non-Poisson loader: its nominal rate, as attach
            rate = float(rates[0]) if rates[0] is not None \
                else _sampling.nominal_rate("train_dataloader", loaders[0])
        else:
            _check_rates(loaders, float(handle._rate()))
        self._follow_loader(handle, loaders)  # the last check (it may refuse), then the move
        if rate is not None:
            followed = rate
            handle._rate = lambda: followed
            self._watch(handle)
        self._loaders = loaders

    def _watch(self, handle: AttachHandle) -> None:
        """Check the charged q against the training loaders at every step, as attach checks a
        single loader's (review lo2: with several loaders attach gets none of them, and a
        callable ``sample_rate`` that fell below their rate after the start, or a loader whose
        rate was raised, was charged the smaller q). Raised in the step's charge, before its
        update (:meth:`AttachHandle._hook`)."""
        charged = handle._rate

        def checked() -> float:
            q = float(charged())
            _check_rates(self._loaders, q)  # one loader: also a reloaded one (attach's own
            return q  # per-step check reads the loader it was given)

        handle._rate = checked

    @staticmethod
    def _follow_loader(handle: AttachHandle, loaders: list) -> None:
        """Move the micro-batch counter and the witnesses to the reloaded loader(s), as
        attach puts them on its loader (review lr: they kept watching the first loader).

        The counter (batches and their sizes) goes to a single loader (none for several);
        the witnesses follow it or refuse (:meth:`Witnesses.follow`), and then nothing moves.
        """
        counter = _describe.counter_for(loaders[0]) if len(loaders) == 1 else None
        if handle.witnesses is not None:
            try:
                handle.witnesses.follow(loaders[0] if len(loaders) == 1 else None, counter)
            except PrivguardError:
                if counter is not None:
                    counter.restore()
                raise
        if handle.counter is not None:
            handle.counter.restore()
        handle.counter = counter

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.handle is None:
            return
        if self._sets is not None:
            self._sets.end(self._draws())  # review radv7: a batch adds at most its draws' sets
        stated = running_statement(self.ledger)
        if stated is not None:
            eps, delta = stated
            pl_module.log(self.log_name, float32_up(eps), on_step=True, on_epoch=False,
                          prog_bar=self.prog_bar, logger=True)
            # the δ it is stated at, rounded up as the ε (review radv9)
            pl_module.log(delta_name(self.log_name), float32_up(delta), on_step=True,
                          on_epoch=False, prog_bar=False, logger=True)
        if self.handle.should_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._detach()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._detach()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_module", None)  # the module travels on its own (spawn-based strategies)
        return state

    def state_dict(self) -> dict[str, Any]:
        entry = ledger_entry(self.ledger)
        if self._run is not None:  # the run that wrote it (review lrw: _later_of_run)
            entry["checkpoint"] = {"run": self._run, "dirs": list(self._dirs)}
            if self._branch is not None:
                entry["checkpoint"].update(branch=self._branch, base=self._base)
            weights = weights_digest(self._module) if self._module is not None else None
            if weights is not None:  # None: sharded, not tied (as Hugging Face's)
                entry["checkpoint"]["weights"] = weights
        return {"privguard": entry}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if isinstance(state_dict, dict) and "privguard" in state_dict:
            entry = state_dict["privguard"]
            named = entry.get("checkpoint", {}) if is_entry(entry) else {}
            run = named.get("run") if isinstance(named, dict) else None
            dirs = named.get("dirs", []) if isinstance(named, dict) else None
            if not (isinstance(named, dict) and (run is None or isinstance(run, str))
                    and isinstance(dirs, list) and all(isinstance(d, str) for d in dirs)):
                raise LedgerStateError(f"LedgerCallback state: the entry's checkpoint field is "
                                       f"malformed: {check.short(named)}")
            restore(self.ledger, entry, where="LedgerCallback state")
            self._resumed = entry  # its branch is checked with the run's others (task fw)
            self._run = run  # None: written before run ids (its later entries are not found)
            self._dirs = tuple(dirs)
            self._restored = True
        elif isinstance(state_dict, dict) and "ledger" in state_dict:  # privguard 0.1
            self.ledger.load_state_dict(state_dict["ledger"])
            self._run, self._dirs, self._restored = None, (), True
        else:
            raise InvalidArgumentError("state_dict", type(state_dict).__name__,
                                       "is not a LedgerCallback state")
