"""DP-HyPO: adaptive hyperparameter search with bounded sampling densities (seed 003).

Framework 1: draw T ~ D_{θ,γ}; for each run, sample a candidate from the
current density, run it, and update the density from the history by ANY rule,
privatised by projecting onto S_{C,c} = {c·π⁽⁰⁾ ≤ f ≤ C·π⁽⁰⁾, Σ f = 1}
(:func:`project_density`); release the best run. The cost is
``privguard.mechanisms.DPHyPO`` (Theorem 1), charged before anything runs.
The densities and the surrogate model live only inside ``run``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._curve import RDPCurve
from privguard._errors import InvalidArgumentError
from privguard._ledger import Ledger
from privguard._optional import require
from privguard._orders import DEFAULT_ORDERS
from privguard._repeat_select import DPHyPO
from privguard._runs import TruncatedNegativeBinomial
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
from privguard.tuning._projection import project_density
from privguard.tuning._space import SearchSpace

History = list  # of (candidate index, score), in the order run


def ordinal_coordinates(candidates: list[dict]) -> np.ndarray:
    """Each hyperparameter's values mapped to their rank, scaled to [0, 1] (n × d)."""
    names = list(candidates[0])
    cols = []
    for name in names:
        values = sorted({c[name] for c in candidates}, key=lambda v: (str(type(v)), v))
        rank = {v: i / max(len(values) - 1, 1) for i, v in enumerate(values)}
        cols.append([rank[c[name]] for c in candidates])
    return np.array(cols, dtype=float).T


class GPUpdate:
    """Algorithm 3's update: a Gaussian process on past (λ, q), UCB s = μ + τσ,
    π ∝ exp(β·s). scikit-learn's GaussianProcessRegressor, fixed kernel (RBF +
    white noise on the candidates' ordinal coordinates); paper defaults τ = 0.1, β = 1."""

    def __init__(self, tau: float = 0.1, beta: float = 1.0, length_scale: float = 0.25,
                 noise: float = 0.01) -> None:
        self.tau = check.non_negative_finite("tau", tau)
        self.beta = check.non_negative_finite("beta", beta)
        self.length_scale = check.positive_finite("length_scale", length_scale)
        self.noise = check.positive_finite("noise", noise)

    def __call__(self, history: History, coords: np.ndarray) -> np.ndarray:
        gaussian_process = require("sklearn.gaussian_process", "gp")
        GaussianProcessRegressor = gaussian_process.GaussianProcessRegressor
        RBF, WhiteKernel = gaussian_process.kernels.RBF, gaussian_process.kernels.WhiteKernel
        idx = np.array([i for i, _ in history])
        y = np.array([s for _, s in history], dtype=float)
        kernel = RBF(self.length_scale, "fixed") + WhiteKernel(self.noise, "fixed")
        gp = GaussianProcessRegressor(kernel, optimizer=None, normalize_y=len(y) > 1)
        gp.fit(coords[idx], y)
        mu, sd = gp.predict(coords, return_std=True)
        score = self.beta * (mu + self.tau * sd)
        w = np.exp(score - score.max())
        return w / w.sum()


