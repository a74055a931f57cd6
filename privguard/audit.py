"""A one-run audit of an Opacus pipeline: an empirical lower bound next to the charged ε.

:func:`audit_opacus` trains the user's own private pipeline once with ``m``
white-box gradient canaries (Nasr et al. 2023; Steinke, Nasr & Jagielski
2023, §6): unit directions ``u_i`` scaled to the clip norm C (distinct random
coordinates when m ≤ d, so the canaries are orthonormal; random directions
otherwise), each included with probability 1/2, and each included canary
sampled at every step with the loader's Poisson rate q, exactly as a record
is. Its gradient ``C·u_i`` joins the clipped sum before Opacus adds the noise,
so each canary is one more record of the charged subsampled Gaussian
mechanism. Each canary is scored from what is released and what is
independent of the canaries — never from their secret inclusion or sampling:
at every step, its projection ``x_t = ⟨u_i, g̃_t·s − D_t⟩/C`` of the released
noisy gradient ``g̃_t`` (unscaled by Opacus' s) less the data's own clipped
sum ``D_t`` (a function of the released parameters and of the data sampling)
enters the charged step's log-likelihood ratio ``log(1 − q + q·e^{(x_t −
½)/σ²})``, summed over all steps. For each of a few ``(k_in, k_out)`` pairs
fixed before the run, the ``k_in`` highest scores are guessed "in" and the
``k_out`` lowest "out"; each pair's right guesses give a lower bound on ε at
the ledger's δ by Steinke–Nasr–Jagielski's Theorem 5.2 at a confidence split
between the pairs, and the largest is returned (:mod:`privguard._audit._one_run`,
:mod:`privguard._audit._audit_scoring`; docs/theory.md §16.3–16.4).
The ledger attached for the run gives the charged ε of the same run.

Example:
    >>> import torch, warnings
    >>> from opacus import PrivacyEngine
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> warnings.filterwarnings("ignore")
    >>> def build():
    ...     torch.manual_seed(0)
    ...     x = torch.randn(256, 4); y = (x[:, 0] > 0).long()
    ...     model = torch.nn.Linear(4, 2)
    ...     return PrivacyEngine().make_private(
    ...         module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    ...         data_loader=DataLoader(TensorDataset(x, y), batch_size=32),
    ...         noise_multiplier=1.0, max_grad_norm=1.0)
    >>> result = audit_opacus(build, steps=20, canaries=200, seed=0)
    >>> result.epsilon_lower <= result.epsilon_charged
    True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._audit._audit_scoring import (
    default_guesses,
    lower_bound_over_guesses,
    step_log_likelihood_ratio,
)
from privguard._audit._one_run import guess_and_count
from privguard._errors import InvalidArgumentError

__all__ = ["AuditResult", "audit_opacus", "guess_and_count"]


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """What one audited run shows.

    Attributes:
        epsilon_lower: with probability ≥ ``confidence``, the true ε of the
            run at ``delta`` is at least this (docs/theory.md §16).
        epsilon_charged: the run's (ε, δ)-DP at ``delta`` from the curve
            the ledger charged for it, by the non-adaptive conversion
            (:meth:`privguard.Ledger.nonadaptive_epsilon`), valid here because
            the audited run's steps are fixed in advance. It is the hockey-stick
            form ``epsilon_lower`` refutes; the ledger's any-time ε
            (:meth:`privguard.Ledger.epsilon`) is a tail bound and larger.
        delta: the δ of both numbers.
        confidence: the confidence of ``epsilon_lower``.
        canaries: m, the number of canaries.
        guesses: r, the number of guesses made (``k_in + k_out``) by the
            pre-registered pair that gave ``epsilon_lower``.
        correct: v, the number of right guesses of that pair.
        steps: the real (noisy) steps of the run.
        guess_sets: n, the number of pre-registered (k_in, k_out) pairs;
            each was scored at confidence 1 − (1 − confidence)/n (§16.4).
    """

    epsilon_lower: float
    epsilon_charged: float
    delta: float
    confidence: float
    canaries: int
    guesses: int
    correct: int
    steps: int
    guess_sets: int = 1

    @property
    def ratio(self) -> float:
        """``epsilon_lower / epsilon_charged`` (0 when nothing was charged)."""
        return self.epsilon_lower / self.epsilon_charged if self.epsilon_charged > 0 else 0.0


class _Canaries:
    """The canaries on one Opacus optimizer: added before the noise, scored after it."""

    def __init__(self, optimizer: Any, m: int, rate: float, rng: np.random.Generator) -> None:
        import torch

        self.opt = optimizer
        self.params = [p for p in optimizer.params]
        self.sizes = [p.numel() for p in self.params]
        d = sum(self.sizes)
        self.coords: Any = None
        self.u: Any = None
        if m <= d:  # distinct random coordinates: orthonormal, no cross-talk (§16.4)
            self.coords = torch.from_numpy(rng.choice(d, size=m, replace=False))
        else:  # more canaries than coordinates: random unit directions (with cross-talk)
            gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
            try:
                u = torch.randn(m, d, generator=gen, dtype=torch.float32)
            except (RuntimeError, MemoryError):  # review aa: torch's allocation error escaped
                raise InvalidArgumentError(
                    "canaries", m, f"is more than the model's d = {d} parameters, so each "
                    f"canary is a random direction: m×d = {m * d:,} float32 that could not be "
                    f"allocated; use at most {d} canaries (distinct coordinates)") from None
            self.u = u / u.norm(dim=1, keepdim=True)
        self.d = d
        self.included = rng.random(m) < 0.5
        self.rate = rate
        self.rng = rng
        self.score = np.zeros(m)  # Σ_t per-step log-likelihood ratio (§16.4)
        self._data = torch.zeros(d, dtype=torch.float64)
        self.steps = 0
        self._inc = torch.from_numpy(self.included)
        self._add_noise = optimizer.add_noise
        self._scale_grad = optimizer.scale_grad
        # instance attributes the pipeline set itself, put back by remove() (review aud)
        self._own = {name: vars(optimizer)[name] for name in ("add_noise", "scale_grad")
                     if name in vars(optimizer)}
        optimizer.add_noise = self._with_canaries
        optimizer.scale_grad = self._score

    def _with_canaries(self) -> None:
        import torch

        c = float(self.opt.max_grad_norm)
        # the data's clipped sum of this step: a function of the released θ_t and of the data
        # sampling, both independent of the canaries' inclusion (docs/theory.md §16)
        self._data = torch.cat([p.summed_grad.detach().reshape(-1).double() for p in self.params])
        sampled = torch.from_numpy(self.rng.random(len(self.included)) < self.rate) & self._inc
        if self.coords is not None:  # Σ C·e_{j_i} over the included canaries drawn now
            extra = torch.zeros(self.d, dtype=torch.float32)
            extra[self.coords[sampled]] = c
        else:  # Σ C·u_i over the included canaries drawn now
            extra = c * self.u[sampled].sum(0)
        for p, piece in zip(self.params, torch.split(extra, self.sizes), strict=True):
            p.summed_grad = p.summed_grad + piece.view_as(p.summed_grad).to(p.summed_grad)
        self._add_noise()

    def _score(self) -> None:
        import torch

        self._scale_grad()  # p.grad is now the released, privatized update of this step
        opt = self.opt
        scale = 1.0
        if opt.loss_reduction == "mean":
            scale = float(opt.expected_batch_size * opt.accumulated_iterations)
        flat = torch.cat([p.grad.detach().reshape(-1).double() for p in self.params])
        released = flat * scale - self._data  # = the canaries drawn + the noise
        c = float(opt.max_grad_norm)
        if self.coords is not None:
            x = (released[self.coords] / c).numpy()
        else:
            x = (self.u @ released.float()).double().numpy() / c
        # the charged step's likelihood ratio at the projection: charged σ and q, no secret
        self.score += step_log_likelihood_ratio(x, float(opt.noise_multiplier), self.rate)
        self.steps += 1

    def check(self, loss_from: str, step: int) -> None:
        """Refuse, after step ``step`` (from 1), scores that are NaN (task lo7: a finite loss
        whose gradients overflowed made the released update, hence every score, NaN, and
        the audit ended with a vacuous ε_lower = 0). The step ran and stays charged (a
        release is never refunded); no further step runs. No value is shown; the message
        says at which step (task lo8), which is all it tells of the data."""
        if np.isnan(self.score).any():  # (±inf alone ranks: a σ whose square underflows)
            raise InvalidArgumentError(
                loss_from, "a loss whose gradients are not finite (NaN or inf)",
                f"must give a loss whose gradients stay finite: at step {step}, the released "
                "update, and so the canaries' scores, were NaN or infinite; that step stays "
                "charged, and the audit stopped")

    def scores(self) -> np.ndarray:
        """Each canary's score: Σ_t log(1 − q + q·exp((x_t − ½)/σ²)), x_t its projection."""
        return self.score

    def remove(self) -> None:
        for name in ("add_noise", "scale_grad"):
            vars(self.opt).pop(name, None)
            if name in self._own:  # the pipeline's own, not the class's (review aud)
                setattr(self.opt, name, self._own[name])


