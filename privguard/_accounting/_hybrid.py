"""The hybrid filter: a PLD-accounted envelope (part A) with an RDP fallback (part B).

Issue 16, proof in docs/theory.md §2b. Pure accounting code: no I/O, no ledger.

* **Part A** counts the steps that lie inside the *envelope* (sample rate
  ≤ q₀, noise multiplier ≥ σ₀; the plan's step; for a plan step that
  accumulates k₀ ≥ 2 micro-batches: σ ≥ σ₀ with the same q₀ and k₀,
  docs/theory.md §2b.1). It admits while the count
  stays within T_A, the largest T for which T envelope steps are
  (ε, δ_A)-DP by dp-accounting's pessimistic PLD (both neighbouring
  directions). Every inside step is dominated by the envelope step
  (docs/theory.md §2b, Lemma 1), so by the adaptive composition of
  dominating pairs (Zhu, Dong & Wang 2022, Thm 10) A alone is (ε, δ_A)-DP.
* **Part B** is the RDP filter of docs/theory.md §2 (seed 001 Thm 1 with δ
  shares) at δ_B = δ − δ_A, charged for EVERY admitted step (C2).
* A charge is admitted iff A or B admits it. A charge admitted without A
  (outside the envelope, or past T_A) kills A for good (C1).

Then on every view either every admitted step was A-admissible or every one
was B-admissible, and the interaction is (ε, δ_A + δ_B)-DP (theory §2b).

Sources: PLD accounting by FFT (Koskela, Jälkö & Honkela 2020; Koskela et
al. 2021) as implemented by dp-accounting with pessimistic connect-the-dots
discretisation (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022);
dominating pairs and their adaptive composition (Zhu, Dong & Wang 2022);
f-DP / Gaussian DP closed forms used by the tests (Dong, Roth & Su 2022);
part B's filter (Lécuyer 2021, Thm 1; docs/theory.md §2).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._accounting import _allocation_envelope as _alloc
from privguard._accounting._filters import DPFilter
from privguard._accounting._results import exact
from privguard._accounting._shares import DeltaShares, shares_from_dict
from privguard._curves import _conversion as conv
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._errors import InvalidArgumentError, LedgerStateError
from privguard._floats import float_below
from privguard._mechanisms._base import Mechanism
from privguard.mechanisms import (
    AccumulatedSubsampledGaussian,
    Gaussian,
    RandomAllocation,
    SubsampledGaussian,
)

#: Part A's default share of δ. A run on plan then admits at least what Opacus'
#: PRV accountant calibrated it for, also for short runs with little noise
#: (0.9 admits only 60 of 64 PRV-calibrated steps at q = 256/60000, ε = 3); the
#: price is a fallback at δ_B = 0.01·δ for a run that leaves its envelope
#: (docs/theory.md §2b, "Choosing δ_A").
DEFAULT_SHARE_A = 0.99

#: PLD loss discretisation interval (dp-accounting's default). Pessimistic
#: connect-the-dots rounding makes δ larger, never smaller, so this only trades
#: tightness for speed (Doroshenko et al. 2022, Algorithm 1).
DISCRETISATION = 1e-4
#: Largest number of grid points of the one-step PLD; a coarser interval is used
#: beyond it (again only on the safe side).
MAX_PLD_POINTS = 2_000_000
#: Mass the FFT self-composition may truncate from the tails (dp-accounting's
#: default); dp-accounting adds it to the infinite-loss mass, i.e. to δ.
TAIL_MASS = 1e-15
#: Relative safety margin: T_A steps must satisfy δ_PLD + round-off ≤ δ_A·(1 − MARGIN).
MARGIN = 1e-3
#: Round-off allowance: this many times the total negative mass of the composed
#: PMFs (the FFT's sign-symmetric round-off noise made visible) is added to δ.
ROUNDOFF_FACTOR = 10.0
#: T_A is capped here (a certified count, just not searched beyond).
MAX_STEPS = 10**7
#: The largest target ε a new hybrid ledger takes (docs/theory.md §2b, "The range of ε"):
#: above it a likelihood ratio of e^ε protects nothing, and part A's PLD search (a
#: self-composition per probe over a loss range that grows with ε) took from seconds to
#: minutes before refusing or admitting (review bd). Checked at creation only: a stored
#: configuration beyond it still opens.
MAX_EPSILON = 100.0
#: Most micro-batches an accumulated envelope may have (docs/theory.md §2b.1): its
#: one-step PLD is a mixture of k₀ + 1 Gaussians, built by dp-accounting's binary
#: search, whose cost grows with k₀.
MAX_ENVELOPE_MICRO_BATCHES = 32
#: Grid points per direction of an accumulated envelope's one-step PLD: dp-accounting
#: builds a mixture's PMF by a binary search per grid point (seconds per thousand
#: points), so its interval is max(DISCRETISATION, width / MIXTURE_POINTS); a coarser
#: interval is pessimistic too (Doroshenko et al. 2022, Algorithm 1), it only costs
#: tightness (docs/theory.md §2b.1).
MIXTURE_POINTS = 5_000


@dataclasses.dataclass(frozen=True, repr=False)
class Envelope:
    """The envelope of part A: the plan's step and the steps it dominates.

    With ``micro_batches`` k₀ = 1 (the default): steps with σ ≥
    ``noise_multiplier`` and q ≤ ``sample_rate``; every Poisson-subsampled
    Gaussian step inside it (sensitivity ≤ 1 relative to the step's clip
    norm) is dominated, in both neighbouring directions, by the envelope step
    itself (docs/theory.md §2b, Lemma 1). With k₀ ≥ 2: the accumulated steps
    ``AccumulatedSubsampledGaussian(σ, q₀, k₀)`` with σ ≥ σ₀ and the same q₀
    and k₀ (docs/theory.md §2b.1, Lemma 1′). With ``allocation_steps`` t₀ ≥ 2: epochs
    ``RandomAllocation(σ, t₀)`` with σ ≥ σ₀ and the same t₀, one unit per epoch
    (docs/theory.md §2b.3; ``sample_rate`` is then 1.0, the Gaussian cap, which
    also dominates an epoch, so code that ignored the field would stay sound).

    Example:
        >>> Envelope(noise_multiplier=1.0, sample_rate=0.01)
        Envelope(noise_multiplier=1.0, sample_rate=0.01)
        >>> Envelope(1.0, 0.01, micro_batches=4).to_dict()["micro_batches"]
        4
    """

    noise_multiplier: float
    sample_rate: float
    micro_batches: int = 1
    allocation_steps: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier",
                           check.positive_finite("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "sample_rate", check.sample_rate("sample_rate", self.sample_rate))
        object.__setattr__(self, "micro_batches", check.positive_int(
            "micro_batches", self.micro_batches, maximum=MAX_ENVELOPE_MICRO_BATCHES))
        t0 = self.allocation_steps
        if isinstance(t0, bool) or not isinstance(t0, (int, np.integer)) or t0 < 0:
            raise InvalidArgumentError("allocation_steps", t0, "must be an integer >= 0")
        if t0:  # docs/theory.md §2b.3: the epoch envelope's range
            _alloc._check(self.noise_multiplier, t0, name="allocation_steps")
            if self.sample_rate != 1.0 or self.micro_batches != 1:
                raise InvalidArgumentError("allocation_steps", t0, "an allocation envelope has "
                                           "sample_rate=1.0 and micro_batches=1")
        object.__setattr__(self, "allocation_steps", int(t0))

    def __repr__(self) -> str:
        if self.allocation_steps:
            return (f"Envelope(noise_multiplier={self.noise_multiplier!r}, sample_rate=1.0, "
                    f"allocation_steps={self.allocation_steps})")
        tail = "" if self.micro_batches == 1 else f", micro_batches={self.micro_batches}"
        return (f"Envelope(noise_multiplier={self.noise_multiplier!r}, "
                f"sample_rate={self.sample_rate!r}{tail})")

    def step(self) -> Mechanism:
        """One envelope step: ``SubsampledGaussian(σ₀, q₀)`` or, for k₀ ≥ 2,
        ``AccumulatedSubsampledGaussian(σ₀, q₀, k₀)``; one epoch ``RandomAllocation(σ₀, t₀)``
        for an allocation envelope."""
        if self.allocation_steps:
            return RandomAllocation(self.noise_multiplier, self.allocation_steps)
        if self.micro_batches == 1:
            return SubsampledGaussian(self.noise_multiplier, self.sample_rate)
        return AccumulatedSubsampledGaussian(self.noise_multiplier, self.sample_rate,
                                             self.micro_batches, aligned=True)

    def to_dict(self) -> dict[str, float]:
        # k₀ = 1 writes today's two keys: a state written before accumulated envelopes
        # existed, and one written now for the same plan, are the same bytes.
        out = {"noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate}
        if self.micro_batches != 1:
            out["micro_batches"] = self.micro_batches
        if self.allocation_steps:
            out["allocation_steps"] = self.allocation_steps
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Envelope:
        keys = {"noise_multiplier", "sample_rate"}
        if not isinstance(data, dict) or set(data) not in (
                keys, keys | {"micro_batches"}, keys | {"allocation_steps"}):
            raise InvalidArgumentError("envelope", data, "must be a dict with keys "
                                       "noise_multiplier, sample_rate (and micro_batches or "
                                       "allocation_steps)")
        if data.get("micro_batches", 2) == 1:  # k₀ = 1 is written without the key
            raise InvalidArgumentError("envelope", data, "micro_batches=1 is written without "
                                       "the key")
        if data.get("allocation_steps", 2) in (0, False):  # written only when set
            raise InvalidArgumentError("envelope", data, "allocation_steps=0 is written without "
                                       "the key")
        return cls(data["noise_multiplier"], data["sample_rate"], data.get("micro_batches", 1),
                   data.get("allocation_steps", 0))


def envelope_of(step: Any) -> Envelope | None:
    """The envelope a plan's step declares, or None if it declares none.

    ``SubsampledGaussian(σ, q, steps=k)`` gives (σ, q) (the envelope is per
    step, whatever k); ``Gaussian(σ)`` gives (σ, 1.0);
    ``AccumulatedSubsampledGaussian(σ, q, m, aligned=True)`` gives (σ, q, m)
    for m ≤ :data:`MAX_ENVELOPE_MICRO_BATCHES` (m = 1: the subsampled
    Gaussian's envelope; ``aligned=False``, the default for m ≥ 2, has no proved
    PLD envelope: docs/theory.md §14, Lemma 14.5); ``RandomAllocation(σ, t, epochs=k)`` gives
    the epoch envelope (σ, t) for 0.5 ≤ σ ≤ 10¹² and 2 ≤ t ≤ 10⁴ (docs/theory.md §2b.3); any other
    mechanism None (a declared plan of more micro-batches, or of random allocation outside
    that range, is refused by ``Ledger``; one fixed by a first charge gets the RDP filter).

    Example:
        >>> from privguard import mechanisms as M
        >>> envelope_of(M.SubsampledGaussian(1.1, 0.004))
        Envelope(noise_multiplier=1.1, sample_rate=0.004)
        >>> envelope_of(M.Gaussian(2.0)), envelope_of(M.Laplace(1.0))
        (Envelope(noise_multiplier=2.0, sample_rate=1.0), None)
    """
    if not isinstance(step, Mechanism):
        raise InvalidArgumentError("step", step, "must be a privguard mechanism")
    if type(step) is SubsampledGaussian:
        return Envelope(step.noise_multiplier, step.sample_rate)
    if type(step) is Gaussian:
        return Envelope(step.noise_multiplier, 1.0)
    if type(step) is AccumulatedSubsampledGaussian and step.aligned and \
            step.micro_batches <= MAX_ENVELOPE_MICRO_BATCHES:  # docs/theory.md §2b.1 (C3′)
        return Envelope(step.noise_multiplier, step.sample_rate, step.micro_batches)
    if type(step) is RandomAllocation and allocation_covered(step):  # docs/theory.md §2b.3
        return Envelope(step.noise_multiplier, 1.0, 1, step.steps)
    return None


def allocation_covered(step: RandomAllocation) -> bool:
    """Whether the epoch envelope of docs/theory.md §2b.3 is built for ``step``'s (σ, t)."""
    return (_alloc.MIN_SIGMA <= step.noise_multiplier <= _alloc.MAX_SIGMA
            and 2 <= step.steps <= _alloc.MAX_STEPS)


