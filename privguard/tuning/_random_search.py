"""Random search with a random number of runs (seed 002, Papernot & Steinke 2022)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._base import Mechanism
from privguard._curve import RDPCurve
from privguard._errors import InvalidArgumentError
from privguard._ledger import Ledger
from privguard._orders import DEFAULT_ORDERS
from privguard._repeat_select import RepeatAndSelect
from privguard._runs import Poisson, RunsDistribution, TruncatedNegativeBinomial
from privguard.tuning._base import (
    SLACK,
    Tuner,
    TuningResult,
    check_cost,
    check_mode,
    check_objective,
    declared_curve,
    make_rng,
    uniform_bound,
)
from privguard.tuning._executors import resolve
from privguard.tuning._space import SearchSpace


class RandomSearch(Tuner):
    """Draw K ~ ``runs`` candidates at random from ``space``; release only the best.

    Args:
        space: a :class:`SearchSpace` or a ``{name: values}`` mapping.
        runs: ``Poisson(mean)`` or ``TruncatedNegativeBinomial(eta, ...)``
            (``Logarithmic``, ``Geometric``). A fixed K is not private.
        cost: the privacy cost of ONE candidate — training and scoring — as a
            mechanism, or a function ``params -> mechanism`` (then ``space``
            must be finite, so the uniform bound can be the order-wise maximum
            over every candidate that can be drawn; seed 000 Lemma 9).
        mode: ``"max"`` (default) or ``"min"``: which score is best.
        seed: ONLY for tests: makes K and the draws predictable, which breaks
            the guarantee. Default: OS entropy.
        progress: show a progress bar (counts only, never a score).

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
    """

    def __init__(self, space: SearchSpace | Mapping[str, Any], runs: RunsDistribution, *,
                 cost: Mechanism | Callable[[dict], Mechanism], mode: str = "max",
                 seed: int | None = None, progress: bool = True) -> None:
        self.space = space if isinstance(space, SearchSpace) else SearchSpace(space)
        if not isinstance(runs, (Poisson, TruncatedNegativeBinomial)):
            raise InvalidArgumentError("runs", runs,
                                       "must be Poisson(...) or TruncatedNegativeBinomial(...)")
        self.runs = runs
        self.cost_of = check_cost(cost, self.space)
        self.mode = check_mode(mode)
        self.seed = seed
        self.progress = progress

    # -- privacy -----------------------------------------------------------
    def _declared(self, params: dict, grid: np.ndarray) -> np.ndarray:
        return declared_curve(self.cost_of, params, grid)

    def _per_candidate_curve(self, orders: np.ndarray) -> np.ndarray:
        return uniform_bound(self.cost_of, self.space, orders)

    def cost(self, orders=None) -> RepeatAndSelect:
        """``RepeatAndSelect(per-candidate bound, runs)`` on ``orders`` (default grid)."""
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        return RepeatAndSelect(RDPCurve._trusted(grid, self._per_candidate_curve(grid)), self.runs)

    def _expected_runs(self) -> float:
        return self.runs.mean

    # -- running -----------------------------------------------------------
    def run(self, objective: Callable[[dict, Ledger], Any], ledger: Ledger, *,
            label: str = "tuning", backend: Any = None) -> TuningResult:
        """Charge the tuning bound, run K candidates, return only the best.

        ``objective(params, child_ledger)`` trains and scores one candidate,
        charging its private work to ``child_ledger`` (e.g. through
        :func:`privguard.integrations.opacus.attach`); it returns a score,
        ``(score, artifact)`` or ``{"score": ..., "artifact": ...}``. A
        candidate whose child ledger refuses a charge is counted as failed.
        ``backend``: ``"serial"`` (default), ``"ray"`` or a
        :class:`privguard.integrations.ray.RayExecutor`; K and every
        candidate's hyperparameters are drawn here either way, so a seeded
        run selects the same candidate on every backend.

        Raises:
            BudgetExhausted: the ledger refuses the tuning bound; nothing ran.
        """
        check_objective(objective)
        executor = resolve(backend)
        mech = self._charge(ledger, label)
        rng = make_rng(self.seed)
        k = self.runs.sample(rng)
        drawn = [self.space.sample(rng) for _ in range(k)]
        tasks = [(objective, params, ledger.orders,
                  self._declared(params, ledger.orders) * (1 + SLACK)) for params in drawn]
        from tqdm.auto import tqdm

        with tqdm(total=k, desc=label, unit="run", disable=not self.progress, leave=False) as bar:
            outcomes = executor.map(tasks, lambda: bar.update(1))
        best, failed = None, 0  # only the best so far is kept; nothing else
        for params, (status, score, artifact, _spent) in zip(drawn, outcomes):
            if status != "ok":
                failed += 1
            elif self._better(score, None if best is None else best[0]):
                best = (score, params, artifact)
        del outcomes, tasks
        if best is None:
            return TuningResult(False, None, None, None, k, failed, mech, self.seed is not None)
        return TuningResult(True, dict(best[1]), best[0], best[2], k, failed, mech,
                            self.seed is not None)

    def __repr__(self) -> str:
        return f"RandomSearch({self.space}, runs={self.runs}, mode={self.mode!r})"

