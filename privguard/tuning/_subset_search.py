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
from collections.abc import Callable
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._base import Mechanism
from privguard._curve import RDPCurve
from privguard._errors import InvalidArgumentError
from privguard._ledger import Ledger
from privguard._orders import DEFAULT_ORDERS
from privguard._subset import SubsetTuning
from privguard.tuning._base import (
    TuningPlan,
    TuningResult,
    check_cost,
    make_rng,
    uniform_bound,
)
from privguard.tuning._random_search import RandomSearch


def paper_extrapolation(optimizer: str = "sgd", lr_key: str = "lr") -> Callable[[dict, float], dict]:
    """Seed 000 §3.2: keep clipping norm, σ, sample rate and steps; scale the
    DP-SGD learning rate by the ratio of dataset sizes (eq. 3.5); keep Adam's.

    The ratio used is the expected one, (1−q)/q (variant 1) or 1/q (variant
    2), which does not depend on the private data; the actual subset sizes
    would leak the dataset size into the final model.
    """
    if optimizer not in ("sgd", "adam"):
        raise InvalidArgumentError("optimizer", optimizer, "must be 'sgd' or 'adam'")

    def rule(params: dict, scale: float) -> dict:
        out = dict(params)
        if optimizer == "sgd" and lr_key in out:
            out[lr_key] = out[lr_key] * scale
        return out

    return rule


@dataclasses.dataclass(frozen=True)
class SubsetResult:
    """What subset tuning releases: the final hyperparameters and the final model.

    ``tuned_params`` are the hyperparameters selected on the subset,
    ``params`` after extrapolation; ``runs`` is K (data-independent).
    """

    selected: bool
    params: dict | None
    tuned_params: dict | None
    artifact: Any
    runs: int
    cost: Mechanism
    seeded: bool


class SubsetSearch:
    """Random-K tuning on a Poisson(q) subset, extrapolation, final training.

    Args:
        tuner: a :class:`RandomSearch` (Poisson runs by default in the paper)
            whose ``cost`` describes ONE candidate on the subset.
        q: the rate of the Poisson subsample X₁.
        final_cost: the final training's mechanism, or ``params -> mechanism``
            (the plan then uses the order-wise maximum over the candidates).
            The extrapolation must not change it (the default rule only
            scales the learning rate); the final child ledger enforces it.
        variant: 1 (final model on X ∖ X₁) or 2 (on X).
        extrapolate: ``(params, scale) -> params``; default
            :func:`paper_extrapolation` ("sgd").
        seed: ONLY for tests (a predictable subset breaks the guarantee).

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
        self.q = check.fraction("q", q)
        if self.q == 1.0:
            raise InvalidArgumentError("q", q, "must be < 1 (a subset)")
        if variant not in (1, 2):
            raise InvalidArgumentError("variant", variant, "must be 1 or 2")
        self.variant = variant
        self.final_cost = check_cost(final_cost, tuner.space, "final_cost")
        self.extrapolate = extrapolate or paper_extrapolation("sgd")
        self.seed = seed

    @property
    def scale(self) -> float:
        """Expected |final set| / |X₁|: (1−q)/q (variant 1) or 1/q (variant 2)."""
        return (1 - self.q) / self.q if self.variant == 1 else 1 / self.q

    def cost(self, orders=None) -> SubsetTuning:
        """The whole plan as one mechanism (tuning on X₁ + final training)."""
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        final = uniform_bound(self.final_cost, self.tuner.space, grid, "final_cost")
        return SubsetTuning(self.tuner.cost(grid), RDPCurve._trusted(grid, final),
                            self.q, self.variant)

    def plan(self, delta: float, orders=None) -> TuningPlan:
        d = check.delta("delta", delta)
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        mech = self.cost(grid)
        curve = mech._rdp_checked(grid)
        inner = self.tuner.plan(d, grid)
        return TuningPlan(mech, grid, curve, RDPCurve._trusted(grid, curve).epsilon(d), d,
                          inner.expected_runs, inner.naive_epsilon)

    def run(self, tune_objective: Callable[[dict, Ledger, np.ndarray], Any],
            final_objective: Callable[[dict, Ledger, np.ndarray, Any], Any], ledger: Ledger,
            n_examples: int, *, label: str = "subset tuning") -> SubsetResult:
        """Charge the plan, tune on X₁, extrapolate, train the final model.

        ``tune_objective(params, child, subset_indices)`` trains and scores
        one candidate on X₁; ``final_objective(params, child, indices,
        tuned_artifact)`` trains the final model on the final indices (it may
        start from the tuned artifact, Remark 8) and returns it.

        Raises:
            BudgetExhausted: the ledger refuses the plan; nothing ran.
        """
        if not isinstance(ledger, Ledger):
            raise InvalidArgumentError("ledger", ledger, "must be a privguard Ledger")
        n = check.positive_int("n_examples", n_examples)
        mech = self.cost(ledger.orders)
        ledger.charge(mech, label=label)  # the whole plan, before anything runs
        rng = make_rng(self.seed)
        in_subset = rng.random(n) < self.q  # Poisson sampling with rate q
        subset = np.flatnonzero(in_subset)
        final_idx = np.flatnonzero(~in_subset) if self.variant == 1 else np.arange(n)
        tuning_ledger = ledger.child(mech.tuning)
        result: TuningResult = self.tuner.run(
            lambda p, child: tune_objective(p, child, subset), tuning_ledger,
            label=f"{label}: tuning on the subset")
        seeded = self.seed is not None or result.seeded
        if not result.selected:
            return SubsetResult(False, None, None, None, result.runs, mech, seeded)
        params = self.extrapolate(dict(result.params), self.scale)
        final_ledger = ledger.child(mech.final)
        artifact = final_objective(params, final_ledger, final_idx, result.artifact)
        return SubsetResult(True, params, dict(result.params), artifact, result.runs, mech, seeded)