def envelope_steps_in(mechanism: Any, envelope: Envelope) -> int | None:
    """How many envelope steps a charge of ``mechanism`` amounts to, or None if outside.

    ``SubsampledGaussian(σ, q, k)`` with σ ≥ σ₀ and q ≤ q₀ is k steps, each
    dominated by the envelope step (docs/theory.md §2b, Lemma 1: subsampling
    less and adding more noise are post-processings). ``Gaussian(σ)`` with
    σ ≥ σ₀ is one step when q₀ = 1 (it is the q = 1 subsampled Gaussian).
    ``AccumulatedSubsampledGaussian(σ, q, 1, k)`` is ``SubsampledGaussian(σ, q,
    k)``. For an accumulated envelope (k₀ ≥ 2), ``AccumulatedSubsampledGaussian(σ,
    q₀, k₀, k, aligned=True)`` with σ ≥ σ₀ and the SAME q₀ and k₀ is k steps (docs/theory.md
    §2b.1, Lemma 1′: only adding noise is proved a post-processing there).
    Anything else — a smaller σ, a larger q, another q or micro-batch count
    under an accumulated envelope, another mechanism — is outside.

    Example:
        >>> from privguard import mechanisms as M
        >>> env = Envelope(1.0, 0.01)
        >>> envelope_steps_in(M.SubsampledGaussian(1.2, 0.005, steps=3), env)
        3
        >>> envelope_steps_in(M.SubsampledGaussian(0.9, 0.01), env) is None
        True
    """
    if not isinstance(mechanism, Mechanism):
        raise InvalidArgumentError("mechanism", mechanism, "must be a privguard mechanism")
    if not isinstance(envelope, Envelope):
        raise InvalidArgumentError("envelope", envelope, "must be a privguard Envelope")
    if envelope.allocation_steps:  # docs/theory.md §2b.3: an epoch at σ ≥ σ₀, the same t₀
        if (type(mechanism) is RandomAllocation
                and mechanism.steps == envelope.allocation_steps
                and mechanism.noise_multiplier >= envelope.noise_multiplier):
            return mechanism.epochs
        return None
    if envelope.micro_batches != 1:  # docs/theory.md §2b.1, Lemma 1′
        if (type(mechanism) is AccumulatedSubsampledGaussian
                and mechanism.aligned  # C3′: the PLD envelope is proved for aligned only
                and mechanism.micro_batches == envelope.micro_batches
                and mechanism.sample_rate == envelope.sample_rate
                and mechanism.noise_multiplier >= envelope.noise_multiplier):
            return mechanism.steps
        return None
    if type(mechanism) is SubsampledGaussian or (
            type(mechanism) is AccumulatedSubsampledGaussian and mechanism.micro_batches == 1):
        if (mechanism.noise_multiplier >= envelope.noise_multiplier
                and mechanism.sample_rate <= envelope.sample_rate):
            return mechanism.steps
        return None
    if type(mechanism) is Gaussian:
        if envelope.sample_rate == 1.0 and mechanism.noise_multiplier >= envelope.noise_multiplier:
            return 1
        return None
    return None


