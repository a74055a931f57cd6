"""Runtime witnesses: did the Opacus step run as the ledger is told it ran?

The ``check`` stage of the step hook (``describe → check → charge →
release``, /work/shared/design.md). With white-box access to the
``DPOptimizer`` it measures, at every real step and before
the step is charged or released, three things the charge asserts:

* **noise** — Opacus keeps the clipped sum ``p.summed_grad`` beside the noisy
  scaled gradient ``p.grad = (summed_grad + Z) / s`` (``s`` = expected batch
  size × accumulated iterations for ``loss_reduction="mean"``, else 1;
  ``DPOptimizer.add_noise``/``scale_grad``, the same under ghost clipping), so
  the noise actually added is ``Z = p.grad · s − p.summed_grad``. Under the
  charge, ``Z ~ N(0, (σC)² I_d)`` and ``‖Z‖²/(σC)² ~ χ²_d`` exactly; the test
  is one-sided (it alarms only when the noise is *smaller* than charged: more
  noise, as AdaClip adds by design, is safe) with the exact χ² lower tail
  (regularised incomplete gamma), docs/theory.md §16. Each parameter's own noise is
  tested too (‖Z_p‖²/(σC)² ~ χ²_{d_p}, at α_j/P each): noise that misses a small
  parameter barely moves the total, but releases that parameter's clipped sum (review rt);
  and the noise against the previous step's (‖Z_t − Z_{t−1}‖²/(σ_tC)² against χ²_d's lower
  tail, by Anderson's inequality): a generator reseeded before every step repeats Z.
  Every statistic bounds the noise drawn, Z, not only its trace z = s·g − a, which
  Opacus' rounding of g = fl(fl(a + Z)/s) shrinks by ≤ 4u_p·s‖g‖ (review sb; the total
  test too since wr), plus (1 + s)·η_p·√d_p below the normal range (review rwl); a step
  whose dtype cannot hold the noise (u_p·s‖g‖ ≥ σC√d, or the allowance alone would pass
  a step without noise: review rwl), or whose clipped sum or gradient is not finite
  (NaN, ±inf, a float64 overflow), is refused: its noise cannot be measured (wr,
  docs/theory.md §16.1). The first refusal depends on the noisy gradient: its step is
  charged before it is raised (``step_charged``, docs/theory.md §16.2).
* **clipping** — where per-sample gradients exist, the increment of
  ``summed_grad`` must equal ``Σ_i g_i · min(1, C/‖g_i‖)`` recomputed here
  from ``p.grad_sample`` (so no per-sample contribution exceeds C), within a
  float tolerance a correct clip never reaches; under ghost clipping only
  the per-sample norms exist and the witness checks
  ``‖Σ clipped‖ ≤ Σ_i min(‖g_i‖, C)`` (a clipped sum whose contributions
  exceed C can pass it: that is left to the one-run audit; the same bound
  under per-layer clipping). The per-sample recomputation runs on the
  handle's first micro-batch, then on each with probability
  :data:`CLIP_CHECK_RATE` (the witnesses' own coins); every step gets
  ``‖summed_grad‖ ≤ B·C`` (B records). Deterministic
  under a correct pipeline: it never fires, so it reveals nothing.
* **sampling** — the batch sizes are the sampler's own draws: under the
  charge they are independent Binomial(N·k, q) (k accumulated micro-batches,
  q the charged rate per draw), so their running sum over a stretch of
  constant q is Binomial(Σ N·k, q) and is tested two-sided with the exact
  binomial tails (regularised incomplete beta) after every step; and the
  number of disjoint pairs of steps with equal batch sizes is tested against
  its exact Binomial(P, Σ_b P(B=b)²) law (fixed-size batches tie). Under
  accumulation, where the loader's micro-batch counter saw the step's k
  batches, each micro-batch's size is its own Binomial(N, q) draw in both
  tests (pairs of micro-batches: two halves of one batch tie).

The noise test and the clipped-sum bound run at every real step, as the
sampling tests do (a step schedule that checked 1 step in 4 was removed: it
released the broken steps it skipped; docs/theory.md §16.2, git history 438c3a4).

Per-record inclusion counts (integrations/_inclusion.py): with a
Poisson-charged ``data_loader``, once per expected epoch, the numbers of
rarely and often drawn records against their exact binomial laws.

False alarms: the sampling-mean and sampling-ties tests at the handle's t-th
step (the noise and per-record tests at their t-th test) use level ``α·6/(π²t²)`` with α
from :func:`reserve_for` each, so over any number of steps each alarms with
probability ≤ α under a correct pipeline (Σ 6/(π²t²) = 1), whatever the data; the
clipping test never alarms. The witnessed run is (ε, δ + (1+e^ε)·6α)-DP where the run is (ε, δ) (docs/theory.md §16.2); the
:class:`~privguard.mechanisms.DeltaReserve` charged with the first step sets
that δ aside from the ledger's target, so the target holds for the witnessed
run (Proposition 16.4).

Under DDP only rank 0 adds noise: the noise witness runs there (``noise=False``
on the other ranks) and the hook takes the refusal on every rank
(``Coordinator.check_together``). Each rank's sampling witness tests the batch
sizes its Opacus distributed sampler yields: zero-truncated Binomial(n, q) draws
from its shard of n records (integrations/_shard.py; the ties with the truncated
law's tie probability, the running count at α_t·(1 − p₀)^m, each rank at α/W);
the per-record counts are off under DDP.

Cost: the noise norms from the Gram matrix of a float64 buffer allocated once and,
in the same pass, the per-parameter and repeat norms of ẑ = a − s·g (one copy, two
subtractions, one fused norm, one product, all read back in one host sync: task t28); the
exact χ² and binomial tails are evaluated only where they can alarm (cached
cut, median side, the anchors of :meth:`Witnesses._covered`, the safe tie
count), with the same decisions as evaluating them every step
(docs/theory.md §16.2).
"""

from __future__ import annotations

import functools
import math
import os
import random
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from scipy import special

from privguard._accounting._results import exact as _exact
from privguard._accounting._results import lower as _down
from privguard._accounting._results import stated_delta as _stated_delta
from privguard._accounting._results import upper as _up
from privguard._errors import (
    InvalidArgumentError,
    LedgerStateError,
    PipelineMismatchError,
    PrivguardError,
)
from privguard._mechanisms._reserve import DeltaReserve
from privguard.integrations import _skips
from privguard.integrations._inclusion import AllocationEpochs, InclusionCounts
from privguard.integrations._shard import ShardDraws, truncation_factor
from privguard.integrations._tails import CONFIDENCE
from privguard.integrations._tails import binomial_tail_lower as _binomial_tail_lower
from privguard.integrations._tails import binomial_tail_upper as _binomial_tail_upper
from privguard.integrations._tails import binomial_tails as _binomial_tails
from privguard.integrations._tails import chi2_lower_tail as _chi2_lower_tail
from privguard.integrations._tails import chi2_quantile as _chi2_quantile
from privguard.integrations._tails import clopper_pearson as _clopper_pearson

__all__ = ["DELTA_SHARE", "FALSE_ALARM", "STATISTICAL", "Witnesses", "level", "reserve_for"]

FALSE_ALARM = 1e-10
"""Total false-alarm probability of each statistical witness (noise, sampling) over a run."""

STATISTICAL = 6
"""The statistical witnesses, each spending its own false-alarm budget: noise (all
coordinates); noise per parameter; noise against the previous step's (both review rt);
sampling mean; sampling ties; per-record
inclusion counts (integrations/_inclusion.py; the clipping witness is deterministic and
never alarms)."""

DELTA_SHARE = 1e-3
"""The share r of the ledger's δ set aside for the false alarms (docs/theory.md §16.2)."""

_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)  # torch ≥ 2.1: one fused copy

CLIP_CHECK_RATE = 0.125
"""Probability that a micro-batch after the first gets the exact per-sample clipping check."""


def coarsest_eps(dtypes: Any) -> float:
    """The machine epsilon of the coarsest floating dtype in ``dtypes`` (0.0 if none): the
    float tolerance of the clipping checks, where parameters of several dtypes are summed.

        >>> coarsest_eps([torch.float32, torch.bfloat16]) == torch.finfo(torch.bfloat16).eps
        True
    """
    return max((torch.finfo(t).eps for t in dtypes if t.is_floating_point), default=0.0)


def _stabiliser(c: float) -> float:
    """The clipping checks' absolute tolerance per record: 10× the most that Opacus'
    stabiliser, min(1, C/(‖g‖ + 10⁻⁶)) for min(1, C/‖g‖), moves a record's clipped
    contribution, min(C, 10⁻⁶) (wr).

    For ‖g‖ = n ≥ C the contribution moves by C·10⁻⁶/(n + 10⁻⁶) ≤ min(C, 10⁻⁶); for n < C
    by n·(1 − C/(n + 10⁻⁶))⁺ ≤ min(n, 10⁻⁶) < min(C, 10⁻⁶). The flat 10⁻⁵ per record used
    before is this for C ≥ 10⁻⁶, but at a smaller C (a loss in small units) it exceeded
    B·C itself, and a step with clipping turned off passed both clipping checks.

        >>> _stabiliser(1.0), _stabiliser(1e-9)
        (1e-05, 1e-08)
    """
    return 1e-5 if c >= 1e-6 else 10.0 * c  # exactly the former 1e-5 for C ≥ 10⁻⁶


def gram_widening(d: int) -> float:
    """The relative widening g of the noise statistic from a float64 Gram product over d
    coordinates: g = (d + 16)u/(1 − 2(d + 16)u), u = 2⁻⁵³ (docs/theory.md §16.2).

    The two rounding terms of :meth:`Witnesses._measure` sum to γ_d/(1 − γ_d) +
    6u(1 + γ_d)/(1 − γ_d) = (d + 6)u/(1 − 2du) (γ_n = nu/(1 − nu), Higham 2002, §3.1), and
    g exceeds that by ≥ 10u for R's own rounding and the final sum's. γ_{d+16}, used before,
    does not: it falls below the two terms for d ≳ 3·10⁸ (its second-order term is (du)²,
    theirs 2(du)²). Finite and positive while 2(d + 16)u < 1 (d < 4·10¹⁵).

        >>> gram_widening(1000) > 1000 * 2.0 ** -53
        True
    """
    n = (d + 16) * 2.0 ** -53  # exact (an integer times a power of 2)
    return n / (1.0 - 2.0 * n)


def level(t: int, total: float = FALSE_ALARM) -> float:
    """The false-alarm probability spent at step ``t`` ≥ 1: ``total·6/(π²t²)``.

    Σ_{t≥1} 6/(π²t²) = 1 (Euler's Basel sum), so the union bound over all
    steps is ``total``.

    Example:
        >>> round(sum(level(t, 1.0) for t in range(1, 10**5)), 4)
        1.0
    """
    return total * 6.0 / (math.pi ** 2 * t * t)