def _train(model: Any, opt: Any, loader: Any, steps: int, loss: Callable,
           loss_from: str = "loss",
           after_step: Callable[[str, int], None] | None = None) -> int:
    """Train ``steps`` real steps; ``loss_from`` names the argument the loss came from
    (``loss``, or ``build`` for a 4th item), which a loss that cannot be back-propagated
    is refused under; ``after_step(loss_from, k)`` runs after the k-th step, from 1 (it may
    refuse)."""
    done = 0
    while done < steps:
        seen = False
        for batch in loader:
            if not isinstance(batch, (tuple, list)) or len(batch) != 2:
                # review aud: "for x, y in loader" raised ValueError/TypeError; refused before
                # the step, so nothing of it ran or was charged
                shape = (f"a batch of {len(batch)} items"
                         if isinstance(batch, (tuple, list)) else type(batch).__name__)
                raise InvalidArgumentError("build", shape, "must return a data loader of "
                                           "(inputs, labels) batches, which the audit trains on")
            x, y = batch
            seen = True
            opt.zero_grad()
            _backward(loss(model(x), y), loss_from, _empty(x), done + 1)
            _check_reached(opt, loss_from)
            opt.step()
            done += 1
            if after_step is not None:
                after_step(loss_from, done)
            if done >= steps:
                break
        if not seen:
            break
    return done