# ------------------------------------------------------------ PLD accounting
def _pld_module():
    # dp-accounting is a runtime dependency, imported on first use only.
    from dp_accounting.pld import privacy_loss_distribution

    return privacy_loss_distribution


def _mixture(envelope: Envelope) -> tuple[list[float], list[float]]:
    """The accumulated envelope's shifts j and weights b_j = Binom(k₀, q₀)(j), b_j > 0.

    P₀ = Σ_j b_j N(j, σ₀²) against Q₀ = N(0, σ₀²) (docs/theory.md §14, Lemma 14.1;
    §2b.1). A weight that underflows to 0 in floating point would drop mass from
    P₀, so it raises (the caller turns it into InvalidArgumentError: use the RDP filter).
    """
    k, q = envelope.micro_batches, envelope.sample_rate
    if q == 1.0:
        return [float(k)], [1.0]
    j = np.arange(k + 1)
    log_b = [math.lgamma(k + 1) - math.lgamma(i + 1) - math.lgamma(k - i + 1)
             + i * math.log(q) + (k - i) * math.log1p(-q) for i in j]
    weights = [math.exp(v) for v in log_b]
    if min(weights) <= 0.0:
        raise ArithmeticError(f"Binomial({k}, {q:g}) has weights below floating point")
    return [float(i) for i in j], weights


