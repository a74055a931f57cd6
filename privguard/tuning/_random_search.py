"""Random search with a random number of runs (seed 002, Papernot & Steinke 2022)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._errors import InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard._mechanisms._base import Mechanism
from privguard._mechanisms._curve import RDPCurve
from privguard._mechanisms._repeat_select import RepeatAndSelect
from privguard._mechanisms._runs import Poisson, RunsDistribution, TruncatedNegativeBinomial
from privguard.tuning._base import (
    Best,
    CandidateCosts,
    Tuner,
    TuningResult,
    check_mode,
    check_seed,
    make_rng,
)
from privguard.tuning._charged_run import charged_run
from privguard.tuning._executors import Task
from privguard.tuning._rehearse import RehearseOne
from privguard.tuning._space import SearchSpace


def check_space(space: Any) -> SearchSpace:
    return space if isinstance(space, SearchSpace) else SearchSpace(space)


class RandomSearch(RehearseOne, Tuner):
    """Draw K ~ ``runs`` candidates at random from ``space``; release only the best.

    A run releases the winner — its hyperparameters, score and artifact — or
    that there is none, and nothing else (not K, not failures; see
    :class:`TuningResult`).

    Args:
        space: a :class:`SearchSpace` or a ``{name: values}`` mapping.
        runs: ``Poisson(mean)`` or ``TruncatedNegativeBinomial(eta, ...)``
            (``Logarithmic``, ``Geometric``). A fixed K is not private.
        cost: the privacy cost of ONE candidate — training and scoring — as a
            mechanism, or a function ``params -> mechanism`` (then ``space``
            must be finite, so the uniform bound can be the order-wise maximum
            over every candidate that can be drawn; seed 000 Lemma 9). The
            function is called for every candidate here.
        mode: ``"max"`` (default) or ``"min"``: which score is best.
        seed: ONLY for tests: makes K and the draws predictable, which breaks
            the guarantee. Default: OS entropy.
        progress: show the elapsed time while running (never a count or a score).

    Raises:
        InvalidArgumentError: any argument out of its domain.

    Example:
        >>> from privguard import Ledger, mechanisms as M
        >>> from privguard.tuning import RandomSearch, Poisson
        >>> tuner = RandomSearch({"lr": [0.1, 0.3, 1.0]}, Poisson(3.0),
        ...                      cost=M.Gaussian(10.0), progress=False)
        >>> ledger = Ledger(epsilon=5.0, delta=1e-5)
        >>> def objective(params, child):
        ...     child.charge(M.Gaussian(10.0))    # the candidate's private work
        ...     return -abs(params["lr"] - 0.3)     # its (private) score
        >>> result = tuner.run(objective, ledger)
        >>> len(ledger.history)                     # one charge: the whole tuning bound
        1
        >>> sorted(vars(result))                    # the winner (if any), nothing else
        ['artifact', 'cost', 'params', 'score', 'seeded', 'selected']
    """

    def __init__(self, space: SearchSpace | Mapping[str, Any], runs: RunsDistribution, *,
                 cost: Mechanism | Callable[[dict], Mechanism], mode: str = "max",
                 seed: int | None = None, progress: bool = True) -> None:
        self.space = check_space(space)
        if not isinstance(runs, (Poisson, TruncatedNegativeBinomial)):
            raise InvalidArgumentError("runs", runs,
                                       "must be Poisson(...) or TruncatedNegativeBinomial(...)")
        self.runs = runs
        self.mode = check_mode(mode)
        self.seed = check_seed(seed)
        self.progress = check.flag("progress", progress)
        self.costs = CandidateCosts(cost, self.space)
        self.cost_of = cost

    # -- privacy -----------------------------------------------------------
    def _per_candidate_curve(self, orders: np.ndarray) -> np.ndarray:
        return self.costs.bound(orders)

    def cost(self, orders=None) -> RepeatAndSelect:
        """``RepeatAndSelect(per-candidate bound, runs)`` on ``orders`` (default grid)."""
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        return RepeatAndSelect(RDPCurve._trusted(grid, self._per_candidate_curve(grid)), self.runs)

    def _expected_runs(self) -> float:
        return self.runs.mean

    # -- running -----------------------------------------------------------
    def run(self, objective: Callable[[dict, Ledger], Any], ledger: Ledger, *,
            label: str | None = "tuning", backend: Any = None) -> TuningResult:
        """Charge the tuning bound, run K candidates, release only the winner.

        Rehearse first (:meth:`rehearse`): a run hides every failed candidate.

        ``objective(params, child_ledger)`` trains and scores one candidate,
        charging its private work to ``child_ledger`` (e.g. through
        :func:`privguard.integrations.opacus.attach`; ``ledger`` refuses every
        read and charge while the candidates run); it returns a score,
        ``(score, artifact)`` or ``{"score": ..., "artifact": ...}``. A
        candidate that raises (its child ledger refusing a charge included)
        or whose score is not a finite real number is ⊥: never selected, and
        nothing about it is released. ``backend``: ``"serial"`` (default),
        ``"ray"`` or a :class:`privguard.integrations.ray.RayExecutor`; K
        and every candidate's hyperparameters are drawn here either way, and
        ties go to the earlier draw, so a seeded run selects the same
        candidate on every backend.

        Raises:
            InvalidArgumentError: a bad argument; raised before the charge.
            BudgetExhausted: the ledger refuses the tuning bound; nothing ran.
            KeyboardInterrupt: interrupted mid-run (a fresh one, carrying
                nothing of the run); the bound stays charged.
            TuningAborted: anything else escaped mid-run (cause withheld);
                the bound stays charged.
        """
        return charged_run(self, objective, ledger, label, backend, "tuning")

    def _search(self, objective: Callable, grid: np.ndarray, budgets: list[np.ndarray],
                executor: Any, mech: Mechanism) -> TuningResult:
        """Everything after the charge. K, the draws and the best live only in this frame."""
        rng = make_rng(self.seed)
        k = self.runs.sample(rng)

        def tasks() -> Iterator[Task]:
            for _ in range(k):
                index, params = self.space.draw(rng)
                budget = budgets[0] if index is None or len(budgets) == 1 else budgets[index]
                yield (objective, params, grid, budget)

        best = Best(self.mode)
        executor.run(tasks(), best.offer)
        return best.result(mech, self.seed is not None)

    def __repr__(self) -> str:
        return f"RandomSearch({self.space}, runs={self.runs}, mode={self.mode!r})"