def _empty(x: Any) -> bool:
    """Whether a batch's inputs hold no example (Poisson sampling draws empty batches, whose
    mean loss is NaN with no gradient of any example: not refused)."""
    shape = getattr(x, "shape", None)
    return shape is not None and len(shape) > 0 and shape[0] == 0


def _backward(value: Any, loss_from: str, empty: bool = False, step: int = 1) -> None:
    """``value.backward()``, after refusing a loss value it cannot run on (task adv3: a
    per-sample loss, ``CrossEntropyLoss(reduction="none")``, or one detached from the model
    raised torch's RuntimeError out of audit_opacus). Refused before this step's backward, so
    the step is neither taken nor charged. Opacus' ghost-clipping criterion returns its own
    tensor type, which is back-propagated as it is. ``step``: the step's number, from 1,
    which a loss that is not finite is refused at."""
    import torch

    if isinstance(value, torch.Tensor):
        # its shape is not shown: a per-sample loss's length is the drawn batch's size
        if value.numel() != 1:
            what = f"a loss of {value.dim()} dimension(s), not a scalar"
        elif not value.requires_grad or value.grad_fn is None:
            # review radv3: also a leaf that requires grad, made apart from the model
            what = "a loss without a gradient"
        elif not value.is_floating_point():  # review radv3: complex, torch's RuntimeError
            what = "a loss that is not real"
        elif not empty and not bool(torch.isfinite(value.detach()).all()):
            # task lo7: a NaN (or inf) loss made every later score NaN, and the audit ended
            # with a vacuous ε_lower = 0; the value itself is not shown (it is the data's).
            # An empty batch's mean loss is NaN with no example's gradient: it goes on.
            # Task lo8: it said "must give a scalar loss" (it was one); now what was wrong
            # and at which step, all it tells of the data (NaN and inf are not told apart)
            raise InvalidArgumentError(
                loss_from, "a loss that is not finite (NaN or inf)",
                f"must give a finite loss: the loss at step {step} was NaN or infinite; "
                "that step was neither taken nor charged, and the audit stopped")
        else:
            what = ""
        if what:
            raise InvalidArgumentError(
                loss_from, what,
                "must give a scalar loss of the batch that depends on the model (reduction "
                "'mean' or 'sum'), which the audit back-propagates")
    elif not callable(getattr(value, "backward", None)):
        raise InvalidArgumentError(loss_from, type(value).__name__,
                                   "must give a loss tensor, which the audit back-propagates")
    value.backward()