def _privacy_loss(envelope: Envelope, adjacency: Any) -> Any:
    """dp-accounting's privacy loss of one envelope step in one direction.

    k₀ = 1: ``GaussianPrivacyLoss(σ₀, sampling_prob=q₀)``. k₀ ≥ 2:
    ``MixtureGaussianPrivacyLoss(σ₀, [0..k₀], Binom(k₀, q₀))`` (dp_accounting/pld/
    privacy_loss_mechanism.py; the PLD of ``MixtureOfGaussiansDpEvent``): REMOVE
    is the pair (Σ_j b_j N(−j, σ₀²), N(0, σ₀²)), the mirror image x ↦ −x of
    (P₀, Q₀), and ADD is (N(0, σ₀²), Σ_j b_j N(j, σ₀²)) = (Q₀, P₀)
    (docs/theory.md §2b.1).
    """
    from dp_accounting.pld import privacy_loss_mechanism as plm

    if envelope.micro_batches == 1:
        return plm.GaussianPrivacyLoss(envelope.noise_multiplier, sensitivity=1.0,
                                       sampling_prob=envelope.sample_rate,
                                       adjacency_type=adjacency)
    shifts, weights = _mixture(envelope)
    return plm.MixtureGaussianPrivacyLoss(envelope.noise_multiplier, shifts, weights,
                                          adjacency_type=adjacency)


def _one_step_delta(envelope: Envelope, epsilon: float) -> float:
    """δ(ε) of ONE envelope step, max over remove and add (no discretisation).

    dp-accounting's hockey-stick of the one-step pair (closed form for k₀ = 1;
    for a mixture, its monotone inverse by binary search): remove =
    ((1−q)N(0,σ²) + qN(1,σ²), N(0,σ²)), add = the swap (docs/theory.md §2b,
    Lemma 1; dp-accounting's GaussianPrivacyLoss), or the mixture pair of §2b.1.
    Only used to answer T_A = 0 early; any T_A > 0 is certified by the PLD.
    """
    from dp_accounting.pld import privacy_loss_mechanism as plm

    # a list: dp-accounting 0.6's mixture class fails on a scalar ε (float() of a 1-array)
    return max(float(np.max(_privacy_loss(envelope, adjacency).get_delta_for_epsilon([epsilon])))
               for adjacency in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD))


