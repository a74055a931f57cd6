"""Hyperparameter tuning as a client of the ledger (``privguard.tuning``).

Every tuner checks its arguments and charges its whole tuning bound to the
ledger before any candidate runs, runs each candidate under a strict child
ledger, and releases the winner and nothing else: not the number of runs,
not failures, nothing about another candidate. A candidate that raises or
scores NaN, ±inf or a non-number is ⊥ (never selected). See
:class:`RandomSearch` and :class:`TuningResult`.
"""

from privguard._mechanisms._runs import (
    Geometric,
    Logarithmic,
    Poisson,
    RunsDistribution,
    TruncatedNegativeBinomial,
)
from privguard.tuning._base import SLACK, Tuner, TuningAborted, TuningPlan, TuningResult
from privguard.tuning._calibration import (
    calibrate_noise_multiplier,
    calibrate_tuning_noise,
    dpsgd_cost,
)
from privguard.tuning._dp_hypo import DPHyPOSearch, GPUpdate
from privguard.tuning._projection import project_bounded_simplex, project_density
from privguard.tuning._propose_test import ProposeTest, ProposeTestResult
from privguard.tuning._random_search import RandomSearch
from privguard.tuning._rehearse import Rehearsal
from privguard.tuning._space import Choice, IntUniform, LogUniform, SearchSpace, UniformFloat
from privguard.tuning._subset_search import SubsetResult, SubsetSearch, paper_extrapolation
from privguard.tuning._utility import expected_quantile, prob_top

__all__ = [
    "SLACK",
    "Choice",
    "DPHyPOSearch",
    "GPUpdate",
    "Geometric",
    "IntUniform",
    "LogUniform",
    "Logarithmic",
    "Poisson",
    "ProposeTest",
    "ProposeTestResult",
    "RandomSearch",
    "Rehearsal",
    "RunsDistribution",
    "SearchSpace",
    "SubsetResult",
    "SubsetSearch",
    "TruncatedNegativeBinomial",
    "Tuner",
    "TuningAborted",
    "TuningPlan",
    "TuningResult",
    "UniformFloat",
    "calibrate_noise_multiplier",
    "calibrate_tuning_noise",
    "dpsgd_cost",
    "expected_quantile",
    "paper_extrapolation",
    "prob_top",
    "project_bounded_simplex",
    "project_density",
]
