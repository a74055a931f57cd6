"""How good is the selected run? Seed 002 §3.6, for choosing a distribution of K.

If each run's score has a continuous distribution, its quantile U is uniform
on [0, 1] and the best of K runs has quantile max(U_1..U_K), whose CDF is
E[u^K] (the probability generating function of K). A run with K = 0 (Poisson)
selects nothing and counts as quantile 0 / as a miss.
"""

from __future__ import annotations

from scipy import integrate

from privguard import _validation as check
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._runs import RunsDistribution


def expected_quantile(runs: RunsDistribution) -> float:
    """E[quantile of the selected run] = 1 − ∫₀¹ E[u^K] du = E[K/(K+1)].

    Example:
        >>> from privguard.tuning import Geometric
        >>> 0.8 < expected_quantile(Geometric(mean=10.0)) < 0.9
        True
    """
    _check_runs(runs)
    value, _ = integrate.quad(runs.pgf, 0.0, 1.0, limit=200)
    return 1.0 - value


def prob_top(runs: RunsDistribution, fraction: float) -> float:
    """P(the selected run is in the top ``fraction`` of runs) = 1 − E[(1 − fraction)^K]."""
    _check_runs(runs)
    f = check.fraction("fraction", fraction)
    return 1.0 - runs.pgf(1.0 - f)


def _check_runs(runs: object) -> None:
    if not isinstance(runs, RunsDistribution):  # review bi: AttributeError escaped
        raise InvalidArgumentError("runs", runs, "must be a distribution of K (Poisson, "
                                   "Geometric, Logarithmic, TruncatedNegativeBinomial)")