def mixture_interval(envelope: Envelope) -> float:
    """The loss discretisation interval of an accumulated envelope's one-step PLD:
    max(DISCRETISATION, width / MIXTURE_POINTS), width the larger connect-the-dots
    loss range of the two directions (a coarser grid is still pessimistic)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    widths = []
    for adjacency in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD):
        bounds = _privacy_loss(envelope, adjacency).connect_dots_bounds()
        widths.append(bounds.epsilon_upper - bounds.epsilon_lower)
    return max(DISCRETISATION, max(widths) / MIXTURE_POINTS)


@functools.lru_cache(maxsize=64)
def _one_step_pld(envelope: Envelope):
    """dp-accounting's pessimistic PLD of one envelope step (both directions).

    Connect-the-dots discretisation (Doroshenko, Ghazi, Kamath, Kumar &
    Manurangsi 2022, Algorithm 1): the discrete pair dominates the true pair
    at every ε; the noise-tail mass beyond e^−50 is put at infinite loss.
    k₀ = 1: ``from_gaussian_mechanism``; k₀ ≥ 2: ``from_mixture_gaussian_mechanism``
    (the PLD dp-accounting's accountant builds for ``MixtureOfGaussiansDpEvent``),
    on a grid of at most :data:`MIXTURE_POINTS` points per direction.
    """
    from dp_accounting.pld import privacy_loss_mechanism as plm

    if envelope.allocation_steps:  # one epoch: docs/theory.md §2b.3 (stochastically larger loss)
        return _alloc.epoch_pld(envelope.noise_multiplier, envelope.allocation_steps)
    interval = DISCRETISATION
    pld_lib = _pld_module()
    if envelope.micro_batches == 1:
        bounds = _privacy_loss(envelope, plm.AdjacencyType.REMOVE).connect_dots_bounds()
        width = bounds.epsilon_upper - bounds.epsilon_lower
        if width / interval > MAX_PLD_POINTS:  # coarser grid: still pessimistic
            interval = width / MAX_PLD_POINTS
        pld = pld_lib.from_gaussian_mechanism(
            envelope.noise_multiplier, sensitivity=1.0, pessimistic_estimate=True,
            value_discretization_interval=interval, sampling_prob=envelope.sample_rate,
            use_connect_dots=True)
    else:  # docs/theory.md §2b.1: the mixture pair, both directions, pessimistic
        shifts, weights = _mixture(envelope)
        pld = pld_lib.from_mixture_gaussian_mechanism(
            envelope.noise_multiplier, shifts, weights, pessimistic_estimate=True,
            value_discretization_interval=mixture_interval(envelope), use_connect_dots=True)
    # Dense PMFs: dp-accounting's sparse self_compose evaluates size**T as a
    # Python integer first (seconds for T ~ 10⁶); the dense one is an FFT.
    remove = getattr(pld, "_pmf_remove", None)
    if remove is None or not hasattr(remove, "to_dense_pmf"):
        raise LedgerStateError("this dp-accounting version hides its PMFs; privguard cannot "
                               "certify the hybrid filter's T_A with it")
    add = None if getattr(pld, "_symmetric", False) else pld._pmf_add.to_dense_pmf()
    return pld_lib.PrivacyLossDistribution(remove.to_dense_pmf(), add)


def _negative_mass(pld: Any) -> float:
    """Total negative probability in the composed PMFs: FFT round-off made visible."""
    total = 0.0
    for name in ("_pmf_remove", "_pmf_add"):
        pmf = getattr(pld, name, None)
        if pmf is None:
            continue
        probs = getattr(pmf, "_probs", None)
        if probs is None:
            raise LedgerStateError("this dp-accounting version hides its PMFs; privguard "
                                   "cannot bound the FFT round-off of the hybrid filter's T_A")
        probs = np.asarray(probs)
        total += float(-probs[probs < 0].sum())
    return total


def certified_delta(envelope: Envelope, epsilon: float, steps: int) -> float:
    """δ at ε of ``steps`` envelope steps by pessimistic PLD, plus the round-off allowance.

    dp-accounting's value is max over remove and add of the hockey-stick of
    the T-fold composition of the pessimistic one-step PMF (FFT
    self-convolution; mass truncated from the tails, ≤ 1e−15, goes to
    infinite loss). We add ROUNDOFF_FACTOR × the negative mass of the
    composed PMFs for floating-point round-off. Zero steps give 0.

    Example:
        >>> d = certified_delta(Envelope(1.0, 0.01), 3.0, 2000)
        >>> 1e-7 < d < 1e-5
        True
    """
    if steps == 0:
        return 0.0
    if envelope.allocation_steps:  # epochs: docs/theory.md §2b.3
        return _alloc.certified_epoch_delta(envelope.noise_multiplier, envelope.allocation_steps,
                                            epsilon, steps)
    composed = _one_step_pld(envelope).self_compose(steps, tail_mass_truncation=TAIL_MASS)
    delta = float(composed.get_delta_for_epsilon(epsilon))
    return delta + ROUNDOFF_FACTOR * _negative_mass(composed)


def _rdp_guess(envelope: Envelope, epsilon: float, delta_a: float) -> int:
    """Non-adaptive RDP step count at (ε, δ_A): a cheap starting point for the search."""
    orders = np.array(DEFAULT_ORDERS)
    one = envelope.step()._rdp_checked(orders)
    budget = conv.rdp_budget_per_order(orders, epsilon, delta_a)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(one > 0, budget / one, np.inf)
    best = float(np.nanmax(t))
    return int(min(max(best, 1.0), MAX_STEPS))


@functools.lru_cache(maxsize=256)
def _envelope_steps(envelope: Envelope, epsilon: float, delta_a: float) -> int:
    if envelope.allocation_steps:  # T_A in epochs: docs/theory.md §2b.3
        return _alloc.envelope_epochs(envelope.noise_multiplier, envelope.allocation_steps,
                                      epsilon, delta_a)
    target = delta_a * (1.0 - MARGIN)
    # One step, exactly (closed form, no discretisation): if it already fails,
    # T_A = 0 and no PLD is built.
    if _one_step_delta(envelope, epsilon) > target:
        return 0
    memo: dict[int, float] = {0: 0.0}

    def f(t: int) -> float:
        if t not in memo:
            memo[t] = certified_delta(envelope, epsilon, t)
        return memo[t]

    # Bracket [lo, hi): f(lo) ≤ target < f(hi), galloping from the RDP count.
    guess = _rdp_guess(envelope, epsilon, delta_a)
    if f(guess) <= target:
        lo, hi = guess, None
        while hi is None:
            nxt = min(MAX_STEPS, max(lo + 1, math.ceil(lo * 1.125)))
            if f(nxt) <= target:
                if nxt == MAX_STEPS:
                    return MAX_STEPS
                lo = nxt
            else:
                hi = nxt
    else:
        lo, hi = 0, guess
        while lo == 0 and hi > 1:
            nxt = max(1, math.floor(hi / 1.125))
            if f(nxt) <= target:
                lo = nxt
            else:
                hi = nxt
    # Safeguarded interpolation on log δ (nearly linear in T over the bracket),
    # bisection whenever interpolation did not halve the bracket.
    bisect = lo == 0
    while hi - lo > 1:
        width = hi - lo
        if bisect or f(lo) <= 0:
            probe = (lo + hi) // 2
        else:
            a, b = math.log(f(lo)), math.log(f(hi))
            probe = lo + round((math.log(target) - a) / (b - a) * width) if b > a else (lo + hi) // 2
        probe = min(max(probe, lo + 1), hi - 1)
        if f(probe) <= target:
            lo = probe
        else:
            hi = probe
        bisect = (hi - lo) * 2 > width and not bisect
    return lo


def envelope_steps(envelope: Envelope, epsilon: float, delta_a: float) -> int:
    """T_A: the largest T such that T envelope steps are certified (ε, δ_A)-DP.

    Certified means dp-accounting's pessimistic PLD δ(ε) (max over remove and
    add, Zhu, Dong & Wang 2022, Thm 10 per direction) plus the round-off
    allowance stays within δ_A·(1 − MARGIN); see docs/theory.md §2b for the
    error terms. Cached process-wide; the first call for an envelope costs
    about a second (a galloping search, then interpolation, reusing one
    one-step PLD), later calls are free.

    Example:
        >>> envelope_steps(Envelope(1.0, 0.01), 3.0, 0.9e-5)
        2632
    """
    if not isinstance(envelope, Envelope):
        raise InvalidArgumentError("envelope", envelope, "must be a privguard Envelope")
    epsilon = check.positive_finite("epsilon", epsilon)
    delta_a = check.delta("delta_a", delta_a, minimum=0.0)
    try:
        # numpy's overflow, division by zero and invalid operations raise
        # (FloatingPointError, an ArithmeticError: refused below) instead of warning: a σ or q
        # the PLD cannot represent (σ = 1e-300, q = 1e-300) is refused, never a RuntimeWarning
        # that `python -W error` lets escape, or an inf carried on silently (underflow stays quiet)
        with np.errstate(over="raise", divide="raise", invalid="raise"):
            return _envelope_steps(envelope, epsilon, delta_a)
    except (ValueError, ArithmeticError, MemoryError) as exc:
        # name what the user passed (the planned step's σ and q), not this internal argument
        what = (f"random-allocation epochs with noise_multiplier={envelope.noise_multiplier:g} "
                f"and steps={envelope.allocation_steps}" if envelope.allocation_steps else
                f"steps with noise_multiplier={envelope.noise_multiplier:g} and "
                f"sample_rate={envelope.sample_rate:g}")
        raise InvalidArgumentError(
            "noise_multiplier", envelope.noise_multiplier,
            f"filter='hybrid' cannot plan {what}"
            f"{_micro(envelope, ' and micro_batches={}')}: their PLD accounting fails ({type(exc).__name__}: {exc}); use filter='rdp' for "
            "such a step") from None


def _micro(envelope: Envelope, text: str) -> str:
    return "" if envelope.micro_batches == 1 else text.format(envelope.micro_batches)


def envelope_text(envelope: Envelope) -> str:
    """What lies inside the envelope, in words: ``σ≥1, q≤0.01`` or, accumulated,
    ``σ≥1, q=0.01, 4 micro-batches`` (docs/theory.md §2b.1), or ``random-allocation
    epochs with σ≥1, t=100`` (§2b.3)."""
    if envelope.allocation_steps:
        return (f"random-allocation epochs with σ≥{exact(envelope.noise_multiplier)}, "
                f"t={envelope.allocation_steps}")
    if envelope.micro_batches == 1:
        # the plan as stated, never rounded (review rlo2: q≤0.1234564 read q≤0.123456)
        return f"σ≥{exact(envelope.noise_multiplier)}, q≤{exact(envelope.sample_rate)}"
    return (f"σ≥{exact(envelope.noise_multiplier)}, q={exact(envelope.sample_rate)}, "
            f"{envelope.micro_batches} micro-batches")


# ------------------------------------------------------------------ the rule
def _exact_delta_b(delta: float, delta_a: float) -> float:
    """The largest float δ_B with δ_A + δ_B ≤ δ exactly (docs/theory.md §2b: the interaction
    is (ε, δ_A + δ_B)-DP). Before (task fp) the test was the float sum, which rounds: the
    exact sum could lie up to half an ulp of δ above δ (for δ_A < δ/2; from δ/2 on,
    δ − δ_A is exact, Sterbenz)."""
    return float_below(Fraction(delta) - Fraction(delta_a))


def admission_rule(a_alive, a_count, inside_steps, b_admits, steps_a):
    """The hybrid's decision for one charge, vectorised over numpy arrays.

    Args:
        a_alive: part A not yet killed.
        a_count: envelope steps A has admitted so far.
        inside_steps: envelope steps in the charge, or −1 if it is outside.
        b_admits: part B (the RDP filter, charged for every admitted step, C2)
            admits the spent curve after the charge.
        steps_a: T_A.

    Returns:
        (admitted, a_alive_after, a_count_after). A admits iff alive, the
        charge is inside and the count stays ≤ T_A; the charge is admitted iff
        A or B admits; a charge admitted without A kills A for good (C1).

    Example:
        >>> [bool(x) for x in admission_rule(True, 10, -1, True, 20)]  # outside, B admits
        [True, False, True]
    """
    inside = np.greater_equal(inside_steps, 0)
    a_ok = np.logical_and(np.logical_and(a_alive, inside),
                          np.less_equal(np.add(a_count, inside_steps), steps_a))
    admitted = np.logical_or(a_ok, b_admits)
    alive = np.logical_and(a_alive, np.logical_not(np.logical_and(admitted, np.logical_not(a_ok))))
    count = np.where(a_ok, np.add(a_count, inside_steps), a_count)
    return admitted, alive, count


@dataclasses.dataclass(frozen=True)
class HybridState:
    """Part A's state: envelope steps admitted so far and whether A is alive."""

    a_count: int
    a_alive: bool