def _check_reached(opt: Any, loss_from: str) -> None:
    """Refuse, before ``opt.step()``, a loss whose backward left a trained parameter without
    per-sample gradients (review radv3: a loss of a tensor that requires grad but not of the
    model let Opacus' ValueError "Per sample gradient is not initialized" escape). Opacus'
    ghost-clipping optimizer keeps none (it clips by norms), so it is not checked here."""
    from privguard.integrations._describe import is_ghost

    if is_ghost(opt):
        return
    if any(getattr(p, "grad_sample", None) is None for p in getattr(opt, "params", ())):
        raise InvalidArgumentError(
            loss_from, "a loss that does not reach every trained parameter",
            "must give a scalar loss of the batch that depends on the model (reduction "
            "'mean' or 'sum'), which the audit back-propagates")


def audit_opacus(build: Callable[[], Any], *, steps: int, canaries: int = 1000,
                 confidence: float = 0.95, delta: float = 1e-5,
                 guesses: tuple[int, int] | Sequence[tuple[int, int]] | None = None,
                 loss: Callable | None = None,
                 seed: int | None = None) -> AuditResult:
    """Train the pipeline ``build()`` makes once with canaries; return ε lower and charged.

    Args:
        build: returns ``(model, optimizer, data_loader)`` (or with a 4th
            item, the loss function), already made private by Opacus
            (``PrivacyEngine.make_private``) with Poisson sampling.
        steps: real steps to train.
        canaries: m, the number of gradient canaries.
        confidence: confidence of the lower bound.
        delta: the δ of both numbers.
        guesses: ``(k_in, k_out)``, or a sequence of such pairs, fixed
            before the run: the ``k_in`` top scores are guessed "in", the
            ``k_out`` bottom ones "out"; with n pairs each is bounded at
            confidence 1 − (1 − confidence)/n and the largest bound is
            returned. Default :func:`privguard._audit._audit_scoring.default_guesses`:
            ``(m/50, 0), (m/10, 0), (m/10, m/10), (m/4, m/4)``.
        loss: the loss (default: cross-entropy); a 4th item of ``build()``
            overrides it.
        seed: seeds the canaries' directions, inclusion and sampling (for
            tests and reproducible reports only; default: OS entropy). The
            confidence is over the canaries' coins: the largest bound of
            several runs or seeds tried holds only at the union of their
            levels (docs/theory.md §16.4).

    Returns:
        An :class:`AuditResult`.

    Raises:
        InvalidArgumentError: a bad argument, or ``build()`` did not return
            an Opacus pipeline with a Poisson loader, one process's (not a distributed
            optimizer, a model under DDP or FSDP, or a process group of several ranks),
            or one that clips adaptively (docs/theory.md §14.8).
    """
    from privguard._ledger._ledger import Ledger
    from privguard.integrations._adaptive_clipping import (
        is_adaptive_clipping,
        is_adaptive_criterion,
    )
    from privguard.integrations.opacus import attach

    steps = check.positive_int("steps", steps)
    m = check.positive_int("canaries", canaries)
    delta = check.delta("delta", delta)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) \
            or not 0.0 < confidence < 1.0:
        raise InvalidArgumentError("confidence", confidence, "must be in (0, 1)")
    pairs = _guess_pairs(guesses, m)
    # checked before build() runs (review bx: a non-callable build or loss, or a seed numpy
    # refuses, escaped as TypeError/ValueError, the latter two after building and training)
    if not callable(build):
        raise InvalidArgumentError("build", build, "must be callable: () -> (model, optimizer, "
                                   "data_loader[, loss])")
    if loss is not None and not callable(loss):
        raise InvalidArgumentError("loss", loss, "must be None or callable")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                             or seed < 0):
        raise InvalidArgumentError("seed", seed, "must be None or an integer >= 0")
    built = build()
    if not isinstance(built, tuple) or len(built) not in (3, 4):
        raise InvalidArgumentError("build", build, "must return (model, optimizer, data_loader"
                                   "[, loss])")
    model, opt, loader = built[:3]
    if len(built) == 4:
        loss = built[3]
    if loss is None:
        import torch

        loss = torch.nn.functional.cross_entropy
    if not callable(loss):
        raise InvalidArgumentError("build", build, f"returned a loss that is not callable: "
                                   f"{check.short(loss)!r}")
    if hasattr(opt, "world_size") or hasattr(opt, "rank"):
        # review aud: a distributed Opacus optimizer adds its noise on rank 0 only, before the
        # all-reduce, so on another rank p.grad at scale_grad is that rank's noiseless sum
        # (not a release) and its canaries were scored without noise; and every rank added
        # canaries of its own (docs/theory.md §16.3)
        raise InvalidArgumentError("build", build, f"returned a distributed optimizer "
                                   f"({type(opt).__name__}); the one-run audit runs in one "
                                   f"process (DPOptimizer, non-distributed)")
    if is_adaptive_clipping(opt) or is_adaptive_criterion(loss):
        # review radv3: attach refused it naming "optimizer", no argument of this call (and
        # Opacus' ghost-clipping adaptive criterion only at the first step, after build)
        raise InvalidArgumentError("build", build, "returned an adaptive-clipping pipeline "
                                   "(make_private(..., clipping='adaptive'), or Opacus' "
                                   "PrivacyEngineAdaptiveClipping criterion), whose step is not "
                                   "the SubsampledGaussian it would be charged as "
                                   "(docs/theory.md §14.8); use a fixed clipping bound")
    wrapper = _data_parallel(model)
    if wrapper is not None:
        # task fp: plain DDP (or FSDP, Opacus' DPDDP) around the model with a non-distributed
        # DPOptimizer: every rank adds noise of its own to the all-reduced gradient and
        # inserts canaries of its own, and the audit scores one rank's view of the update
        # (docs/theory.md §16.3); the refused optimizers above, by another route
        raise InvalidArgumentError("build", build, f"returned {wrapper} with a "
                                   f"non-distributed optimizer; the one-run audit runs in one "
                                   f"process (no data-parallel wrapper, no process group of "
                                   f"several ranks)")
    rate = getattr(getattr(loader, "batch_sampler", None), "sample_rate", None)
    if rate is None:
        raise InvalidArgumentError("build", build, "must return a Poisson-sampling Opacus data "
                                   "loader (make_private's default), whose rate the canaries use")
    ledger = Ledger(delta=delta)
    handle = attach(opt, ledger, data_loader=loader)
    rng = np.random.default_rng(seed)
    try:  # detached also when the canaries cannot be made (review aa: it stayed attached)
        probe = _Canaries(opt, m, float(rate), rng)
    except BaseException:
        handle.detach()
        raise
    try:
        _train(model, opt, loader, steps, loss, "build" if len(built) == 4 else "loss",
               probe.check)
    finally:
        probe.remove()
        handle.detach()
    low, r, v = lower_bound_over_guesses(probe.scores(), probe.included, pairs, delta,
                                         float(confidence))
    charged = ledger.nonadaptive_epsilon() if len(ledger.history) else 0.0
    return AuditResult(epsilon_lower=low,
                       epsilon_charged=float(charged) if math.isfinite(charged) else math.inf,
                       delta=delta, confidence=float(confidence), canaries=m, guesses=r,
                       correct=v, steps=probe.steps, guess_sets=len(pairs))