class DPHyPOSearch(Tuner):
    """Adaptive random search with densities kept within [c, C] × the prior.

    Args:
        space: a finite :class:`SearchSpace` or ``{name: values}`` mapping.
        runs: T ~ ``TruncatedNegativeBinomial`` (only this family is covered
            by seed 003's theorem; Poisson is refused).
        cost: the privacy cost of one run (mechanism, or ``params -> mechanism``).
        C, c: density bounds, c ≤ 1 ≤ C (paper defaults 2 and 0.75).
        update: ``"gp"`` (Algorithm 3, :class:`GPUpdate`) or any
            ``(history, coords) -> density`` over the candidates, where history
            is a list of (candidate index, score); its output is projected.
        prior: π⁽⁰⁾ over the candidates (default uniform; App. D).
        seed: ONLY for tests (breaks the guarantee). progress: bar of runs.

    Example:
        >>> from privguard import Ledger, mechanisms as M
        >>> from privguard.tuning import DPHyPOSearch, Geometric
        >>> tuner = DPHyPOSearch({"lr": [0.1, 0.3, 1.0]}, Geometric(mean=4.0),
        ...                      cost=M.Gaussian(10.0), progress=False)
        >>> result = tuner.run(lambda p, child: -abs(p["lr"] - 0.3), Ledger(8.0, 1e-5))
        >>> result.params["lr"] in (0.1, 0.3, 1.0)
        True
    """

    def __init__(self, space: SearchSpace | Mapping[str, Any], runs: TruncatedNegativeBinomial, *,
                 cost, C: float = 2.0, c: float = 0.75,
                 update: str | Callable[[History, np.ndarray], np.ndarray] = "gp",
                 prior=None, mode: str = "max", seed: int | None = None,
                 progress: bool = True) -> None:
        if not isinstance(runs, TruncatedNegativeBinomial):
            raise InvalidArgumentError(
                "runs", runs, "DP-HyPO's theorem covers truncated negative binomial T only; "
                "Poisson is not offered for the adaptive case (docs/theory.md §9)")
        space = space if isinstance(space, SearchSpace) else SearchSpace(space)
        if not space.is_finite:
            raise InvalidArgumentError("space", space, "DP-HyPO works on a finite grid of candidates")
        self.space, self.runs = space, runs
        self.cost_of = check_cost(cost, space)
        self.mode = check_mode(mode)
        self.seed, self.progress = seed, progress
        DPHyPO(RDPCurve([2.0], [0.0]), runs, C, c)  # validates c <= 1 <= C
        self.C, self.c = float(C), float(c)
        self.candidates = space.candidates()
        self.coords = ordinal_coordinates(self.candidates)
        n = len(self.candidates)
        if prior is None:
            self.prior = np.full(n, 1.0 / n)
        else:
            p = np.asarray(prior, dtype=float)
            if p.shape != (n,) or np.any(p < 0) or not np.isclose(p.sum(), 1.0):
                raise InvalidArgumentError("prior", prior, f"must be {n} non-negative weights summing to 1")
            self.prior = p
        if update == "gp":
            update = GPUpdate()
        if not callable(update):
            raise InvalidArgumentError("update", update, "must be 'gp' or callable(history, coords)")
        self.update = update

    def _per_candidate_curve(self, orders: np.ndarray) -> np.ndarray:
        return uniform_bound(self.cost_of, self.space, orders)

    def _expected_runs(self) -> float:
        return self.runs.mean

    def cost(self, orders=None) -> DPHyPO:
        grid = check.orders("orders", DEFAULT_ORDERS if orders is None else orders)
        return DPHyPO(RDPCurve._trusted(grid, self._per_candidate_curve(grid)), self.runs,
                      self.C, self.c)

    def density(self, history: History) -> np.ndarray:
        """The projected sampling density after ``history`` (inside the tuner only)."""
        raw = self.prior if not history else np.asarray(self.update(history, self.coords), float)
        if raw.shape != self.prior.shape or not np.all(np.isfinite(raw)):
            raise InvalidArgumentError("update(...)", raw, "must return one finite weight per candidate")
        return project_density(raw / raw.sum() if raw.sum() > 0 else self.prior,
                               self.prior, self.C, self.c)

    def run(self, objective: Callable[[dict, Ledger], Any], ledger: Ledger, *,
            label: str = "DP-HyPO tuning", backend: Any = None) -> TuningResult:
        """Charge Theorem 1's bound, run T adaptively sampled candidates, return the best.

        The adaptive part (densities, sampling) stays here at the driver;
        each training run goes to ``backend`` ("serial", "ray" or an executor).
        """
        check_objective(objective)
        executor = resolve(backend)
        mech = self._charge(ledger, label)
        rng = make_rng(self.seed)
        t = self.runs.sample(rng)
        history: History = []
        best, failed = None, 0
        from tqdm.auto import tqdm

        with tqdm(total=t, desc=label, unit="run", disable=not self.progress, leave=False) as bar:
            for _ in range(t):
                pi = self.density(history)
                i = int(rng.choice(len(pi), p=pi / pi.sum()))
                params = self.candidates[i]
                budget = declared_curve(self.cost_of, params, ledger.orders) * (1 + SLACK)
                [(status, score, artifact, _)] = executor.map(
                    [(objective, params, ledger.orders, budget)])
                if status != "ok":
                    failed += 1
                else:
                    history.append((i, score))
                    if self._better(score, None if best is None else best[0]):
                        best = (score, params, artifact)
                bar.update(1)
        seeded = self.seed is not None
        if best is None:
            return TuningResult(False, None, None, None, t, failed, mech, seeded)
        return TuningResult(True, dict(best[1]), best[0], best[2], t, failed, mech, seeded)