class HybridFilter:
    """Admit a charge if part A (PLD envelope) or part B (RDP filter) admits it.

    The interaction is (ε, δ)-DP with δ = δ_A + δ_B (docs/theory.md §2b).

    Args:
        epsilon: target ε.
        delta: total δ.
        envelope: the envelope (usually :func:`envelope_of` the plan's step).
        orders: the ledger's grid of orders (part B).
        shares: how part B splits δ_B over orders.
        delta_a: part A's share, in (0, δ); default 0.9·δ.
        steps_a: T_A; default and maximum :func:`envelope_steps`.

    Example:
        >>> import numpy as np
        >>> from privguard import DEFAULT_ORDERS, Concentrated, mechanisms as M
        >>> step = M.SubsampledGaussian(1.0, 0.01)
        >>> f = HybridFilter(3.0, 1e-5, envelope_of(step), np.array(DEFAULT_ORDERS), Concentrated())
        >>> f.fix(step.rdp(DEFAULT_ORDERS))
        >>> f.steps_a
        2662
        >>> ok, state = f.decide(step.rdp(DEFAULT_ORDERS), step, 1)
        >>> ok, state
        (True, HybridState(a_count=1, a_alive=True))
    """

    kind = "hybrid"

    def __init__(self, epsilon: float, delta: float, envelope: Envelope, orders: Any,
                 shares: DeltaShares, *, delta_a: float | None = None,
                 steps_a: int | None = None, certify: bool = True) -> None:
        self.epsilon = check.positive_finite("epsilon", epsilon)
        self.delta = check.delta("delta", delta)
        if not isinstance(envelope, Envelope):
            raise InvalidArgumentError("envelope", envelope, "must be a privguard Envelope")
        if not isinstance(shares, DeltaShares):
            raise InvalidArgumentError("shares", shares, "must be a privguard DeltaShares rule")
        self.envelope = envelope
        self.orders = check.orders("orders", orders)
        if delta_a is None:
            delta_a = DEFAULT_SHARE_A * self.delta
        else:
            delta_a = check.delta("delta_a", delta_a, minimum=0.0)
            if not delta_a < self.delta:
                raise InvalidArgumentError("delta_a", delta_a,
                                           f"must lie in the open interval (0, delta={self.delta})")
        self.delta_a = float(delta_a)
        delta_b = _exact_delta_b(self.delta, self.delta_a)
        # The δ_B before task fp (fl(δ_A + δ_B) ≤ δ, the exact sum up to half an ulp over):
        # Concentrated's order is still chosen at it, so every fix record reads as before,
        # and a journal re-read admits what it admitted (_filters.DPFilter.shape_delta).
        float_delta_b = self.delta - self.delta_a
        while float_delta_b + self.delta_a > self.delta:
            float_delta_b = math.nextafter(float_delta_b, 0.0)
        # certify=False only for a T_A read back from a ledger's own (chained, possibly
        # keyed) journal, where it was certified when fixed; privguard verify re-certifies.
        certified = (envelope_steps(envelope, self.epsilon, self.delta_a)
                     if certify or steps_a is None else int(steps_a))
        if steps_a is None:
            steps_a = certified
        else:
            if isinstance(steps_a, bool) or not isinstance(steps_a, (int, np.integer)) or steps_a < 0:
                raise InvalidArgumentError("steps_a", steps_a, "must be an integer >= 0")
            if steps_a > certified:
                raise InvalidArgumentError(
                    "steps_a", steps_a,
                    f"exceeds the {certified} envelope steps PLD accounting certifies at "
                    f"(ε={self.epsilon:g}, δ_A={self.delta_a:g})")
        self.steps_a = int(steps_a)
        # Part B (docs/theory.md §2): the RDP filter at δ_B.
        self.fallback = DPFilter(self.epsilon, delta_b, shares, self.orders,
                                 shape_delta=float_delta_b)
        if not shares.needs_plan:
            self.fallback.weights = self.fallback.resolve_weights(None)
        self._state = HybridState(0, True)

    # ------------------------------------------------------------ decisions
    @property
    def shares(self) -> DeltaShares:
        return self.fallback.shares

    @property
    def delta_b(self) -> float:
        return self.fallback.delta

    @property
    def weights(self) -> np.ndarray | None:
        """Part B's δ-share weights (None until fixed)."""
        return self.fallback.weights

    def fix(self, plan_curve: np.ndarray | None) -> None:
        """Fix part B's weights once, from the plan's curve, before any output."""
        if self.fallback.weights is None:
            self.fallback.weights = self.fallback.resolve_weights(plan_curve)

    def decide(self, spent_after: np.ndarray, mechanism: Mechanism, times: int = 1
               ) -> tuple[bool, HybridState]:
        """Would ``times`` charges of ``mechanism`` all be admitted, and the state after.

        ``spent_after`` is the ledger's spent curve including these charges (so
        part B is charged for every admitted step, C2). Pure: nothing changes
        until :meth:`apply`. O(1) in the number of past charges; k identical
        charges at once give the same decision and state as k single ones.
        """
        weights = self.fallback.weights
        if weights is None:
            raise LedgerStateError("hybrid filter used before fix(): part B's weights are unset")
        times = check.positive_int("times", times)
        spent_after = np.asarray(spent_after, dtype=float)
        if spent_after.shape != self.orders.shape:
            raise LedgerStateError(f"spent curve of shape {spent_after.shape} does not match "
                                   f"the filter's {self.orders.size} orders")
        return self.decide_with(self.fallback.admits(spent_after, weights), mechanism, times)

    def a_admits(self, mechanism: Mechanism, times: int) -> bool:
        """Whether part A alone admits ``times`` charges of ``mechanism`` (O(1)): alive,
        inside the envelope and within T_A (the ``a_ok`` of :func:`admission_rule`)."""
        s = self._state
        if not s.a_alive:
            return False
        k = envelope_steps_in(mechanism, self.envelope)
        return k is not None and s.a_count + k * times <= self.steps_a

    def decide_with(self, b_ok: bool, mechanism: Mechanism, times: int
                    ) -> tuple[bool, HybridState]:
        """:meth:`decide` given part B's answer ``b_ok`` for the spent curve after the
        charges (the repeated-charge fast path knows it without the curve,
        privguard/_accounting/_fastpath.py). When :meth:`a_admits`, ``b_ok`` does not matter."""
        k = envelope_steps_in(mechanism, self.envelope)
        inside = -1 if k is None else k * times
        s = self._state
        admitted, alive, count = admission_rule(s.a_alive, s.a_count, inside, b_ok, self.steps_a)
        if not admitted:
            return False, s
        if s.a_alive and not alive and k:
            # ``times`` identical charges are ``times`` charges (docs/theory.md §2b): those
            # that fit in T_A are A-admissible one by one and raise c; the first that does
            # not (B admits it, since B admits the whole block and its spent only grows)
            # closes A. The state is then the one ``times`` single charges reach, which is
            # what a replay of the journal's merged run row reaches too (issue 26). No
            # decision changes: a closed A decides nothing, whatever its count.
            count = s.a_count + k * min(times, (self.steps_a - s.a_count) // k)
        return True, HybridState(int(count), bool(alive))

    def apply(self, state: HybridState) -> None:
        """Commit the state :meth:`decide` returned for an admitted charge."""
        if not isinstance(state, HybridState):
            raise LedgerStateError(f"not a hybrid filter state: {state!r}")
        self._check(state)
        old = self._state
        if state.a_count < old.a_count or (state.a_alive and not old.a_alive):
            raise LedgerStateError(f"hybrid filter state cannot go from {old} to {state}: "
                                   "part A's count never decreases and a closed A stays closed")
        self._state = state

    # ------------------------------------------------------------ reporting
    @property
    def a_count(self) -> int:
        return self._state.a_count

    @property
    def a_alive(self) -> bool:
        return self._state.a_alive

    def headroom(self, spent: np.ndarray) -> np.ndarray | None:
        """Part B's per-order RDP budget left (None until its weights are fixed)."""
        if self.fallback.weights is None:
            return None
        return self.fallback.headroom(spent, self.fallback.weights)

    def describe(self) -> str:
        env = self.envelope
        unit = "epochs" if env.allocation_steps else "envelope steps"  # T_A's unit (§2b.3)
        a = (f"{self.steps_a - self.a_count} of {self.steps_a} {unit} left"
             if self.a_alive else "envelope left, part A closed")
        # the target as stated, never rounded (review lo2)
        return (f"(ε={exact(self.epsilon)}, δ={exact(self.delta)}) hybrid filter: PLD envelope "
                f"{envelope_text(env)} at δ_A={exact(self.delta_a)} "
                f"({a}), RDP fallback at δ_B={exact(self.delta_b)}")

    # -------------------------------------------------------- serialisation
    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "epsilon": self.epsilon, "delta": self.delta,
                "delta_a": self.delta_a, "steps_a": self.steps_a,
                "envelope": self.envelope.to_dict(), "shares": self.shares.to_dict()}

    @classmethod
    def from_config(cls, config: Any, orders: Any) -> HybridFilter:
        """Rebuild from :meth:`config`; T_A is re-certified (fail closed if it grew)."""
        keys = {"kind", "epsilon", "delta", "delta_a", "steps_a", "envelope", "shares"}
        if not isinstance(config, dict) or set(config) != keys or config["kind"] != cls.kind:
            raise LedgerStateError(f"not a hybrid filter configuration: {config!r}")
        try:
            return cls(config["epsilon"], config["delta"], Envelope.from_dict(config["envelope"]),
                       orders, shares_from_dict(config["shares"]), delta_a=config["delta_a"],
                       steps_a=config["steps_a"])
        except InvalidArgumentError as exc:
            raise LedgerStateError(f"hybrid filter configuration does not load: {exc}") from exc

    def state(self) -> dict[str, Any]:
        w = self.fallback.weights
        return {"a_count": self.a_count, "a_alive": self.a_alive,
                "weights": None if w is None else w.tolist()}

    def load_state(self, data: Any) -> None:
        """Restore :meth:`state` output; anything inconsistent raises LedgerStateError."""
        if not isinstance(data, dict) or set(data) != {"a_count", "a_alive", "weights"}:
            raise LedgerStateError(f"not a hybrid filter state: {data!r}")
        count, alive, weights = data["a_count"], data["a_alive"], data["weights"]
        if isinstance(count, bool) or not isinstance(count, int) or not isinstance(alive, bool):
            raise LedgerStateError(f"hybrid filter state has bad types: {data!r}")
        state = HybridState(count, alive)
        self._check(state)
        if weights is not None:
            try:
                w = np.array(weights, dtype=float)
            except (TypeError, ValueError):
                raise LedgerStateError(f"hybrid filter weights unreadable: {weights!r}") from None
            if (w.shape != self.orders.shape or not np.all(np.isfinite(w)) or np.any(w < 0)
                    or w.sum() > 1 + 1e-12):
                raise LedgerStateError(f"hybrid filter weights are invalid: {weights!r}")
            if self.fallback.weights is not None and not np.array_equal(w, self.fallback.weights):
                raise LedgerStateError("recorded part-B weights differ from the fixed ones")
        self._state = state
        if weights is not None:
            self.fallback.weights = w

    def _check(self, state: HybridState) -> None:
        if not (0 <= state.a_count <= self.steps_a):
            raise LedgerStateError(f"part A's count {state.a_count} is outside [0, T_A={self.steps_a}]")
