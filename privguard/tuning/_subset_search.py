"""Subset tuning (seed 000, Koskela & Kulkarni 2023): tune on a random subset, then train.

1. Draw X₁ ⊂ X by Poisson sampling with rate q (OS entropy unless seeded).
2. Run a random-K tuner on X₁ (its own protocol: bound, child ledgers,
   only the best comes back).
3. Extrapolate the selected hyperparameters to the final training set.
4. Train the final model on X ∖ X₁ (variant 1) or X (variant 2).

The whole plan — ``privguard.mechanisms.SubsetTuning(tuning, final, q,
variant)`` — is charged to the ledger once, before anything runs; the tuner
then charges its own bound to a strict child whose budget is exactly that
bound, and the final training runs under a strict child bounded by the final
curve the plan assumed.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._accounting._accounting import check_label
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._errors import InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard._mechanisms._base import Mechanism
from privguard._mechanisms._curve import RDPCurve
from privguard._mechanisms._subset import SubsetTuning
from privguard.tuning._base import (
    CandidateCosts,
    TuningPlan,
    TuningResult,
    check_copyable,
    check_ledger,
    check_objective,
    check_seed,
    held,
    make_rng,
    own_copy,
    sealed,
)
from privguard.tuning._random_search import RandomSearch
from privguard.tuning._rehearse import Rehearsal, call_with_child, rehearse_candidate


def paper_extrapolation(optimizer: str = "sgd", lr_key: str = "lr") -> Callable[[dict, float], dict]:
    """Seed 000 §3.2: keep clipping norm, σ, sample rate and steps; scale the
    DP-SGD learning rate by the ratio of dataset sizes (eq. 3.5); keep Adam's.

    The ratio used is the expected one, (1−q)/q (variant 1) or 1/q (variant
    2), which does not depend on the private data; the actual subset sizes
    would leak the dataset size into the final model.
    """
    if not isinstance(optimizer, str) or optimizer not in ("sgd", "adam"):
        raise InvalidArgumentError("optimizer", optimizer, "must be 'sgd' or 'adam'")
    if not isinstance(lr_key, str):  # an array raised TypeError at the first call (review fs)
        raise InvalidArgumentError("lr_key", check.short(lr_key), "must be a str")

    def rule(params: dict, scale: float) -> dict:
        # review fs: a non-dict, a bad scale or a learning rate that cannot be scaled
        # raised the built-in of the line that met it
        if not isinstance(params, Mapping):
            raise InvalidArgumentError("params", check.short(params), "must be a dict")
        factor = check.positive_finite("scale", scale)
        out = dict(params)
        if optimizer == "sgd" and lr_key in out:
            lr = out[lr_key]
            x = check._real(lr)
            if x is None or not math.isfinite(x * factor):
                raise InvalidArgumentError(f"params[{lr_key!r}]", check.short(lr),
                                           "must be a real number whose scaled value is finite")
            out[lr_key] = lr * factor
        return out

    return rule


@dataclasses.dataclass(frozen=True)
class SubsetResult:
    """Everything subset tuning releases: the winner on X₁ and the final model.

    Not released, on purpose: K, how many candidates failed, the subset X₁
    and its size (see :class:`TuningResult`).

    Attributes:
        selected: False if no candidate on the subset produced a result
            (then no final model is trained).
        params: the final hyperparameters (``tuned_params`` after extrapolation).
        tuned_params: the hyperparameters selected on the subset.
        artifact: what ``final_objective`` returned (None if it failed).
        trained: True if the final training returned; False if it raised
            (⊥: its exception is dropped, as a candidate's is) or did not run.
        cost: the whole plan charged to the ledger.
        seeded: True if the subset, K or the draws came from a fixed seed.
    """

    selected: bool
    params: dict | None
    tuned_params: dict | None
    artifact: Any
    trained: bool
    cost: Mechanism
    seeded: bool


class SubsetSearch:
    """Random-K tuning on a Poisson(q) subset, extrapolation, final training.

    Args:
        tuner: a :class:`RandomSearch` (Poisson runs by default in the paper)
            whose ``cost`` describes ONE candidate on the subset.
        q: the rate of the Poisson subsample X₁, in (0, 1).
        final_cost: the final training's mechanism, or ``params -> mechanism``
            (the plan then uses the order-wise maximum over the candidates).
            The extrapolation must not change it (the default rule only
            scales the learning rate); the final child ledger enforces it.
        variant: 1 (final model on X ∖ X₁) or 2 (on X).
        extrapolate: ``(params, scale) -> params``; default
            :func:`paper_extrapolation` ("sgd"). It must be a function of
            its arguments only; it is tried on every candidate of a finite
            space (one draw of an infinite one) before anything is charged.
        seed: ONLY for tests (a predictable subset breaks the guarantee).

    Raises:
        InvalidArgumentError: any argument out of its domain.

    Example:
        >>> from privguard import Ledger, mechanisms as M
        >>> from privguard.tuning import Poisson, RandomSearch, SubsetSearch
        >>> step = M.SubsampledGaussian(1.0, 0.05, steps=100)
        >>> tuner = RandomSearch({"lr": [0.1, 0.5]}, Poisson(5.0), cost=step, progress=False)
        >>> search = SubsetSearch(tuner, q=0.1, final_cost=step, variant=1)
        >>> round(search.plan(1e-5).epsilon, 3) < round(tuner.plan(1e-5).epsilon, 3)
        True
    """

    def __init__(self, tuner: RandomSearch, q: float, *, final_cost, variant: int = 1,
                 extrapolate: Callable[[dict, float], dict] | None = None,
                 seed: int | None = None) -> None:
        if not isinstance(tuner, RandomSearch):
            raise InvalidArgumentError("tuner", tuner, "must be a RandomSearch")
        self.tuner = tuner
        rate = check._as_float("q", q)
        if not 0.0 < rate < 1.0:  # q = 1 would tune on all of X: not a subset
            raise InvalidArgumentError("q", q, "must lie in (0, 1) (the subset's sampling rate)")
        self.q = rate
        if (isinstance(variant, bool) or not isinstance(variant, numbers.Integral)
                or variant not in (1, 2)):
            raise InvalidArgumentError("variant", variant, "must be 1 or 2")
        self.variant: int = int(variant)
        self.final_costs: CandidateCosts = CandidateCosts(final_cost, tuner.space, "final_cost")
        self.final_cost = final_cost
        if extrapolate is not None and not callable(extrapolate):
            raise InvalidArgumentError("extrapolate", extrapolate,
                                       "must be None or callable(params, scale) -> params")
        self.extrapolate: Callable[[dict, float], dict] = (extrapolate
                                                            or paper_extrapolation("sgd"))
        self.seed: int | None = check_seed(seed)
        self._check_extrapolation()

    def _check_extrapolation(self) -> None:
        space = self.tuner.space
        probes = space.candidates() if space.is_finite else [space.sample(np.random.default_rng(0))]
        check_copyable("tuner.space", space.choices())  # each call below gets its own copy
        for params in probes:
            try:  # a copy: an extrapolation that edits a value in place left the space edited
                out = self.extrapolate(own_copy(params), self.scale)
            except Exception as exc:
                raise InvalidArgumentError(
                    "extrapolate", self.extrapolate,
                    f"raised {type(exc).__name__} for {params!r}") from None
            if not isinstance(out, dict):
                raise InvalidArgumentError(
                    "extrapolate", self.extrapolate,
                    f"returned {out!r} for {params!r}, not a dict of hyperparameters")
            check_copyable("extrapolate", out)  # the final training gets its own copy

    @property
    def scale(self) -> float:
        """Expected |final set| / |X₁|: (1−q)/q (variant 1) or 1/q (variant 2)."""
        return (1 - self.q) / self.q if self.variant == 1 else 1 / self.q

    def cost(self, orders=None) -> SubsetTuning:
        """The whole plan as one mechanism (tuning on X₁ + final training)."""
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        final = self.final_costs.bound(grid)
        return SubsetTuning(self.tuner.cost(grid), RDPCurve._trusted(grid, final),
                            self.q, self.variant)

    def plan(self, delta: float, orders=None) -> TuningPlan:
        d = check.delta("delta", delta)
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        mech = self.cost(grid)
        curve = mech._rdp_checked(grid)
        inner = self.tuner.plan(d, grid)
        # the naive counterpart of the same work (task adv9): ⌈E[K]⌉ runs and the final
        # training on the whole data set, composed as if fixed in advance
        runs = math.ceil(inner.expected_runs)
        naive = RDPCurve._trusted(grid, runs * self.tuner._per_candidate_curve(grid)
                                  + mech.final._rdp_checked(grid)).epsilon(d)
        return TuningPlan(mech, grid, curve, RDPCurve._trusted(grid, curve).epsilon(d), d,
                          inner.expected_runs, naive, with_final=True)

    def rehearse(self, tune_objective: Callable[[dict, Ledger, np.ndarray], Any],
                 final_objective: Callable[[dict, Ledger, np.ndarray, Any], Any],
                 n_examples: int, *, orders: Any = None) -> Rehearsal:
        """Rehearse before :meth:`run`: one candidate on a subset, then the final training.

        Nothing is charged: both objectives run under throwaway child ledgers
        (the per-candidate cost, then the final cost), connected to no real
        ledger. Bind the objectives to public or synthetic data of
        ``n_examples`` examples: a rehearsal shows everything.

        Returns:
            A :class:`privguard.tuning.Rehearsal`: the extrapolated params, the
            tuned candidate's score and the final objective's artifact.

        Raises:
            Whatever an objective raises, as it is; BudgetExhausted (naming the
            cost and the remedy) when a child refused; InvalidArgumentError for a
            tuning objective that returned no finite score.
        """
        check_objective(tune_objective, "tune_objective", ("params", "child_ledger", "indices"))
        check_objective(final_objective, "final_objective",
                        ("params", "child_ledger", "indices", "tuned_artifact"))
        n = check.positive_int("n_examples", n_examples)
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        subset, final_idx = self._draw(n)
        tuned = rehearse_candidate(self.tuner, lambda p, c: tune_objective(p, c, subset),
                                   grid, self.seed)
        params = self.extrapolate(dict(tuned.params), self.scale)
        final = self.cost(grid).final
        artifact = call_with_child(
            # its own copy, as in run: its in-place edit showed in the rehearsal's params
            lambda child: final_objective(own_copy(params), child, final_idx, tuned.artifact),
            grid, final._rdp_checked(grid), final)
        return Rehearsal(params, tuned.score, artifact)

    def run(self, tune_objective: Callable[[dict, Ledger, np.ndarray], Any],
            final_objective: Callable[[dict, Ledger, np.ndarray, Any], Any], ledger: Ledger,
            n_examples: int, *, label: str | None = "subset tuning") -> SubsetResult:
        """Charge the plan, tune on X₁, extrapolate, train the final model.

        Rehearse first (:meth:`rehearse`): a run hides every failed candidate.

        ``tune_objective(params, child, subset_indices)`` trains and scores
        one candidate on X₁ (⊥ rules as in :meth:`RandomSearch.run`);
        ``final_objective(params, child, indices, tuned_artifact)`` trains
        the final model on the final indices (it may start from the tuned
        artifact, Remark 8) and returns it. If it raises, the result has
        ``trained=False`` and no artifact, and its exception is dropped.

        Raises:
            InvalidArgumentError: a bad argument; raised before the charge.
            BudgetExhausted: the ledger refuses the plan; nothing ran.
            KeyboardInterrupt: interrupted mid-run (a fresh one, carrying
                nothing of the run; the subset is not released either).
            TuningAborted: anything else escaped mid-run (cause withheld).
        """
        check_objective(tune_objective, "tune_objective", ("params", "child_ledger", "indices"))
        check_objective(final_objective, "final_objective",
                        ("params", "child_ledger", "indices", "tuned_artifact"))
        check_ledger(ledger)
        n = check.positive_int("n_examples", n_examples)
        label = check_label(label)
        inner_label = f"{label}: tuning on the subset"
        # the inner tuner checks its runs only inside its own run(), after this plan is
        # charged: a law it cannot sample exactly ended the run there as TuningAborted with
        # the whole plan spent and nothing run (review at); refused here, before the charge
        self.tuner.runs.check_sampleable("tuner.runs")
        # the inner run checks its space's values are copyable after the plan is charged
        check_copyable("tuner.space", self.tuner.space.choices())
        mech = self.cost(ledger.orders)
        mech._rdp_checked(ledger.orders)
        # The subset is drawn before the charge: a draw that cannot be made here
        # (n_examples=10**12: no memory) is refused with nothing charged. It does not
        # depend on the data, and a refused charge drops it before anything runs.
        drawn = [self._draw(n)]
        try:
            ledger.charge(mech, label=label)  # the whole plan, before anything runs
        except BaseException:
            drawn.clear()  # not even in this frame's locals of the refusal's traceback
            raise
        with held(ledger):  # the candidates and the final training charge their children
            return sealed(lambda: self._search(tune_objective, final_objective, ledger, drawn,
                                               mech, inner_label))

    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """X₁ by Poisson sampling with rate q, and the final indices (X ∖ X₁ or X)."""
        try:
            in_subset = make_rng(self.seed).random(n) < self.q  # Poisson sampling with rate q
            subset = np.flatnonzero(in_subset)
            final_idx = np.flatnonzero(~in_subset) if self.variant == 1 else np.arange(n)
        except (MemoryError, ValueError, OverflowError) as exc:
            raise InvalidArgumentError(
                "n_examples", n, f"its Poisson subset cannot be drawn in this process "
                f"({type(exc).__name__}: the draw holds about 17 bytes per example); "
                "nothing was charged") from None
        return subset, final_idx

    def _search(self, tune_objective: Callable, final_objective: Callable, ledger: Ledger,
                drawn: list, mech: SubsetTuning, inner_label: str) -> SubsetResult:
        """Everything after the charge; the subset lives only in this frame."""
        subset, final_idx = drawn.pop()
        tuning_ledger = ledger.child(mech.tuning)
        # each candidate its own copy of the indices: an in-place sort or shuffle (by its
        # losses, say) reached every later candidate, whose runs were then not independent
        result: TuningResult = self.tuner.run(
            lambda p, child: tune_objective(p, child, subset.copy()), tuning_ledger,
            label=inner_label)
        seeded = self.seed is not None or result.seeded
        if not result.selected:
            return SubsetResult(False, None, None, None, False, mech, seeded)
        params = self.extrapolate(dict(result.params or {}), self.scale)
        final_ledger = ledger.child(mech.final)
        try:
            artifact, trained = final_objective(own_copy(params), final_ledger, final_idx,
                                                result.artifact), True
        except KeyboardInterrupt:
            raise  # the user's interrupt; sealed() replaces it
        except BaseException:  # the final training's failure (SystemExit too) is its output ⊥
            artifact, trained = None, False
        return SubsetResult(True, params, dict(result.params or {}), artifact, trained, mech,
                            seeded)