def _data_parallel(model: Any) -> str | None:
    """What makes ``model``'s training data-parallel, in words, or None: a DDP-like wrapper
    among its modules (torch's DistributedDataParallel or FullyShardedDataParallel, Opacus'
    DifferentiallyPrivateDistributedDataParallel; under make_private's GradSampleModule too),
    or a process group of more than one rank (a gradient all-reduce need not show in the
    model: fail closed)."""
    import torch

    names = ("DistributedDataParallel", "FullyShardedDataParallel",
             "DifferentiallyPrivateDistributedDataParallel")
    modules = model.modules() if isinstance(model, torch.nn.Module) else ()
    for module in modules:
        if type(module).__name__ in names or isinstance(
                module, torch.nn.parallel.DistributedDataParallel):
            return f"a model under {type(module).__name__}"
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return f"a model in a process group of {dist.get_world_size()} ranks"
    return None


def _guess_pairs(guesses: Any, m: int) -> tuple[tuple[int, int], ...]:
    """The pre-registered (k_in, k_out) pairs, checked (each makes 1 to m guesses)."""
    if guesses is None:
        return default_guesses(m)
    if isinstance(guesses, tuple) and len(guesses) == 2 \
            and not any(isinstance(k, (tuple, list)) for k in guesses):
        guesses = (guesses,)
    if not isinstance(guesses, (tuple, list)) or not guesses:
        raise InvalidArgumentError("guesses", guesses, "must be a (k_in, k_out) pair or a "
                                   "non-empty sequence of such pairs")
    pairs = []
    for pair in guesses:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidArgumentError("guesses", guesses, "must hold (k_in, k_out) pairs")
        for name, k in (("guesses[0]", pair[0]), ("guesses[1]", pair[1])):
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise InvalidArgumentError(name, k, "must be a non-negative integer")
        if pair[0] + pair[1] > m or pair[0] + pair[1] == 0:
            raise InvalidArgumentError("guesses", guesses, f"must make 1 to m = {m} guesses")
        pairs.append((int(pair[0]), int(pair[1])))
    return tuple(pairs)


def demo_audit(quick: bool = False, seed: int | None = None, steps: int | None = None,
               canaries: int | None = None) -> AuditResult:
    """``privguard audit``: audit the demo's pipeline (digits, 64-64-10 MLP, σ = 1, C = 1).

    ``quick``: 100 steps and 1,000 canaries (seconds); else 600 steps and
    2,000 canaries (minutes on a CPU); ``steps``/``canaries`` override.
    """
    from privguard._cli._demo import _data, _private_model

    warnings_off()
    train, _, _ = _data(0)
    default_steps, default_m = (100, 1000) if quick else (600, 2000)
    # None means the default; 0 is passed on and refused (review bi: `or` ran the default)
    return audit_opacus(lambda: _private_model(train, 0.5, 0),
                        steps=default_steps if steps is None else steps,
                        canaries=default_m if canaries is None else canaries, seed=seed)


def warnings_off() -> None:
    import warnings

    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message=".*Full backward hook.*")
    warnings.filterwarnings("ignore", message=".*Optimal order is the.*")
