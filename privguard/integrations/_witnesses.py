"""Runtime witnesses: did the Opacus step run as the ledger is told it ran?

The ``check`` stage of the step hook (``describe → check → charge →
release``, /work/shared/design.md). With white-box access to the
``DPOptimizer`` it measures, at every real step and before the step is
charged or released, three things the charge asserts:

* **noise** — Opacus keeps the clipped sum ``p.summed_grad`` beside the noisy
  scaled gradient ``p.grad = (summed_grad + Z) / s`` (``s`` = expected batch
  size × accumulated iterations for ``loss_reduction="mean"``, else 1;
  ``DPOptimizer.add_noise``/``scale_grad``, the same under ghost clipping), so
  the noise actually added is ``Z = p.grad · s − p.summed_grad``. Under the
  charge, ``Z ~ N(0, (σC)² I_d)`` and ``‖Z‖²/(σC)² ~ χ²_d`` exactly; the test
  is one-sided (it alarms only when the noise is *smaller* than charged: more
  noise, as AdaClip adds by design, is safe) with the exact χ² lower tail
  (regularised incomplete gamma), docs/theory.md §16.
* **clipping** — where per-sample gradients exist, the increment of
  ``summed_grad`` must equal ``Σ_i g_i · min(1, C/‖g_i‖)`` recomputed here
  from ``p.grad_sample`` (so no per-sample contribution exceeds C), within a
  float tolerance a correct clip never reaches; under ghost clipping only
  the per-sample norms exist and the witness checks
  ``‖Σ clipped‖ ≤ Σ_i min(‖g_i‖, C)`` (a clipped sum whose contributions
  exceed C can pass it: that is left to the one-run audit; the same bound
  under per-layer clipping). Deterministic
  under a correct pipeline: it never fires, so it reveals nothing.
* **sampling** — the batch sizes are the sampler's own draws: under the
  charge they are independent Binomial(N·k, q) (k accumulated micro-batches,
  q the charged rate per draw), so their running sum over a stretch of
  constant q is Binomial(Σ N·k, q) and is tested two-sided with the exact
  binomial tails (regularised incomplete beta) after every step; and the
  number of disjoint pairs of steps with equal batch sizes is tested against
  its exact Binomial(P, Σ_b P(B=b)²) law (fixed-size batches tie).

False alarms: the noise, sampling-mean and sampling-ties tests at the handle's
t-th step use level ``α·6/(π²t²)`` with ``α = FALSE_ALARM`` each, so over any number of
steps each alarms with probability ≤ α under a correct pipeline (Σ 6/(π²t²) =
1), whatever the data; the clipping test never alarms. docs/theory.md §16
shows the witnessed run is then (ε, δ + (1+e^ε)·3α)-DP when the ledger
charges (ε, δ).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from scipy import special

from privguard._errors import PipelineMismatchError

__all__ = ["FALSE_ALARM", "Witnesses", "level"]

FALSE_ALARM = 1e-10
"""Total false-alarm probability of each statistical witness (noise, sampling) over a run."""

CONFIDENCE = 0.95
"""Confidence of the interval reported with a mismatch."""


def level(t: int, total: float = FALSE_ALARM) -> float:
    """The false-alarm probability spent at step ``t`` ≥ 1: ``total·6/(π²t²)``.

    Σ_{t≥1} 6/(π²t²) = 1 (Euler's Basel sum), so the union bound over all
    steps is ``total``.

    Example:
        >>> round(sum(level(t, 1.0) for t in range(1, 10**5)), 4)
        1.0
    """
    return total * 6.0 / (math.pi ** 2 * t * t)


def _chi2_lower_tail(x: float, d: int) -> float:
    """P(χ²_d ≤ x), exactly: the regularised lower incomplete gamma P(d/2, x/2)."""
    return float(special.gammainc(d / 2.0, x / 2.0))


def _chi2_quantile(p: float, d: int) -> float:
    return 2.0 * float(special.gammaincinv(d / 2.0, p))


def _binomial_tails(k: int, n: int, q: float) -> tuple[float, float]:
    """(P(X ≤ k), P(X ≥ k)) for X ~ Binomial(n, q), by the incomplete beta identity."""
    lower = 1.0 if k >= n else float(special.betainc(n - k, k + 1, 1.0 - q))
    upper = 1.0 if k <= 0 else float(special.betainc(k, n - k + 1, q))
    return lower, upper


def _clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    a = (1.0 - confidence) / 2.0
    lo = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, a))
    hi = 1.0 if k >= n else float(special.betaincinv(k + 1, n - k, 1.0 - a))
    return lo, hi


class Witnesses:
    """The three witnesses on one Opacus optimizer (created by ``attach(..., witnesses=True)``).

    Args:
        optimizer: the Opacus ``DPOptimizer``.
        dataset_size: N, the number of records the loader samples from
            (``len(data_loader.dataset)``); ``None`` turns the sampling
            witness off.

    Attributes:
        active: the names of the witnesses that run.
        steps: real steps checked so far.
    """

    def __init__(self, optimizer: Any, dataset_size: int | None) -> None:
        self.optimizer = optimizer
        self.dataset_size = dataset_size
        try:
            from opacus.optimizers import DPOptimizerFastGradientClipping
        except ImportError:  # an Opacus without ghost clipping
            self.ghost = False
        else:
            self.ghost = isinstance(optimizer, DPOptimizerFastGradientClipping)
        self.active = ("noise", "clipping") + (("sampling",) if dataset_size else ())
        self.steps = 0
        self.failure: PipelineMismatchError | None = None
        self._records = 0  # records in the micro-batches since the last real step
        self._segment_q: float | None = None
        self._segment_k = 0
        self._segment_n = 0
        self._pair: tuple[int, int] | None = None  # (draws, size) of the first step of a pair
        self._pairs = 0
        self._ties = 0
        self._tie_rate = 0.0
        self._wrapped: tuple[str, Any] | None = None

    # ------------------------------------------------------------ install
    def install(self) -> None:
        """Wrap the optimizer's per-micro-batch clipping (an instance attribute; undone by uninstall)."""
        name = "accumulate" if self.ghost else "clip_and_accumulate"
        own = vars(self.optimizer).get(name)
        original = getattr(self.optimizer, name)
        wrapper = self._ghost_accumulate if self.ghost else self._clip_and_accumulate
        self._original = original
        self._wrapped = (name, own)
        setattr(self.optimizer, name, wrapper)

    def uninstall(self) -> None:
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

    # ------------------------------------------------------------ clipping
    def _clip_and_accumulate(self) -> None:
        opt = self.optimizer
        if self.failure is not None:
            raise self.failure
        params = opt.params
        before = [None if p.summed_grad is None else p.summed_grad.detach().clone() for p in params]
        samples = [opt._get_flat_grad_sample(p).detach() for p in params]
        self._original()
        batch = len(samples[0]) if samples else 0
        self._records += batch
        if batch == 0:
            return
        c = float(opt.max_grad_norm)
        norms = torch.stack([g.reshape(batch, -1).norm(2, dim=1) for g in samples], dim=1).norm(2, dim=1)
        # clip_C(g) = g·min(1, C/‖g‖) (Abadi et al. 2016, Alg. 1): recomputed here, not read
        factor = (c / norms.clamp_min(1e-30)).clamp(max=1.0)
        per_layer = hasattr(opt, "max_grad_norms")  # DPPerLayerOptimizer: one C_l per layer
        err = torch.zeros((), dtype=torch.float64)
        size = torch.zeros((), dtype=torch.float64)
        for p, g, prior in zip(params, samples, before, strict=True):
            got = p.summed_grad.detach() if prior is None else p.summed_grad.detach() - prior
            size = size + got.to(torch.float64).square().sum()
            if not per_layer:
                expected = torch.einsum("i,i...", factor.to(g.dtype), g)
                err = err + (got.to(torch.float64) - expected.to(torch.float64)).square().sum()
        bound_norm = float(torch.minimum(norms, torch.tensor(c, dtype=norms.dtype)).sum())
        eps = torch.finfo(samples[0].dtype).eps
        # float tolerance: summation/product rounding ≤ γ_B·Σ‖clipped‖ (Higham 2002, §3.1)
        # plus Opacus' 1e-6 stabiliser, ≤ 1e-6 per record; 1e-3 relative is far above both
        tolerance = (1e-3 + 4.0 * batch * eps) * bound_norm + 1e-5 * batch
        if per_layer:
            # per-layer clipping to C_l with Σ C_l² = C²: each contribution's norm is at most
            # min(‖g_i‖, C), so ‖Σ clipped‖ ≤ Σ min(‖g_i‖, C) (the triangle inequality)
            deviation = max(0.0, float(size.sqrt()) - bound_norm)
        else:
            deviation = float(err.sqrt())
        if deviation > tolerance:
            largest = float(norms.max())
            self._fail(PipelineMismatchError(
                f"clipping witness: the clipped sum of this micro-batch of {batch} records is "
                f"{deviation:.4g} away (in L2 norm) from the per-sample gradients clipped to the "
                f"charged C = {c:.6g} (tolerance {tolerance:.3g}); the largest per-sample norm is "
                f"{largest:.4g}, so contributions above C reached the sum: the charge assumes "
                "each record moves the sum by at most C. Nothing was charged or applied",
                witness="clipping", charged=c, measured=deviation, interval=None,
                step=self.steps + 1))

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
            got = math.sqrt(sum(float(p.grad.detach().to(torch.float64).square().sum())
                                for p in opt.params if p.grad is not None))
            bound = float(torch.minimum(norms, torch.tensor(c, dtype=norms.dtype)).sum())
            # ‖Σ_i clip_C(g_i)‖ ≤ Σ_i min(‖g_i‖, C) (triangle inequality)
            tolerance = (1e-3 + 4.0 * batch * torch.finfo(norms.dtype).eps) * bound + 1e-5 * batch
            if got > bound + tolerance:
                self._fail(PipelineMismatchError(
                    f"clipping witness (ghost clipping): the clipped sum of this micro-batch of "
                    f"{batch} records has norm {got:.4g} > Σ min(‖g_i‖, C) = {bound:.4g} at the "
                    f"charged C = {c:.6g}. Nothing was charged or applied",
                    witness="clipping", charged=c, measured=got, interval=None,
                    step=self.steps + 1))
        self._original()

    # ------------------------------------------------------------ at the step
    def check(self, mechanism: Any) -> None:
        """Check the step about to be charged as ``mechanism``; raise :class:`PipelineMismatchError`.

        Called by the step hook after Opacus formed the noisy gradient and
        before the charge and the parameter update. ``mechanism`` is what the
        step is charged as: a :class:`privguard.mechanisms.SubsampledGaussian`,
        an :class:`~privguard.mechanisms.AccumulatedSubsampledGaussian` (k
        Poisson micro-batches at the loader's rate q), or, for a random
        allocation loader, the epoch's
        :class:`~privguard.mechanisms.RandomAllocation` (noise only: its
        sampling is not witnessed).
        """
        if self.failure is not None:
            raise self.failure
        self.steps += 1
        records, self._records = self._records, 0
        self._check_noise(float(mechanism.noise_multiplier))
        rate = getattr(mechanism, "sample_rate", None)
        if "sampling" in self.active and rate is not None:
            micro_batches = int(getattr(mechanism, "micro_batches", 1))
            self._check_sampling(records, float(rate), micro_batches)

    def _check_noise(self, sigma: float) -> None:
        opt = self.optimizer
        c = float(opt.max_grad_norm)
        if sigma <= 0 or c <= 0:
            return  # nothing to compare (a σ = 0 charge is refused by the ledger itself)
        scale = 1.0
        if opt.loss_reduction == "mean":
            accumulated = opt.accumulated_iterations
            scale = float(opt.expected_batch_size * accumulated)
        total = torch.zeros((), dtype=torch.float64)
        d = 0
        for p in opt.params:
            if p.grad is None or p.summed_grad is None:
                continue
            # Z = grad·s − summed_grad (DPOptimizer.add_noise then scale_grad)
            z = p.grad.detach().reshape(-1).to(torch.float64) * scale \
                - p.summed_grad.detach().reshape(-1).to(torch.float64)
            total = total + z.square().sum()
            d += z.numel()
        if d == 0:
            return
        sq = float(total)
        sd = sigma * c
        stat = sq / (sd * sd)
        if stat >= d:  # at or above the χ²_d mean, above every lower quantile below 1/2
            return
        alpha = level(self.steps)
        tail = _chi2_lower_tail(stat, d)
        if tail > alpha:
            return
        # σ_applied = ‖Z‖/(C·√χ²_d): a 95% interval from the χ²_d quantiles
        a = (1.0 - CONFIDENCE) / 2.0
        lo = math.sqrt(sq / _chi2_quantile(1.0 - a, d)) / c
        hi = math.sqrt(sq / _chi2_quantile(a, d)) / c
        estimate = math.sqrt(sq / d) / c
        self._fail(PipelineMismatchError(
            f"noise witness: the step is charged with noise multiplier σ = {sigma:.6g} (noise "
            f"std σ·C = {sd:.6g} per coordinate at C = {c:.6g}), but the noise added to this "
            f"step's {d} coordinates has σ ≈ {estimate:.4g} (95% interval [{lo:.4g}, {hi:.4g}]); "
            f"P(this little noise | σ charged) = {tail:.3g} ≤ {alpha:.3g}, the level spent at "
            f"step {self.steps}. Nothing was charged or applied",
            witness="noise", charged=sigma, measured=estimate, interval=(lo, hi),
            step=self.steps))

    def _check_sampling(self, records: int, q: float, accumulated: int) -> None:
        """``records`` drawn in ``accumulated`` Poisson(q) micro-batches of the dataset."""
        assert self.dataset_size is not None
        if q != self._segment_q:  # a new stretch of constant q: a new running sum
            self._segment_q, self._segment_k, self._segment_n = q, 0, 0
            self._pair, self._pairs, self._ties, self._tie_rate = None, 0, 0, 0.0
        draws = self.dataset_size * accumulated
        if 0.0 < q < 1.0:
            self._check_ties(records, draws, q)
        self._segment_k += records
        self._segment_n += draws
        k, n = self._segment_k, self._segment_n
        if not 0.0 < q < 1.0:
            return
        lower, upper = _binomial_tails(k, n, q)
        alpha = level(self.steps)
        if min(lower, upper) > alpha / 2:
            return
        lo, hi = _clopper_pearson(k, n)
        self._fail(PipelineMismatchError(
            f"sampling witness: the steps are charged with sample rate q = {q:.6g} per record "
            f"(Poisson, N = {self.dataset_size} records), but {k} records were drawn in "
            f"{n // self.dataset_size} draws of the dataset since q took this value: rate ≈ "
            f"{k / n:.4g} (95% Clopper–Pearson interval [{lo:.4g}, {hi:.4g}]); two-sided "
            f"binomial p = {2 * min(lower, upper):.3g} ≤ {alpha:.3g}, the level spent at step "
            f"{self.steps}. Nothing was charged or applied",
            witness="sampling", charged=q, measured=k / n, interval=(lo, hi),
            step=self.steps))

    def _check_ties(self, records: int, draws: int, q: float) -> None:
        """Dispersion: disjoint pairs of steps with equal batch sizes, against Poisson's rate.

        Two independent Binomial(n, q) draws are equal with probability
        c = Σ_b P(B = b)²; over P disjoint pairs (same n and q) the number of
        ties is exactly Binomial(P, c). A fixed-size sampler ties nearly
        always, though its mean batch size is right.
        """
        if self._pair is None or self._pair[0] != draws:
            self._pair = (draws, records)
            return
        if self._tie_rate == 0.0:
            # P(B = b) on mean ± 40 sd (the mass outside is < 1e-300), as CDF differences
            mean, sd = draws * q, math.sqrt(draws * q * (1.0 - q))
            lo_b, hi_b = max(0, int(mean - 40 * sd) - 1), min(draws, int(mean + 40 * sd) + 1)
            below = float(special.bdtr(lo_b - 1, draws, q)) if lo_b > 0 else 0.0
            cdf = special.bdtr(np.arange(lo_b, hi_b + 1), draws, q)
            pmf = np.diff(np.concatenate(([below], cdf)))
            # ×(1 + 1e-6): above the float error of the CDF differences (a larger c is safe)
            self._tie_rate = float(np.clip(np.sum(pmf * pmf) * (1 + 1e-6), 1e-300, 1.0))
        self._pairs += 1
        self._ties += int(records == self._pair[1])
        self._pair = None
        c = self._tie_rate
        _, upper = _binomial_tails(self._ties, self._pairs, c)
        alpha = level(self.steps)  # the handle's step index: one union bound over segments
        if upper > alpha:
            return
        lo, hi = _clopper_pearson(self._ties, self._pairs)
        self._fail(PipelineMismatchError(
            f"sampling witness: the steps are charged as Poisson sampling at q = {q:.6g} "
            f"(N·k = {draws} draws a step), under which two steps' batch sizes are equal with "
            f"probability {c:.4g}; {self._ties} of {self._pairs} pairs of steps had equal "
            f"batch sizes (rate {self._ties / self._pairs:.4g}, 95% interval [{lo:.4g}, "
            f"{hi:.4g}]; binomial p = {upper:.3g} ≤ {alpha:.3g}): the batches are not Poisson "
            "draws (fixed-size batches?). Nothing was charged or applied",
            witness="sampling", charged=c, measured=self._ties / self._pairs,
            interval=(lo, hi), step=self.steps))