_UNCHARGED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Attach handles of this process whose δ reserve is sized and not yet charged (task wr2)."""


_SIZING = threading.RLock()
"""Held across one attach's :func:`reserve_for` and :func:`hold` (and every read of
:data:`_UNCHARGED`): two threads attaching at once would otherwise both size as first."""


def hold(handle: Any) -> None:
    """Count ``handle``'s uncharged :class:`~privguard.mechanisms.DeltaReserve` (its
    ``witness_reserve``) in every later :func:`reserve_for` on the same ledger, until it is
    charged (``witness_reserve`` None) or the handle is gone. Call it under :data:`_SIZING`,
    in the same block as the :func:`reserve_for` that sized it."""
    with _SIZING:
        _UNCHARGED.add(handle)


def _same_ledger(a: Any, b: Any) -> bool:
    """One ledger object, or two opened on one file."""
    if a is b:
        return True
    pa, pb = a.path, b.path
    return pa is not None and pb is not None and os.path.realpath(pa) == os.path.realpath(pb)


def _reserves_before(ledger: Any) -> float:
    """log Π (1 − r_j) over the δ reserves already set aside on ``ledger``: every
    :class:`~privguard.mechanisms.DeltaReserve` charge in its journal (as many times as charged)
    and every reserve sized by an earlier attach of this process and not yet charged
    (docs/theory.md §16.2, Proposition 16.4b). Fail closed: a journal whose runs cannot be
    read raises :class:`~privguard.LedgerStateError`."""
    # the uncharged reserves first, then the journal: a reserve another thread's first step
    # charges in between is counted twice (fewer false alarms: safe), never missed (review
    # of task wr2: read the other way round, it was counted in neither)
    with _SIZING:
        pending = [handle.witness_reserve for handle in list(_UNCHARGED)
                   if _same_ledger(handle.ledger, ledger)]
    log_kept = sum(math.log1p(-reserve.share) for reserve in pending
                   if isinstance(reserve, DeltaReserve))
    try:
        with ledger._synced(write=False):
            runs = ledger._acc.journal.runs()
    except LedgerStateError as exc:
        raise LedgerStateError(
            f"witnesses=True needs the δ reserves already set aside on this ledger, and its "
            f"journal cannot be read ({exc}); nothing was attached (docs/theory.md §16.2)") from exc
    return log_kept + sum(run.count * math.log1p(-run.mechanism.share) for run in runs
                          if isinstance(run.mechanism, DeltaReserve))


def reserve_for(ledger: Any) -> tuple[float, DeltaReserve]:
    """The false-alarm budget α of each statistical witness and the charge that pays for it.

    With a filter target (ε, δ), the run with witnesses is (ε, δ)-DP when the
    ledger also holds :class:`~privguard.mechanisms.DeltaReserve` (r·δ set
    aside, r = :data:`DELTA_SHARE`) and the witnesses' total false-alarm
    probability ``a = STATISTICAL·α`` has ``(1 + e^ε)·a ≤ r·δ``
    (docs/theory.md §16.2, Propositions 16.1 and 16.4); α is also at most
    :data:`FALSE_ALARM`. After a retarget δ is the smaller of the target's and the one the
    ledger was created with, at which its odometer is stated (§16.5, Proposition 16.6).
    The k-th witnessed attach on one ledger (task wr2) has ``(1 + e^ε)·a ≤ r·δ·Π_{j<k}(1 − r_j)``
    over the reserves already charged in its journal or sized by an earlier attach of this
    process (Proposition 16.4b): the reserves and the alarms then add to at most δ.

    Raises:
        InvalidArgumentError: the ledger has no (ε, δ) target (an odometer or
            an RDP budget): the δ of the false alarms has nothing to come from.
        LedgerStateError: the ledger's journal cannot be read (the reserves already set aside
            are unknown).

    Example:
        >>> from privguard import Ledger
        >>> alpha, reserve = reserve_for(Ledger(epsilon=8.0, delta=1e-5))
        >>> 3 * alpha * (1 + math.exp(8.0)) <= 1e-3 * 1e-5
        True
    """
    target = ledger.target
    if target is None:
        raise InvalidArgumentError(
            "witnesses", True,
            "needs a ledger with an (ε, δ) target, Ledger(epsilon, delta): a witnessed run is "
            "(ε, δ + (1+e^ε)·a)-DP for the witnesses' false-alarm probability a, and that δ "
            "is set aside from the target (docs/theory.md §16.2)")
    epsilon, delta = target
    # Task wst: the odometer's statements (guarantee() after a retarget, privguard report's
    # running ε) are made at the δ the ledger was created with (docs/theory.md §4), and
    # Proposition 16.6 needs (1+e^ε)·a ≤ r·δ at that δ too: a is sized at the smallest δ
    # any statement of this ledger is made at. (A ledger at 1e-6 retargeted to 1e-3 before
    # attach had a sized at 1e-3: (1+e^8)·a ≈ 1e-6, the whole δ of its statement.)
    stated = _stated_delta(ledger._acc)
    if stated is not None:
        delta = min(delta, stated)
    # log a = log(r·δ·Π_{j<k}(1 − r_j)) − log(1 + e^ε), in log space (no overflow for a large
    # ε): the k-th reserve's share of δ (docs/theory.md §16.2, Proposition 16.4b; task wr2: each
    # attach took r·δ, and two added δ(1 + r²))
    log_a = (math.log(DELTA_SHARE * delta) + _reserves_before(ledger)
             - float(np.logaddexp(0.0, epsilon)))
    alpha = min(FALSE_ALARM, math.exp(log_a) / STATISTICAL * (1.0 - 1e-9))
    if not alpha > 0.0:
        raise InvalidArgumentError(
            "witnesses", True,
            f"cannot be paid for at the target ε = {_exact(epsilon)}: the false-alarm budget "
            f"r·δ·Π(1 − r_j)/(1+e^ε) underflows")
    return alpha, DeltaReserve(share=DELTA_SHARE, min_order=float(ledger.orders[0]))


def _without_locals(method: Callable[..., None]) -> Callable[..., None]:
    """``method``, re-raising its :class:`PipelineMismatchError` (any privguard refusal: an
    :class:`InvalidArgumentError` too, review sb; any other exception, a torch error or an
    interrupt, too, with a note: review sc) from this thin frame alone, the exceptions
    chained to it without their frames.

    Review rt: the frames an exception passes through stay on its traceback with their
    locals (the per-sample gradients of every record of the micro-batch, the clipped sum's
    norm), and error reporters that capture locals (Sentry by default, ``pytest
    --showlocals``) send them on: data released by a step that is charged nothing. The
    traceback is dropped here, so it starts at this frame, whose locals are ``self``, the
    arguments (the step's mechanism) and the error (its documented statistics).
    """
    @functools.wraps(method)
    def thin(self: Any, *args: Any) -> None:
        try:
            method(self, *args)
        except PrivguardError as exc:  # also InvalidArgumentError (_buffer: review sb)
            error: BaseException = exc
        except BaseException as exc:  # re-raised below, its frames dropped
            # Review sc: a torch error (a failed allocation, a shape mismatch) or an interrupt
            # in the check stage carried the same frames; its type and message are kept.
            error = exc
            if hasattr(exc, "add_note"):  # Python ≥ 3.11
                exc.add_note("privguard: traceback dropped by the witnesses (its frames held "
                             "the step's gradients and clipped sums)")
        else:
            return
        todo, seen = [error.__cause__, error.__context__], {id(error)}
        while todo:  # the frames of the exceptions chained to it too
            chained = todo.pop()
            if chained is not None and id(chained) not in seen:
                seen.add(id(chained))
                chained.with_traceback(None)
                todo += [chained.__cause__, chained.__context__]
        raise error.with_traceback(None)
    return thin


def _first_param(optimizer: Any) -> Any:
    """``optimizer.params[0]`` (Opacus: the parameters of every group that require a
    gradient, in order), or None where there is none, without building the list."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                return p
    return None


class _Layout:
    """The float64 buffers of :meth:`Witnesses._measure` for one layout of the parameters
    with a noisy gradient (per parameter: its shape, its gradient's and clipped sum's dtypes
    and the gradient's device, ``key``), with every view and constant a
    step needs made once (task t28: a step dispatches no indexing and allocates nothing but
    the norms' results).

    ``buf`` (2, d): a = summed_grad and g = grad, copied exactly (``targets``: a's views per
    parameter, then g's); ``z`` (2, d): ẑ = a − s·g of this step and of the previous one,
    alternately (``z_parts[r]``: row r's views per parameter; ``z_parts_diff[r]`` the same
    and a's row, which then holds their difference: the previous ẑ's row is never written
    in the step, review ry); ``out``: the Gram matrix (``gram``,
    its first 4 entries) and the norms (``part_norms``: per parameter; ``part_norms_diff``:
    and the difference), read back in one ``tolist``. ``nonempty``: (position, d_p, u_p,
    (1 + 2⁻⁴⁰)/(1 − g_{d_p})) per non-empty parameter; ``unit_max`` the largest u_p;
    ``gamma`` = g_d (:func:`gram_widening`); ``eps`` the machine epsilon of the coarsest
    dtype in ``key``, ``coarsest`` (the clipped-sum bound's tolerance, the precision guard).
    """

    def __init__(self, key: tuple[Any, ...], device: Any) -> None:
        self.key = key
        sizes = [math.prod(entry[0]) for entry in key]
        self.d = d = sum(sizes)
        self.buf = torch.empty((2, d), dtype=torch.float64, device=device)
        self.buf_t = self.buf.t()
        self.a, self.g = self.buf[0], self.buf[1]
        rows: list[list[Any]] = [[], []]
        offset = 0
        for (shape, *_), size in zip(key, sizes, strict=True):
            for row, part in zip((0, 1), rows, strict=True):
                part.append(self.buf[row, offset:offset + size].view(shape))
            offset += size
        self.targets = rows[0] + rows[1]
        self.z = torch.empty((2, d), dtype=torch.float64, device=device)
        self.z_rows = (self.z[0], self.z[1])
        self.z_parts = [list(torch.split(self.z_rows[r], sizes)) for r in (0, 1)]
        self.z_parts_diff = [self.z_parts[r] + [self.a] for r in (0, 1)]
        count = len(sizes)
        self.out = torch.empty(4 + count + 1, dtype=torch.float64, device=device)
        self.gram = self.out[:4].view(2, 2)
        self.part_norms = self.out[4:4 + count]
        self.part_norms_diff = self.out[4:]
        self.gamma = gram_widening(d)
        up = 1.0 + 2.0 ** -40
        # u_p: the unit roundoff of the coarser of the parameter's gradient and clipped-sum
        # dtypes, as seen at this step (wr: after model.half() or .double(), not at attach)
        units = [coarsest_eps(dtypes) / 2.0 for _, *dtypes, _ in key]
        self.unit_max = max(units, default=0.0)
        # the clipping checks' float tolerance: the coarsest dtype of this step's tensors
        dtypes = [dtype for _, *pair, _ in key for dtype in pair]
        self.eps = coarsest_eps(dtypes)
        self.coarsest = max(dtypes, key=lambda t: torch.finfo(t).eps, default=None)
        self.nonempty = [(i, d_p, units[i], up / (1.0 - gram_widening(d_p)))
                         for i, d_p in enumerate(sizes) if d_p]
        # Review rwl: below the smallest normal number the rounding error is absolute, up to
        # half the subnormal spacing η (float16: 2⁻²⁴ ≈ 6·10⁻⁸), not u·|x|: Opacus' sum and
        # quotient add |ε₁| + s|ε₂| ≤ (1 + s)·η/2 per coordinate to |z_j − Z_j|, so
        # ‖Z_p − z_p‖ ≤ 4u_p·s‖g_p‖ + (1 + s)·η_p·√d_p (η, twice the half spacing, covers
        # the (1 + u) factors). ``tiny``: η_p·√d_p per parameter; ``tiny_total``: η_max·√d.
        # (float32: η = 1.4·10⁻⁴⁵, float64: 4.9·10⁻³²⁴; it moves no float32 statistic.)
        etas = [max(torch.finfo(t).smallest_normal * torch.finfo(t).eps for t in pair)
                for _, *pair, _ in key]
        # Task lo4: the float64 statistics square their entries, and a product below 2⁻¹⁰²²
        # (entries ≲ 10⁻¹⁵⁴: float64 gradients only) errs by up to 2⁻¹⁰⁷⁵ absolute, or by
        # all of it where results are flushed to zero: each Gram entry and squared norm by
        # up to 2d·2⁻¹⁰²² (a product and an addition per term), either way, not γ_d of its
        # value. In norm that is at most √(d·2⁻¹⁰²⁰), and for ‖a‖² − 2s⟨a, g⟩ + s²‖g‖²
        # (1 + s)·√(d·2⁻¹⁰²⁰): folded into the subnormal terms, which every statistic adds
        # times (1 + s) and the precision guard counts in its allowance. Without it a float64
        # step with no noise at all passed at σC ≈ 10⁻¹⁶¹ (its Gram product's underflow read
        # as noise; docs/theory.md §16.1, *Squares below the normal range*).
        squares = [math.sqrt(2.0 ** -1020) if torch.float64 in pair else 0.0
                   for _, *pair, _ in key]
        self.squares_total = max(squares, default=0.0) * math.sqrt(d)
        self.tiny = [(eta + sq) * math.sqrt(d_p)
                     for eta, sq, d_p in zip(etas, squares, sizes, strict=True)]
        self.tiny_total = max(etas, default=0.0) * math.sqrt(d) + self.squares_total


class Witnesses:
    """The three witnesses on one Opacus optimizer (created by ``attach(..., witnesses=True)``).

    Args:
        optimizer: the Opacus ``DPOptimizer``.
        dataset_size: N, the number of records the loader samples from
            (``len(data_loader.dataset)``); ``None`` turns the sampling
            witness off.
        noise: run the noise witness (False on a DDP rank other than 0,
            which adds no noise).
        shard_loader: under DDP, the rank's data loader: if its batch sampler
            is Opacus' ``DistributedUniformWithReplacementSampler``, the
            sampling witness tests the sizes it yields (zero-truncated
            Binomial(n, q) draws from the rank's shard of n records,
            integrations/_shard.py); ``dataset_size`` is then ignored.

    Attributes:
        active: the names of the witnesses that run.
        steps: real steps checked so far (the sampling tests run at each).
        noise_checks: noise tests run so far (the j-th spends the level α_j).
    """

    # Defaults of the state the noise pass reads (every instance sets its own in __init__;
    # a bare instance, Witnesses.__new__, measures with the noise witness on)
    active: tuple[str, ...] = ("noise", "clipping")
    _zprev: tuple[int, float] | None = None
    _synced: tuple[int, list[float]] | None = None
    _charged = math.nan  # the σ (noise witness on) or C of the step being checked (wr)
    _inclusion_tests = 0  # per-record tests run on loaders followed away from (follow)
    _allocation_tests = 0  # random-allocation epochs tested on samplers followed away from

    def __init__(self, optimizer: Any, dataset_size: int | None,
                 false_alarm: float | None = None, loader: Any = None,
                 allocation: Any = None, noise: bool = True, shard_loader: Any = None,
                 together: bool = False) -> None:
        self.optimizer = optimizer
        self.false_alarm = FALSE_ALARM if false_alarm is None else false_alarm
        # the level of each sampling test; under DDP every rank runs its own, so each spends
        # α/W (W ranks): over all ranks they still spend α each (docs/theory.md §16.1)
        self._sampling_alarm = self.false_alarm
        self._shard_sampler = None if shard_loader is None else ShardDraws.sampler_of(shard_loader)
        self.shard: ShardDraws | None = None
        if self._shard_sampler is not None:
            dataset_size = int(self._shard_sampler.num_samples)  # n, this rank's shard
            self._sampling_alarm = self.false_alarm / int(self._shard_sampler.num_replicas)
        elif shard_loader is not None:
            dataset_size = None
        self.dataset_size = dataset_size
        try:
            from opacus.optimizers import DPOptimizerFastGradientClipping
        except ImportError:  # an Opacus without ghost clipping
            self.ghost = False
        else:
            self.ghost = isinstance(optimizer, DPOptimizerFastGradientClipping)
        # noise=False: a DDP rank other than 0, where Opacus adds no noise (the clipped-sum
        # bound still runs there)
        self.active = (("noise",) if noise else ()) + ("clipping",) + (
            ("sampling",) if dataset_size else ())
        self.steps = 0
        # the clipping bound the step is charged at (set by attach before check(): C′ where
        # the records were clipped above the noise's C, docs/theory.md §14.7); None: read
        # the optimizer's max_grad_norm
        self.charged_bound: float | None = None
        self.failure: PipelineMismatchError | None = None
        # under DDP (together=True) a clipping refusal, found inside Opacus' per-micro-batch
        # clip before the step's collective, is held until check(), which runs inside it
        # (Coordinator.check_together): raised at once, it left the other ranks waiting there
        self.together = together
        self._pending: PipelineMismatchError | None = None
        self._records = 0  # records in the micro-batches since the last real step
        self._segment_q: float | None = None
        self._segment_k = 0
        self._segment_n = 0
        self._pair: tuple[int, int] | None = None  # (draws, size) of the first step of a pair
        self._pairs = 0
        self._ties = 0
        self._tie_rate = 0.0
        self._tie_draws = 0  # n of the current series of pairs
        self._safe_ties = -1  # a tie count whose upper tail is known to be > every later α_t
        self._anchor: tuple[int, int, float, int, float] | None = None  # see _covered
        self._counter: Any = None  # the loader's MicroBatchCounter: the sizes it drew
        self._wrapped: tuple[str, Any] | None = None
        self._cuts: dict[Any, float] = {}
        self._zprev: tuple[int, float] | None = None  # (row of the last ẑ, its ‖a‖ + s‖g‖)
        self._norms_high: tuple[float, float] | None = None  # _measure's bounds on ‖a‖, ‖g‖
        self._buf: _Layout | None = None  # _measure's buffers
        self._synced: tuple[int, list[float]] | None = None  # (ẑ's row, ‖ẑ_p‖…, ‖D̂‖): _measure
        # The float tolerance of the clipping checks is the coarsest floating dtype among the
        # step's tensors (review rw: the first parameter's alone was too tight for a bf16 one
        # after an fp32 one), read at each step (wr: fixed here at attach, it no longer
        # matched the gradients after model.half(), .to(torch.bfloat16) or .double())
        self._clip_checked = False
        self._coins = random.Random()  # the check schedule: OS entropy, independent of the data
        self.noise_checks = 0  # noise tests run: the j of the level α_j the j-th one spends
        self._loader = loader  # a Poisson-charged loader: its draws are counted per record
        self.inclusion: InclusionCounts | None = None
        self._allocation_sampler = allocation  # a random-allocation sampler: tested per epoch
        self.allocation: AllocationEpochs | None = None

    # ------------------------------------------------------------ install
    def install(self, counter: Any = None) -> None:
        """Wrap the optimizer's per-micro-batch clipping (an instance attribute; undone by uninstall).

        ``counter``: the handle's :class:`~privguard.integrations._describe.MicroBatchCounter`
        on the data loader; it then records each micro-batch's size for the sampling witness.
        """
        if self._shard_sampler is not None:
            try:
                self.shard = ShardDraws(self._shard_sampler)
            except (TypeError, AttributeError):  # a fixed class: no sampling witness
                self.active = tuple(a for a in self.active if a != "sampling")
        elif counter is not None and "sampling" in self.active:
            counter.sizes = []
            self._counter = counter
        name = "accumulate" if self.ghost else "clip_and_accumulate"
        own = vars(self.optimizer).get(name)
        original = getattr(self.optimizer, name)
        wrapper = self._ghost_accumulate if self.ghost else self._clip_and_accumulate
        self._original = original
        self._wrapped = (name, own)
        setattr(self.optimizer, name, wrapper)
        if "sampling" in self.active and self._loader is not None and self.shard is None:
            self.inclusion = InclusionCounts.for_loader(self._loader, self.dataset_size)
        if self.dataset_size and self._allocation_sampler is not None:
            try:
                self.allocation = AllocationEpochs(self._allocation_sampler, self.dataset_size)
            except (TypeError, AttributeError):  # a fixed class: not witnessed
                self.allocation = None

    def follow(self, loader: Any, counter: Any = None) -> None:
        """Watch ``loader`` from now on: a framework rebuilt the training loader (Lightning's
        ``reload_dataloaders_every_n_epochs``, integrations/lightning.py). Review lr.

        The sampling witness takes the new loader's dataset size N (the batch-size tests: each
        step's draws are Binomial(N·k, q) with the N in force, and a sum of independent
        binomials at one q is Binomial(Σ N·k, q), so a stretch of constant q goes on), its
        micro-batch counter (``counter``, the sizes it draws) and its batch sampler (the
        per-record counts begin anew over the new N). Every test keeps its index, so the
        levels α_j go on where they were: over the run each test still spends Σ_j α_j ≤ α
        (docs/theory.md §16.2), however often the loader is rebuilt.

        Raises:
            InvalidArgumentError: the sampling witness cannot follow (under DDP, where it
                watches the rank's shard; a loader without a sized dataset); nothing is
                changed then.
        """
        if "sampling" not in self.active or loader is self._loader:
            return
        if loader is None:
            raise InvalidArgumentError(
                "train_dataloader", "several loaders",
                "replace the single training loader the sampling witness watched "
                "(witnesses=True): a batch of several loaders is not one Binomial(N, q) draw; "
                "keep one training loader")
        if self._shard_sampler is not None or self.together:
            raise InvalidArgumentError(
                "train_dataloader", type(loader).__name__,
                "was rebuilt under DDP with witnesses=True: the sampling witness tests the "
                "shard of the loader given at attach and does not follow a rebuilt one; keep "
                "the training loader (no reload_dataloaders_every_n_epochs)")
        try:
            size = len(loader.dataset)
        except (TypeError, AttributeError):
            size = 0
        if not (isinstance(size, int) and size > 0):
            raise InvalidArgumentError(
                "train_dataloader", type(loader).__name__,
                "was rebuilt without a dataset of known size: the sampling witness tests each "
                "step's batch against Binomial(N, q) and needs N; keep a sized dataset")
        if self._counter is not None:
            self._counter.sizes = None  # the old loader's counter records nothing more
        self._counter = None
        if counter is not None:
            counter.sizes = []
            self._counter = counter
        self.dataset_size = size
        self._loader = loader
        installed = self._wrapped is not None
        # the per-record counts (a Poisson loader) or the epochs (random allocation) on the new
        # batch sampler, their test index carried over (None: a fixed sampler class)
        if self.inclusion is not None:
            self._inclusion_tests = self.inclusion.tests
            self.inclusion.restore()
            self.inclusion = None
        if self.allocation is not None:
            self._allocation_tests = self.allocation.tests
            self.allocation.restore()
            self.allocation = None
        if self._allocation_sampler is not None:
            self._allocation_sampler = getattr(loader, "batch_sampler", None)
            if installed:
                try:
                    self.allocation = AllocationEpochs(self._allocation_sampler, size)
                except (TypeError, AttributeError):  # a fixed class: not witnessed
                    self.allocation = None
                else:
                    self.allocation.tests = self._allocation_tests
        elif installed:
            self.inclusion = InclusionCounts.for_loader(loader, size)
            if self.inclusion is not None:
                self.inclusion.tests = self._inclusion_tests

    def uninstall(self) -> None:
        if self.shard is not None:
            self.shard.restore()
            self.shard = None
        if self.inclusion is not None:
            self.inclusion.restore()
            self.inclusion = None
        if self.allocation is not None:
            self.allocation.restore()
            self.allocation = None
        if self._wrapped is None:
            return
        name, own = self._wrapped
        if own is None:
            vars(self.optimizer).pop(name, None)
        else:
            setattr(self.optimizer, name, own)
        self._wrapped = None

    def _fail(self, error: PipelineMismatchError) -> None:
        self.failure = error
        raise error

    def _refuse_micro_batch(self, error: PipelineMismatchError) -> None:
        """A clipping refusal: raised at once, or under DDP held for :meth:`check` (review rt).

        Held, the step goes on to the hook, where :meth:`check` raises it inside the step's
        collective, before any charge or update on any rank; nothing of the step is
        released meanwhile (the update follows the hook)."""
        if not self.together:
            self._fail(error)
        elif self._pending is None:
            self._pending = error

    # ------------------------------------------------------------ clipping
    @_without_locals
    def _clip_and_accumulate(self) -> None:
        opt = self.optimizer
        if self.failure is not None:
            raise self.failure
        first = _first_param(opt)  # opt.params[0] without building the list (every step)
        batch = 0 if first is None else len(opt._get_flat_grad_sample(first))
        self._records += batch
        # The exact per-sample check costs as much as Opacus' own norms: it runs on the
        # handle's first micro-batch and then on each with probability CLIP_CHECK_RATE,
        # drawn from the witnesses' own generator (not torch's: the user's stream is
        # untouched). It never alarms on a correct clip, so the schedule costs no privacy.
        if batch == 0 or (self._clip_checked and self._coins.random() >= CLIP_CHECK_RATE):
            self._original()
            return
        self._clip_checked = True
        params = opt.params
        before = [None if p.summed_grad is None else p.summed_grad.detach().clone()
                  for p in params]
        samples = [opt._get_flat_grad_sample(p).detach().reshape(batch, -1) for p in params]
        self._original()
        per_layer = hasattr(opt, "max_grad_norms")  # DPPerLayerOptimizer: one C_l per layer
        # per-layer: the bound the layers were clipped at now, as the charge records it
        # (_skips._bound: ‖max_grad_norms‖, the hooks' bounds; task lo3), not max_grad_norm
        c = _skips._bound(opt) if per_layer else float(opt.max_grad_norm)
        norms = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, dim=1) for g in samples], dim=1), dim=1)
        # clip_C(g) = g·min(1, C/‖g‖) (Abadi et al. 2016, Alg. 1): recomputed here, not read
        factor = (c / norms.clamp_min(1e-30)).clamp_(max=1.0)
        got = [p.summed_grad.detach().reshape(-1) if prior is None
               else (p.summed_grad.detach() - prior).reshape(-1)
               for p, prior in zip(params, before, strict=True)]
        bound = norms.clamp(max=c).sum().to(torch.float64)
        eps = coarsest_eps(g.dtype for g in samples)
        # float32 sums of squares err by ≤ γ_{d+1} relatively (any order; Higham 2002,
        # §3.1): at most doubling a correct clip's tiny deviation while d·eps < 1/2, which
        # the tolerance below leaves room for; above that, accumulate in float64.
        acc = torch.float64 if sum(g.shape[1] for g in samples) * eps >= 0.5 else None
        if per_layer:
            # per-layer clipping to C_l with Σ C_l² = C²: each contribution's norm is at most
            # min(‖g_i‖, C), so ‖Σ clipped‖ ≤ Σ min(‖g_i‖, C) (the triangle inequality)
            parts = torch._foreach_norm(got, 2, dtype=acc)
        else:
            expected = [factor.to(g.dtype) @ g for g in samples]
            parts = torch._foreach_norm(torch._foreach_sub(got, expected), 2, dtype=acc)
        size, bound_norm = torch.stack([torch.linalg.vector_norm(torch.stack(parts)).double(),
                                        bound]).tolist()  # the one sync of this check
        # float tolerance: summation/product rounding ≤ γ_B·Σ‖clipped‖ (Higham 2002, §3.1)
        # plus Opacus' 1e-6 stabiliser, ≤ 1e-6 per record; 1e-3 relative is far above both.
        # The stabiliser moves a record by ≤ min(C, 1e-6) (_stabiliser): an absolute 1e-5 per
        # record alone passed clipping turned off at C ≲ 10⁻⁶ (wr)
        tolerance = (1e-3 + 4.0 * batch * eps) * bound_norm + _stabiliser(c) * batch
        deviation = max(0.0, size - bound_norm) if per_layer else size
        if not math.isfinite(size + bound_norm):  # wr: a NaN deviation passed "> tolerance"
            self._refuse_micro_batch(self._clip_unmeasurable(c, batch, ""))
        elif deviation > tolerance:
            self._refuse_micro_batch(PipelineMismatchError(
                f"clipping witness: the clipped sum of this micro-batch of {batch} records is "
                f"{deviation:.4g} away (in L2 norm) from the per-sample gradients clipped to the "
                f"charged C = {_exact(c)} (tolerance {_up(tolerance, '.3g')}): contributions "
                "above C reached "
                "the sum, and the charge assumes each record moves the sum by at most C (no "
                "per-sample norm is reported: it is a record's data). Nothing was "
                "charged or applied",
                witness="clipping", charged=c, measured=deviation, interval=None,
                step=self.steps + 1))

    def _clip_unmeasurable(self, c: float, batch: int, mode: str) -> PipelineMismatchError:
        """The refusal of a micro-batch whose clipping cannot be checked (wr): a per-sample
        gradient, norm or the clipped sum is NaN or ±inf (Opacus clips an inf per-sample
        gradient to inf·0 = NaN), and a NaN compared with the tolerance is False."""
        return PipelineMismatchError(
            f"clipping witness{mode}: the clipping of this micro-batch of {batch} records "
            f"cannot be checked at the charged C = {_exact(c)}: a per-sample gradient or the "
            "clipped sum is not finite (NaN or ±inf: a NaN or inf gradient from the model?), "
            "and a sum that is not finite is not bounded by C. Nothing was charged or applied",
            witness="clipping", charged=c, measured=math.nan, interval=None,
            step=self.steps + 1)

    @_without_locals
    def _ghost_accumulate(self) -> None:
        opt = self.optimizer
        if self.failure is not None:
            raise self.failure
        c = float(opt.max_grad_norm)
        per_param = [p._norm_sample for p in opt.params if getattr(p, "_norm_sample", None) is not None]
        batch = len(per_param[0]) if per_param else 0
        self._records += batch
        if batch:
            norms = torch.stack([n.reshape(batch) for n in per_param], dim=1).norm(2, dim=1)
            grads = [p.grad.detach() for p in opt.params if p.grad is not None]
            got, bound = torch.stack([
                torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2,
                                                                         dtype=torch.float64))),
                norms.clamp(max=c).sum().to(torch.float64)]).tolist()
            # ‖Σ_i clip_C(g_i)‖ ≤ Σ_i min(‖g_i‖, C) (triangle inequality)
            eps = coarsest_eps([norms.dtype] + [g.dtype for g in grads])  # this step's (wr)
            tolerance = (1e-3 + 4.0 * batch * eps) * bound + _stabiliser(c) * batch
            if not math.isfinite(got + bound):  # wr: a NaN norm passed "> bound + tolerance"
                self._refuse_micro_batch(self._clip_unmeasurable(c, batch, " (ghost clipping)"))
            elif got > bound + tolerance:
                self._refuse_micro_batch(PipelineMismatchError(
                    f"clipping witness (ghost clipping): the clipped sum of this micro-batch of "
                    # the norm rounded down, the bound up, 6 digits (task fp; as review rlo3's)
                    f"{batch} records has norm {_down(got, '.6g')} > Σ min(‖g_i‖, C) = "
                    f"{_up(bound, '.6g')} at the charged C = {_exact(c)}. Nothing was charged "
                    "or applied",
                    witness="clipping", charged=c, measured=got, interval=None,
                    step=self.steps + 1))
        self._original()

    # ------------------------------------------------------------ at the step
    @_without_locals
    def check(self, mechanism: Any) -> None:
        """Check the step about to be charged as ``mechanism``; raise :class:`PipelineMismatchError`.

        Called by the step hook after Opacus formed the noisy gradient and
        before the charge and the parameter update. ``mechanism`` is what the
        step is charged as: a :class:`privguard.mechanisms.SubsampledGaussian`,
        an :class:`~privguard.mechanisms.AccumulatedSubsampledGaussian` (k
        Poisson micro-batches at the loader's rate q), or, for a random
        allocation loader, the epoch's
        :class:`~privguard.mechanisms.RandomAllocation` (its sampling is
        tested once per epoch, when the epoch's batches have all been drawn:
        integrations/_inclusion.py).
        """
        if self.failure is not None:
            raise self.failure
        if self._pending is not None:  # a clipping refusal held for the collective (DDP)
            pending, self._pending = self._pending, None
            self._fail(pending)
        self.steps += 1
        records, self._records = self._records, 0
        self._check_noise(float(mechanism.noise_multiplier), records)
        rate = getattr(mechanism, "sample_rate", None)
        if "sampling" in self.active and self.allocation is not None:
            try:
                self.allocation.check(self.false_alarm, self.steps)
            except PipelineMismatchError as exc:
                self._fail(exc)
        if "sampling" in self.active and rate is not None and self.shard is not None:
            # DDP: the batches this rank's sampler yielded since the last step, each a
            # zero-truncated Binomial(n, q) draw from its shard (integrations/_shard.py)
            self._check_sampling(self.shard.take(), float(rate), 1)
        elif "sampling" in self.active and rate is not None:
            micro_batches = int(getattr(mechanism, "micro_batches", 1))
            sizes = None if self._counter is None else self._counter.sizes
            if (sizes is not None and len(sizes) == micro_batches and min(sizes) >= 0
                    and sum(sizes) == records):
                # each micro-batch the loader drew, its records those the clipping saw (the
                # batch dimension is the first): its own Binomial(N, q) draw
                self._check_sampling(sizes, float(rate), 1)
            else:  # the step's records (BatchMemoryManager's physical batches, no counter)
                self._check_sampling((records,), float(rate), micro_batches)
            if self.inclusion is not None:  # once per expected epoch of draws
                try:
                    self.inclusion.check(float(rate), self.false_alarm, self.steps)
                except PipelineMismatchError as exc:
                    self._fail(exc)

    def _check_noise(self, sigma: float, records: int) -> None:
        opt = self.optimizer
        # the bound the step is charged at: the charged σ times it is the noise's std σ·C,
        # and every record moved the clipped sum by at most it (task lo3: max_grad_norm
        # alone failed a per-layer step whose list was raised between backward and step)
        c = float(opt.max_grad_norm) if self.charged_bound is None else self.charged_bound
        if sigma <= 0 or c < 0:
            return  # nothing to compare (a σ = 0 charge is refused by the ledger itself)
        # C = 0 (wr): no noise to test, but the step is measured: a NaN in it (a NaN or inf
        # gradient times a clip factor of 0) passed unrefused, and the clipped sum must be 0
        scale = 1.0
        if opt.loss_reduction == "mean":
            scale = float(opt.expected_batch_size * opt.accumulated_iterations)
        self._charged = sigma if "noise" in self.active else c
        measured = self._measure(scale)
        if measured is None:
            return
        z_high, sum_high, z_norm, d = measured
        self._check_clipped_sum(sum_high, records, c)
        if "noise" not in self.active or c == 0:
            return
        self._check_precision(sigma, c, scale, d)
        self.noise_checks += 1  # the j-th noise test spends α_j: Σ_j α_j ≤ α over the run
        sd = sigma * c
        stat = z_high * z_high / (sd * sd)
        # above the χ²_d quantile at the largest level spent, no test alarms here
        if stat <= self._noise_cut(d):
            alpha = level(self.noise_checks, self.false_alarm)
            tail = _chi2_lower_tail(stat, d)
            if tail <= alpha:
                self._fail_noise(sigma, c, z_norm, d, tail, alpha, "")
        self._check_parameter_noise(sigma, c, scale)

    def _check_precision(self, sigma: float, c: float, scale: float, d: int) -> None:
        """Refuse a step whose gradients' dtype cannot hold the charged noise (wr).

        The noise statistics bound the noise drawn, Z, within Opacus' own rounding of
        g = fl(fl(a + Z)/s): ‖Z − z‖ ≤ 4u_p·s‖g‖ (review sb; the total test too since wr).
        Where u_p·s‖g‖ ≥ σC√d (the unit roundoff at the gradient's magnitude is, in RMS over
        the coordinates, at least the charged noise's σC) that allowance alone is 4× the
        noise's expected norm: the tests can no longer see noise that the rounding removed
        (bfloat16: the 42-coordinate model of docs/theory.md §16.1, *Low precision*, whose
        ẑ = 0 the total test refused before it bounded the noise drawn), and the stored
        clipped sum's own rounding, u_p·|a_j| per coordinate, moves it by as much as the
        noise, so its sensitivity is not C: the step is not the charged mechanism in floating
        point. Deterministic given the step; it needs ‖a‖ ≳ σC√d/u_p, over 10⁷·σC√d in
        float32 (a correct float32 run never meets it), 256·σC√d in bfloat16. No number
        derived from the gradient is reported.
        """
        assert self._buf is not None and self._norms_high is not None
        lay = self._buf
        sd = sigma * c
        # (σC)² underflows float64: the statistics divide by it (wr); or (task lo4) a float64
        # step's squares' underflow allowance, (1 + s)·√(d·2⁻¹⁰²⁰) (_Layout), is ≥ σC√d/16,
        # so that it could pass a step without noise: σC ≲ 4.8·10⁻¹⁵³·(1 + s). A function of
        # σ, C, s and the dtype only
        # Review rlo4: and where that allowance alone passes a step without noise. The 16×
        # rule keeps its share of the statistic at d/256 or less, which χ²_d's quantile at α_j
        # is below for small d (α = 10⁻¹⁰: d < 10): a float64 step with no noise at all passed
        # at σC up to ~10⁻¹⁴³ (d = 1, s = 64; 5·10⁻¹⁵⁰ at d = 4), which main refused (its
        # statistic ~0). A step without noise reads at most `under` here from the squares' underflow
        # (√ of ‖ẑ‖²'s error, (1 + s)·√(d·2⁻¹⁰²¹), plus the allowance (1 + s)·√(d·2⁻¹⁰²⁰)):
        # refused, not charged, unless that still alarms the test; a function of σ, C, s, d,
        # the dtype and the step's level α_j only
        under = 2.0 * (1.0 + scale) * lay.squares_total * (1.0 + 2.0 ** -40)
        blind = False
        if under > 0.0 and sd * sd > 0.0:
            x = under * under / (sd * sd)
            alpha = level(self.noise_checks + 1, self.false_alarm)
            # P(χ²_d ≤ x) ≤ P(χ²_1 ≤ x) ≤ √x: an ordinary float64 step (√x ~ 10⁻¹⁵⁰) makes
            # no scipy call here
            if math.sqrt(x) > alpha:
                blind = not (x <= self._noise_cut(d) and _chi2_lower_tail(x, d) <= alpha)
        if blind or not (sd * sd > 0.0
                         and sd * math.sqrt(d) > 16.0 * (1.0 + scale) * lay.squares_total):
            self._fail(PipelineMismatchError(
                f"noise witness: the charged noise σ·C = {_exact(sd)} per coordinate (σ = "
                f"{_exact(sigma)}, C = {_exact(c)}) is too small to be measured in float64 ((σC)² "
                "underflows, or the squares of float64 gradients of its size do). Nothing was "
                "charged or applied",
                witness="noise", charged=sigma, measured=math.nan, interval=None,
                step=self.steps))
        # Review rwl: the total statistic's allowance E = 4u_p·s‖g‖ (wr, _measure) alone
        # passes a step with no noise at all (z = 0, statistic ≥ E) once E² ≥ (σC)²·χ²_d's
        # quantile at α_j: wr refused only from E ≥ 4σC√d (u_p·s‖g‖ ≥ σC√d), and a bfloat16
        # or float16 step without noise in between passed, where main's statistic (without
        # E) refused it. Refused now where E ≥ σC√d/16 and E alone passes a step without
        # noise (E²/(σC)² above χ²_d's quantile at α_j) while the float64 widening alone,
        # W = √g_d·s‖g‖ (main's statistic of a step without noise), would not: the noise
        # test can then not see the noise's absence because of the dtype. (A model of a few
        # coordinates, whose quantile is ≈ 0, has a test that W alone blinds: not refused
        # here, as main passed it too.) Every number is a function of g and of d, σ, C, α_j.
        # wr's bound, E ≥ 4σC√d, is kept as it was. In float32 E ≥ σC√d/16 needs s‖g‖ ≥
        # 2.6·10⁵σC√d: never on a correct run; bfloat16 at d = 1,474 from s‖g‖ ≈ 2,170σC
        allowance = (4.0 * lay.unit_max * scale * self._norms_high[1]
                     + (1.0 + scale) * lay.tiny_total) * (1.0 + 2.0 ** -40)
        if allowance * 16.0 < sd * math.sqrt(d):
            return
        if lay.unit_max * scale * self._norms_high[1] < sd * math.sqrt(d):  # wr's bound
            alpha = level(self.noise_checks + 1, self.false_alarm)
            x = allowance * allowance / (sd * sd)
            if x <= self._noise_cut(d) and _chi2_lower_tail(x, d) <= alpha:
                return  # a step without noise would still alarm the total test
            widening = math.sqrt(lay.gamma) * scale * self._norms_high[1]
            w = widening * widening / (sd * sd)
            if w > self._noise_cut(d) or _chi2_lower_tail(w, d) > alpha:
                return  # blind without the dtype's allowance too (main passed it)
        # Review rwl: this decision is a function of the data (a bfloat16 pipeline whose
        # records' gradients align is refused, its neighbour whose gradients cancel is not),
        # not bounded in probability as Proposition 16.1 needs: the hook charges the step
        # before raising it (step_charged), so that it is a post-processing of the step's
        # release, g (docs/theory.md §16.2, *What a refusal is a function of*)
        error = PipelineMismatchError(
            f"noise witness: the step is charged with noise σ·C = {_exact(sd)} per coordinate "
            f"(σ = {_exact(sigma)}, C = {_exact(c)}), but this step's gradients, in {lay.coarsest}, "
            f"cannot hold it: the dtype's rounding at the gradient's magnitude is so large "
            f"against the charged noise over its {d} coordinates that the noise test could not "
            "tell this step from one without noise (rounding the noisy gradient can remove "
            "the noise, and rounding the clipped sum moves it by a sizeable share of the "
            "noise). Compute the gradients in a finer dtype "
            "(float32). This refusal depends on the noisy gradient, so the step was charged "
            "(it is not applied)",
            witness="noise", charged=sigma, measured=math.nan, interval=None, step=self.steps)
        error.step_charged = True
        self._fail(error)

    def _fail_noise(self, sigma: float, c: float, z_norm: float, d: int, tail: float,
                    alpha: float, where: str) -> None:
        sd = sigma * c
        # σ_applied = ‖Z‖/(C·√χ²_d): a 95% interval from the χ²_d quantiles
        sq = z_norm * z_norm
        a = (1.0 - CONFIDENCE) / 2.0
        lo = math.sqrt(sq / _chi2_quantile(1.0 - a, d)) / c
        hi = math.sqrt(sq / _chi2_quantile(a, d)) / c
        estimate = math.sqrt(sq / d) / c
        self._fail(PipelineMismatchError(
            f"noise witness: the step is charged with noise multiplier σ = {_exact(sigma)} "
            f"(noise std σ·C = {_exact(sd)} per coordinate at C = {_exact(c)}), but the noise "
            f"added to this step's {d} coordinates{where} has σ ≈ {estimate:.4g} (an estimate; "
            f"95% interval [{_down(lo, '.4g')}, {_up(hi, '.4g')}]); P(this little noise | σ "
            f"charged) = {_up(tail, '.3g')} ≤ {_up(alpha, '.3g')}, the level "
            f"spent by noise test {self.noise_checks} (step {self.steps}). Nothing was charged "
            "or applied",
            witness="noise", charged=sigma, measured=estimate, interval=(lo, hi),
            step=self.steps))

    def _measure(self, scale: float) -> tuple[float, float, float, int] | None:
        """(upper bound on ‖Z‖, upper bound on ‖summed_grad‖, computed ‖Z‖, d) for this step.

        Z = grad·s − summed_grad over every parameter with both. The clipped sum
        and the gradient are copied (one fused ``_foreach_copy_``, exact) into
        the two rows of a float64 buffer allocated once (:meth:`_buffer`), and
        one product of the buffer with its transpose gives their Gram matrix
        (‖a‖², ⟨a, g⟩, ‖g‖²). ‖Z‖² = ‖a‖² − 2s⟨a, g⟩ + s²‖g‖²,
        and both bounds are never below the exact norms of the same float
        tensors (docs/theory.md §16.2; None: no parameter has a noisy gradient).

        Where the noise witness runs, the same pass also forms ẑ = a − s·g and its
        difference from the previous step's, and their norms per parameter (what
        :meth:`_noise_parts` reads): every number of the step's noise tests comes back
        in one host sync (task t28), into views allocated with the buffer (no indexing,
        no allocation but the norms' own results).
        """
        grads, summed = [], []
        for p in self.optimizer.params:
            g, a = p.grad, p.summed_grad
            if g is not None and a is not None:  # Opacus' tensors, outside autograd
                grads.append(g)
                summed.append(a)
        if not grads:
            return None
        lay = self._buffer(grads, summed)
        if _FOREACH_COPY is not None:
            _FOREACH_COPY(lay.targets, summed + grads)
        else:  # torch < 2.1: one copy per tensor
            for target, source in zip(lay.targets, summed + grads, strict=True):
                target.copy_(source)
        d = lay.d
        if d == 0:  # only empty parameters: no noise to test (χ²_0's tail is NaN: review rw)
            return None
        cur = -1
        if "noise" in self.active:
            # rows 0 and 1 of lay.z hold ẑ of this step and of the previous one, alternately
            cur = 0 if self._zprev is None else 1 - self._zprev[0]
            torch.sub(lay.a, lay.g, alpha=scale, out=lay.z_rows[cur])  # ẑ = a − s·g, float64
        # The Gram matrix of the rows (a = summed_grad, g = grad), in float64, beside the
        # norms below in one float64 vector: the one sync
        torch.mm(lay.buf, lay.buf_t, out=lay.gram)
        if cur >= 0:
            if self._zprev is None:
                tensors, out = lay.z_parts[cur], lay.part_norms
            else:
                # ẑ_t − ẑ_{t−1} into a's row, read by the two kernels above first (stream
                # order), not over ẑ_{t−1}: a check stopped before _noise_parts commits ẑ_t
                # (an interrupt at the sync below) left that row holding the difference, and
                # the next step's repeat test compared with it, not ẑ_{t−1} (review ry)
                torch.sub(lay.z_rows[cur], lay.z_rows[1 - cur], out=lay.a)
                tensors, out = lay.z_parts_diff[cur], lay.part_norms_diff
            torch.stack(torch._foreach_norm(tensors, 2), out=out)
        values = lay.out.tolist()
        aa, ag, _, gg = values[:4]
        self._synced = (cur, values[4:]) if cur >= 0 else None
        # −Z = a − s·g (DPOptimizer.add_noise then scale_grad): ‖Z‖² = ‖a‖² − 2s⟨a, g⟩ + s²‖g‖²
        # in exact arithmetic on the stored values (the copy to float64 is exact).
        z_sq = aa - 2.0 * scale * ag + scale * scale * gg
        # Each Gram entry errs by ≤ γ_d·Σ|x_i·y_i| ≤ γ_d·‖x‖·‖y‖ in any summation order, with or
        # without FMA (Higham 2002, eq. 3.5; Cauchy–Schwarz), so the exact value of the line
        # above differs from ‖Z‖² by ≤ γ_d·(‖a‖ + s‖g‖)² ≤ γ_d·r/(1 − γ_d), r = (√aa + s√gg)²
        # computed, and its float64 evaluation by ≤ 6u·(aa + 2s|ag| + s²gg) ≤ 6u·r·(1+γ_d)/
        # (1−γ_d). gamma = gram_widening(d) covers both, r's own rounding and the rounding
        # of the sum below; the factor 1 + 2⁻⁴⁰ covers the square roots' (docs/theory.md §16.2).
        gamma = lay.gamma
        root_a, root_g = math.sqrt(max(aa, 0.0)), math.sqrt(max(gg, 0.0))
        r = (root_a + scale * root_g) ** 2
        up = 1.0 + 2.0 ** -40
        # (task lo4: plus the float64 squares' underflow, lay.squares_total, _Layout)
        floor = lay.squares_total * lay.squares_total
        sum_high = math.sqrt((max(aa, 0.0) + floor) / (1.0 - gamma)) * up
        # upper bounds on ‖a‖ and ‖g‖ (each Gram diagonal entry within a relative γ_d): the
        # per-parameter and repeat tests' rounding allowances (_noise_parts) use them
        g_high = math.sqrt((max(gg, 0.0) + floor) / (1.0 - gamma)) * up
        # wr: the bound above is on ‖z‖, z = s·g − a the noise's trace on the stored values;
        # the noise drawn is Z = z within Opacus' own rounding of g = fl(fl(a + Z)/s) in the
        # gradient's dtype, ‖Z − z‖ ≤ 4u_p·s‖g‖ (u_p ≤ the coarsest unit roundoff; review sb,
        # _noise_parts), so ‖Z‖ ≤ ‖z‖ + 4u_p·s‖g‖ (docs/theory.md §16.1, *Opacus' own
        # rounding*): without this term the total test alarmed up to ~1.3× (d = 1, float32)
        # more often than its level on correct steps of tiny models
        z_high = (math.sqrt(max(z_sq + gamma * r, 0.0)) + 4.0 * lay.unit_max * scale * g_high
                  + (1.0 + scale) * lay.tiny_total) * up  # + the subnormal term (review rwl)
        # (values[4:] are checked by _noise_parts: on a rank without the noise witness, and
        # the repeat slot at a first step, they are not written this step)
        if not all(map(math.isfinite, [*values[:4], z_high, sum_high])):
            self._unmeasurable(values[:4])
        self._norms_high = (sum_high, g_high)
        return z_high, sum_high, math.sqrt(max(z_sq, 0.0)), d

    def _unmeasurable(self, values: list[float] | None) -> None:
        """Refuse a step whose noise and clipped sum cannot be measured (wr): a NaN or ±inf in
        the clipped sum or the noisy gradient (a NaN or inf gradient from the model reaches
        both: Opacus clips an inf per-sample gradient to inf·0 = NaN), or a float64 overflow
        of the Gram product or of the statistics (float64 entries ≳ 10¹⁵⁴).

        A NaN compared with a threshold is False, so every test passed such a step
        silently: the noise test (a NaN statistic is not below the cut), the clipped-sum
        bound, the per-parameter and repeat tests. A clipped sum that is not finite was not
        bounded by C, and a noise that cannot be measured is not known to be there: fail
        closed (nothing charged or applied). The message names which of the two is not
        finite, never a value.
        """
        aa, gg = (0.0, 0.0) if values is None else (values[0], values[3])
        what = [name for name, x in (("the clipped sum (summed_grad)", aa),
                                     ("the noisy gradient (grad)", gg)) if not math.isfinite(x)]
        why = (f"{' and '.join(what)} of this step {'are' if len(what) > 1 else 'is'} not "
               "finite (NaN or ±inf: a NaN or inf gradient from the model?)" if what else
               "its float64 statistics overflow (entries ≳ 1e154)")
        witness = "noise" if "noise" in self.active else "clipping"
        self._fail(PipelineMismatchError(
            f"{witness} witness: this step's noise and clipped sum cannot be measured: {why}. "
            "A clipped sum that is not finite is not bounded by C, and noise that cannot be "
            "measured is not known to be there. Nothing was charged or applied",
            witness=witness, charged=self._charged, measured=math.nan, interval=None,
            step=getattr(self, "steps", 0)))

    def _check_parameter_noise(self, sigma: float, c: float, scale: float) -> None:
        """The noise test of each parameter alone (review rt), after :meth:`_measure`.

        A step whose noise misses one parameter releases that parameter's clipped sum
        exactly (ε unbounded), while the total ‖Z‖² over all d coordinates barely moves
        when the parameter is small. Under the charge, Z_p ~ N(0, (σC)² I_{d_p}) for each
        of the P parameters with a noisy gradient, so ‖Z_p‖²/(σC)² ~ χ²_{d_p} exactly; the
        j-th noise test checks each at level α_j/P (union bound: ≤ α_j a step, ≤ α over
        the run, the budget of this statistical witness). Like the total test it is a
        function of the noise alone. ẑ = a − s·g is formed in float64 from the buffer's
        exact copies: |ẑ_j − z_j| ≤ 3u(|a_j| + s|g_j|) (two roundings, u = 2⁻⁵³), so
        ‖z_p‖ ≤ ‖ẑ_p‖ + 3u·R with R ≥ ‖a‖ + s‖g‖ from :meth:`_measure`'s Gram bounds, ‖ẑ_p‖
        computed within a relative g_{d_p} (:func:`gram_widening`): the statistic is never
        below the exact one; plus 4u_p·s‖g‖ for Opacus' own rounding of a + Z in the
        gradient's dtype (review sb: the noise drawn, not its rounded trace, is χ²). One
        parameter alone (P = 1) is the total test already. A parameter of 1 or 2 float32
        coordinates with no noise at all can still pass (its rounding residue, u·‖a_p‖, is
        not small enough against χ²_{d_p}'s lower tail at the level).
        """
        bounds, repeat = self._noise_parts(scale)
        sd = sigma * c
        if repeat is not None:
            self._check_repeat(sigma, c, repeat, buf_d=sum(b[1] for b in bounds))
        if len(bounds) < 2:
            return
        alpha = level(self.noise_checks, self.false_alarm) / len(bounds)
        cut_level = level(1, self.false_alarm) / len(bounds)  # this test's largest level
        for i, d_p, z_high, z_norm in bounds:
            stat = z_high * z_high / (sd * sd)
            if stat > self._noise_cut(d_p, cut_level):
                continue  # above the χ²_{d_p} quantile at α₁/P: no test alarms here
            tail = _chi2_lower_tail(stat, d_p)
            if tail <= alpha:
                self._fail_noise(sigma, c, z_norm, d_p, tail, alpha,
                                 f" of parameter {i} of the {len(bounds)} with a noisy gradient "
                                 f"(tested alone at level α_j/{len(bounds)})")

    def _check_repeat(self, sigma: float, c: float, repeat: tuple[float, float],
                      buf_d: int) -> None:
        """The noise against the previous step's (review rt): ‖Z_t − Z_{t−1}‖²/(σ_tC)².

        Given everything before step t (Z_{t−1} included), Z_t ~ N(0, (σ_tC)² I_d), and a
        centred Gaussian puts the most mass on balls around its centre (Anderson 1955): for
        any fixed z, P(‖Z_t − z‖ ≤ r) ≤ P(‖Z_t‖ ≤ r). So the lower tail of χ²_d at the
        statistic is ≤ α_j with probability ≤ α_j, whatever the history and the data: the
        j-th test spends α_j (a sixth statistical witness). Noise repeated from one step to
        the next (a generator reseeded before every step) gives ‖Z_t − Z_{t−1}‖ ≈ 0: the
        difference of two updates releases that of the clipped sums with no noise.
        """
        high, computed = repeat
        sd = sigma * c
        stat = high * high / (sd * sd)
        if stat > self._noise_cut(buf_d):
            return  # above the χ²_d quantile at the largest level: no test alarms here
        alpha = level(self.noise_checks, self.false_alarm)
        tail = _chi2_lower_tail(stat, buf_d)
        if tail <= alpha:
            self._fail_noise(sigma, c, computed, buf_d, tail, alpha,
                             " minus the previous step's noise (the same noise again?)")

    def _noise_parts(self, scale: float) -> tuple[list[tuple[int, int, float, float]],
                                                   tuple[float, float] | None]:
        """Per parameter (position, d_p, upper bound on ‖Z_p‖, computed ‖Z_p‖), for each
        non-empty parameter of the buffer :meth:`_measure` filled; and (upper bound on
        ‖Z_t − Z_{t−1}‖, computed value), None at the first step or after the parameters
        changed (docs/theory.md §16.2, review rt). No device work: the norms are those
        :meth:`_measure` computed in its pass and brought back with the Gram product (one
        sync a step, task t28); the norms of a and g are its Gram bounds, not computed per
        parameter again."""
        assert self._buf is not None and self._norms_high is not None
        assert self._synced is not None, "_measure runs first, with the noise witness on"
        lay = self._buf
        cur, norms = self._synced
        self._synced = None  # each pass's norms are read once
        u, up = 2.0 ** -53, 1.0 + 2.0 ** -40
        # R ≥ ‖a‖ + s‖g‖ ≥ ‖(|a| + s|g|)_p‖ for every parameter p (triangle inequality), from
        # _measure's upper bounds on ‖a‖ and ‖g‖
        a_high, g_high = self._norms_high
        reach = (a_high + scale * g_high) * up
        # Review sb: z = s·g − a is the noise drawn, Z, only up to Opacus' own rounding in the
        # gradient's dtype: g = fl(fl(a + Z)/fl(s)) (add_noise, scale_grad: three roundings of
        # unit roundoff ≤ u_p, the sum, s cast to that dtype (a non-integer expected batch size
        # under DDP) and the quotient), so |z_j − Z_j| ≤ ((1+u_p)³ − 1)/(1−u_p)³·s|g_j|
        # ≤ 4u_p·s|g_j| for u_p ≤ 2⁻⁸, and ‖Z_p‖ ≤ ‖z_p‖ + 4u_p·s‖g‖. Where |Z_j| < ulp(a_j)/2
        # the noise is rounded away (z_j = 0) on a correct step (fl(a + Z) is post-processing
        # of a + Z): without this term a one-coordinate parameter alarmed with probability
        # ≈ 0.4·ulp(a)/(σC) a step, far above α_j/P (docs/theory.md §16.1).
        out = []
        for i, d_p, unit, widen in lay.nonempty:
            # ‖z_p‖ ≤ ‖ẑ_p‖ + 3u‖(|a| + s|g|)_p‖ ≤ ‖ẑ_p‖ + 3u·R, ‖ẑ_p‖ computed within a
            # relative g_{d_p} (widen = (1 + 2⁻⁴⁰)/(1 − g_{d_p})); ‖Z_p‖ ≤ ‖z_p‖ + 4u_p·s‖g‖
            high = (norms[i] + 3.0 * u * reach) * widen + (4.0 * unit * scale * g_high
                                                          + (1.0 + scale) * lay.tiny[i]) * up
            out.append((i, d_p, high, norms[i]))
        repeat = None
        if self._zprev is not None:
            # |D̂_j − (z_t − z_{t−1})_j| ≤ 3u(|a|+s|g|)_t + 3u(|a|+s|g|)_{t−1} + u(|ẑ_t| + |ẑ_{t−1}|)
            # ≤ 5u·((|a|+s|g|)_t + (|a|+s|g|)_{t−1}) coordinatewise, so in norm ≤ 5u(R_t + R_{t−1});
            # and Z_t is z_t within 4u_p·s‖g‖ (above; z_{t−1}, the previous step's trace, is a
            # fixed vector given the past, which is all Anderson's inequality needs)
            high = (norms[-1] + 5.0 * u * (reach + self._zprev[1])) * up \
                / (1.0 - lay.gamma) + (4.0 * lay.unit_max * scale * g_high
                                       + (1.0 + scale) * lay.tiny_total) * up
            repeat = (high, norms[-1])
        if not all(math.isfinite(b[2]) for b in out) or (
                repeat is not None and not math.isfinite(repeat[0])):
            self._unmeasurable(None)  # an overflow in a norm: no test may pass on it (wr)
        self._zprev = (cur, reach)
        return out, repeat

    def _buffer(self, grads: list[Any], summed: list[Any]) -> _Layout:
        """The float64 buffers of :meth:`_measure` and their views (:class:`_Layout`).

        Allocated at the first step and again only when the parameters with a noisy
        gradient change (their number, shapes, dtypes or device); the previous step's ẑ is then
        forgotten (the repeat test restarts). The copy into the buffer is exact (float64
        holds every float16, bfloat16, float32 and float64 value).
        """
        # wr: keyed by both dtypes (the rounding allowances and the clipping tolerance follow
        # the dtypes seen at this step: after model.half() or .double(), not those at attach)
        # and by device (a model moved to another device gets buffers there)
        key = tuple([(g.shape, g.dtype, a.dtype, g.device)
                     for g, a in zip(grads, summed, strict=True)])
        if self._buf is None or self._buf.key != key:
            for _, *dtypes, _ in key:
                for dtype in dtypes:
                    if not (dtype.is_floating_point and dtype.itemsize <= 8):
                        raise InvalidArgumentError(
                            "witnesses", True, f"need real floating-point gradients of at most "
                            f"64 bits for the noise witness, got {dtype}")
            self._buf = _Layout(key, grads[0].device)
            self._zprev = None
        return self._buf

    def _noise_cut(self, d: int, first: float | None = None) -> float:
        """A number ≥ every x with P(χ²_d ≤ x) ≤ α₁ (the level of step 1, the largest;
        ``first`` overrides α₁: the per-parameter tests' α₁/P).

        Computed once per (d, α₁) and cached: a statistic above it has a tail above α_t
        for every t, so the exact tail (a scipy call) is evaluated only below it, with
        the same decision as evaluating it at every step.
        """
        if first is None:
            first = level(1, self.false_alarm)
        key = d if first == level(1, self.false_alarm) else (d, first)
        cut = self._cuts.get(key)
        if cut is None:
            cut = _chi2_quantile(first, d) * (1.0 + 1e-6)
            while _chi2_lower_tail(cut, d) <= first:  # guard the inverse's accuracy
                cut *= 1.0 + 1e-3
            self._cuts[key] = cut
        return cut

    def _check_clipped_sum(self, size: float, records: int, c: float) -> None:
        """‖summed_grad‖ ≤ (records)·C: every record moves the clipped sum by at most C.

        Deterministic (the triangle inequality; the tolerance of the per-micro-batch
        check covers the rounding): a correct clip never trips it, whatever the data.
        """
        assert self._buf is not None, "_measure runs first"
        eps = self._buf.eps  # the coarsest dtype of this step's clipped sums and gradients
        bound = records * c
        tolerance = (1e-3 + 4.0 * records * eps) * bound + _stabiliser(c) * records
        if size > bound + tolerance and bound + tolerance < 2.0 ** -300 \
                and self._buf.squares_total > 0.0:
            # Review rlo4: the bound on ‖a‖ adds the float64 squares' underflow, √(d·2⁻¹⁰²⁰)
            # (task lo4), which alone exceeds a small B·C: every float64 step of an empty
            # Poisson batch (B = 0: the bound is 0) was refused at any C, and at B·C ~ √d·10⁻¹⁵⁵
            # a correct step was refused or not depending on its clipped sum (not charged).
            # Here ‖a‖ is measured again without underflow: a scaled by 2⁶⁰⁰ (exact) squares
            # to normal floats (from 2⁻⁹⁴⁸) or overflows to inf, which only an entry above
            # 2⁻⁸⁸ ≫ B·C + tolerance does (a clipped sum over its bound: refused)
            size = self._clipped_norm_high()
        if size > bound + tolerance:
            self._fail(PipelineMismatchError(
                f"clipping witness: the clipped sum of this step's {records} records has norm "
                # the norm rounded down, the bound up, 6 digits: the alarm needs norm > bound
                # ·(1 + 10⁻³), so the printed '>' holds (4 digits to nearest read "1.001 >
                # 1.001"; review rlo3)
                f"{_down(size, '.6g')} > {records} × C = {_up(bound, '.6g')} at the charged C = "
                f"{_exact(c)}: some "
                "record moved the sum by more than C. Nothing was charged or applied",
                witness="clipping", charged=c, measured=size, interval=None,
                step=self.steps))

    def _clipped_norm_high(self) -> float:
        """An upper bound on ‖summed_grad‖ without the squares' underflow (review rlo4): the
        clipped sums in float64 times 2⁶⁰⁰ (exact), summed squares (each term within u of
        its value, the sum within γ: :func:`gram_widening`), then scaled back. Only where
        :meth:`_check_clipped_sum` would refuse a float64 step at a bound below 2⁻³⁰⁰ (one
        more pass over the clipped sums, never on an ordinary step)."""
        terms = [p.summed_grad for p in self.optimizer.params
                 if p.grad is not None and p.summed_grad is not None]
        with torch.no_grad():
            total = sum((torch.sum(torch.square(t.detach().to(torch.float64) * 2.0 ** 600))
                         for t in terms), torch.zeros((), dtype=torch.float64))
        size = float(total)
        if not size < math.inf:  # an entry above 2⁻⁸⁸ (or a NaN): far over any such bound
            return math.inf
        count = sum(t.numel() for t in terms) + len(terms)
        return math.sqrt(size / (1.0 - gram_widening(count))) * (1.0 + 2.0 ** -40) * 2.0 ** -600

    def _check_sampling(self, sizes: Any, q: float, accumulated: int) -> None:
        """Each of ``sizes`` drawn in ``accumulated`` Poisson(q) draws of the dataset.

        With the micro-batch counter, ``sizes`` are the step's micro-batches one
        by one (``accumulated`` = 1: each is Binomial(N, q)); else the step's
        records in one (Binomial(N·k, q)). The running sum is tested once a step,
        the ties over pairs of consecutive draws of the same n once a step.
        """
        assert self.dataset_size is not None
        if q != self._segment_q:  # a new stretch of constant q: a new running sum
            self._segment_q, self._segment_k, self._segment_n = q, 0, 0
            self._pair, self._pairs, self._ties, self._tie_rate = None, 0, 0, 0.0
            self._tie_draws, self._safe_ties, self._anchor = 0, -1, None
        draws = self.dataset_size * accumulated
        paired = False
        for records in sizes:
            if 0.0 < q < 1.0:
                paired = self._pair_up(records, draws, q) or paired
            self._segment_k += records
            self._segment_n += draws
        k, n = self._segment_k, self._segment_n
        if not 0.0 < q < 1.0 or n == 0:
            return
        alpha = level(self.steps, self._sampling_alarm)
        if paired:
            self._check_ties(q, alpha)
        if self.shard is not None:
            # the n/N_shard draws are zero-truncated: the binomial test at α·(1 − p₀)^m has
            # level ≤ α under the truncated law (integrations/_shard.truncation_factor)
            alpha *= truncation_factor(self.dataset_size, q, n // self.dataset_size)
            if not alpha > 0.0:
                return  # nothing left to test at (p₀ near 1: almost every draw is empty)
        if self._covered(k, n, q, alpha):
            return
        # Only the tail on K's side of the mean can be small: a binomial median m has
        # ⌊nq⌋ ≤ m ≤ ⌈nq⌉ and P(B ≤ m), P(B ≥ m) ≥ 1/2, so P(B ≥ K) ≥ 1/2 for K ≤ ⌊nq⌋
        # and P(B ≤ K) ≥ 1/2 for K ≥ ⌈nq⌉ (one scipy call a step, the same decision).
        mean = n * q
        if k <= math.floor(mean):
            lower, upper = _binomial_tail_lower(k, n, q), 1.0
        elif k >= math.ceil(mean):
            lower, upper = 1.0, _binomial_tail_upper(k, n, q)
        else:  # pragma: no cover - a non-integer mean has no integer strictly between
            lower, upper = _binomial_tails(k, n, q)
        if min(lower, upper) > alpha / 2:
            self._anchor_at(n, q, alpha)
            return
        lower, upper = _binomial_tails(k, n, q)
        lo, hi = _clopper_pearson(k, n)
        self._fail(PipelineMismatchError(
            f"sampling witness: the steps are charged with sample rate q = {_exact(q)} per record "
            f"(Poisson, {self._population()}), but {k} records were drawn in "
            f"{n // self.dataset_size} draws of the dataset since q took this value: rate ≈ "
            f"{k / n:.4g} (95% Clopper–Pearson interval [{_down(lo, '.4g')}, "
            f"{_up(hi, '.4g')}]); two-sided binomial p = {_up(2 * min(lower, upper), '.3g')} ≤ "
            f"{_up(alpha, '.3g')}, the level spent at step "
            f"{self.steps}. Nothing was charged or applied",
            witness="sampling", charged=q, measured=k / n, interval=(lo, hi),
            step=self.steps))

    def _population(self) -> str:
        if self.shard is None:
            return f"N = {self.dataset_size} records"
        return (f"this rank's shard of n = {self.dataset_size} records, empty draws skipped by "
                f"Opacus' distributed sampler")

    def _covered(self, k: int, n: int, q: float, alpha: float) -> bool:
        """Whether both tails of K = k are > α/2 by the anchor alone (no scipy call).

        The anchor (n_a, h, T_h, l, T_l) has T_h = P(B_a ≥ h), T_l = P(B_a ≤ l),
        B_a ~ Binomial(n_a, q), exactly. For n ≥ n_a, B = B_a + B′ with B′ ~
        Binomial(n − n_a, q) independent, and P(B′ ≥ ⌊(n−n_a)q⌋) ≥ 1/2 (the median
        bound above), so P(B ≥ h + ⌊(n−n_a)q⌋) ≥ T_h/2; likewise P(B ≤ l +
        ⌈(n−n_a)q⌉) ≥ T_l/2. With T_h, T_l > α both tails of K are > α/2, as the
        exact test would find: the same decision, O(1) a step.
        """
        anchor = self._anchor
        if anchor is None or n < anchor[0]:
            return False
        n_a, high, t_high, low, t_low = anchor
        grown = (n - n_a) * q
        return (k <= high + math.floor(grown) and t_high > alpha
                and k >= low + math.ceil(grown) and t_low > alpha)

    def _anchor_at(self, n: int, q: float, alpha: float) -> None:
        """A new anchor for :meth:`_covered` at n draws: bounds near the level α (exact tails)."""
        mean, sd = n * q, math.sqrt(n * q * (1.0 - q))
        z = -float(special.ndtri(min(0.25, 4.0 * alpha)))  # a start; checked exactly
        high = min(n, math.floor(mean + z * sd))
        low = max(0, math.ceil(mean - z * sd))
        for _ in range(40):
            t_high = _binomial_tail_upper(high, n, q)
            if t_high > alpha or high <= math.floor(mean):
                break
            high = max(math.floor(mean), math.floor(mean + 0.8 * (high - mean)))
        for _ in range(40):
            t_low = _binomial_tail_lower(low, n, q)
            if t_low > alpha or low >= math.ceil(mean):
                break
            low = min(math.ceil(mean), math.ceil(mean - 0.8 * (mean - low)))
        # at the median side the tails are ≥ 1/2 whatever scipy returned (the median bound)
        t_high = max(t_high, 0.5) if high <= math.floor(mean) else t_high
        t_low = max(t_low, 0.5) if low >= math.ceil(mean) else t_low
        self._anchor = (n, high, t_high, low, t_low)

    def _pair_up(self, records: int, draws: int, q: float) -> bool:
        """Put one draw's count into the current pair; True when a pair was completed.

        Pairs are disjoint and consecutive, of draws with the same n (a new n
        starts a new series of pairs, with its own tie probability).
        """
        if self._pair is None:
            self._pair = (draws, records)
            return False
        if self._pair[0] != draws:
            self._pair = (draws, records)
            return False
        if draws != self._tie_draws:  # a new series: the tie probability of this n
            self._tie_draws, self._pairs, self._ties, self._safe_ties = draws, 0, 0, -1
            # P(B = b) on mean ± 40 sd (the mass outside is < 1e-300), as CDF differences
            mean, sd = draws * q, math.sqrt(draws * q * (1.0 - q))
            lo_b, hi_b = max(0, int(mean - 40 * sd) - 1), min(draws, int(mean + 40 * sd) + 1)
            below = float(special.bdtr(lo_b - 1, draws, q)) if lo_b > 0 else 0.0
            cdf = special.bdtr(np.arange(lo_b, hi_b + 1), draws, q)
            pmf = np.diff(np.concatenate(([below], cdf)))
            if self.shard is not None and lo_b == 0:  # DDP: empty draws are skipped, so the
                # sizes are zero-truncated: P(Y = b) = P(B = b)/(1 − p₀) for b ≥ 1
                pmf[0] = 0.0
                pmf /= 1.0 - float(special.bdtr(0, draws, q))
            # ×(1 + 1e-6): above the float error of the CDF differences (a larger c is safe)
            self._tie_rate = float(np.clip(np.sum(pmf * pmf) * (1 + 1e-6), 1e-300, 1.0))
        self._pairs += 1
        self._ties += int(records == self._pair[1])
        self._pair = None
        return True

    def _check_ties(self, q: float, alpha: float) -> None:
        """Dispersion: disjoint pairs of draws with equal counts, against Poisson's rate.

        Two independent Binomial(n, q) draws are equal with probability
        c = Σ_b P(B = b)²; over P disjoint pairs (same n and q) the number of
        ties is exactly Binomial(P, c). A fixed-size sampler ties nearly
        always, though its mean batch size is right; so do the two halves of one
        batch passed off as two micro-batches.

        O(1) a step: once P(Bin(P, c) ≥ T) > α_t is known, it holds at every
        later step while the ties are ≤ T (more pairs only raise the tail, and
        α_t only falls), so the exact tail is evaluated only at a new tie above T.
        """
        draws, c = self._tie_draws, self._tie_rate
        if self._ties <= self._safe_ties or self._ties <= math.floor(self._pairs * c):
            return  # ≤ a tie count known safe, or at or below the median (P(≥) ≥ 1/2)
        upper = _binomial_tail_upper(self._ties, self._pairs, c)
        if upper > alpha:
            self._safe_ties = self._ties
            return
        lo, hi = _clopper_pearson(self._ties, self._pairs)
        self._fail(PipelineMismatchError(
            f"sampling witness: the steps are charged as Poisson sampling at q = {_exact(q)} "
            f"(n = {draws} record draws a batch), under which two batches' sizes are equal "
            f"with probability {c:.4g}; {self._ties} of {self._pairs} pairs of batches had equal "
            f"sizes (rate {self._ties / self._pairs:.4g}, 95% interval [{_down(lo, '.4g')}, "
            f"{_up(hi, '.4g')}]; binomial p = {_up(upper, '.3g')} ≤ {_up(alpha, '.3g')}): the "
            "batches are not Poisson "
            "draws (fixed-size batches?). Nothing was charged or applied",
            witness="sampling", charged=c, measured=self._ties / self._pairs,
            interval=(lo, hi), step=self.steps))
