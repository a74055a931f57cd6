"""Noise calibration that never overshoots (seed 000 §4.1, App. D.1).

Every function searches for the smallest noise multiplier σ that meets a
target, by bisection on a predicate that is monotone in σ (more noise, less
privacy loss), and returns a σ at which the target was checked to hold.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np

from privguard import _validation as check
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._curve import RDPCurve
from privguard._mechanisms._mechanisms import SubsampledGaussian
from privguard._mechanisms._repeat_select import RepeatAndSelect
from privguard._mechanisms._runs import RunsDistribution

_LO, _HI = 1e-3, 1e4


def smallest_sigma(fits: Callable[[float], bool], rtol: float = 1e-4,
                   target: tuple[str, object] = ("target", None)) -> float:
    """The smallest σ (to relative ``rtol``) with ``fits(σ)``; ``fits`` must be monotone.

    The returned σ always satisfies ``fits``: it is the upper end of the
    bisection bracket. ``target``: the caller's argument (name, value) an
    unreachable target is refused as. ``rtol`` is checked here, before any
    search (task bs: 0 or a negative one searched forever, "1" raised TypeError).
    """
    rtol = check.positive_finite("rtol", rtol)
    hi = 1.0
    while not fits(hi):
        hi *= 2
        if hi > _HI:
            raise InvalidArgumentError(*target, f"is not reachable with a noise multiplier "
                                       f"σ <= {_HI:g}")
    lo = hi / 2
    while fits(lo):
        hi, lo = lo, lo / 2
        if lo < _LO:
            return hi
    while (hi - lo) > rtol * hi:
        mid = (lo + hi) / 2
        if not lo < mid < hi:  # adjacent floats: an rtol below float precision is met
            break
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    assert fits(hi)
    return hi


def _grid(orders) -> np.ndarray:
    return check.orders("orders", DEFAULT_ORDERS if orders is None else orders)


def calibrate_noise_multiplier(sample_rate: float, steps: int, epsilon: float | None = None,
                               delta: float | None = None, *, rdp_slope: float | None = None,
                               orders=None, rtol: float = 1e-4) -> float:
    """Smallest σ such that ``steps`` DP-SGD steps at ``sample_rate`` meet the target.

    The target is (``epsilon``, ``delta``) by the improved conversion on the
    grid, or — with ``rdp_slope`` = c — the line c·α at every order of the grid.

    Example:
        >>> s = calibrate_noise_multiplier(0.01, 1000, epsilon=2.0, delta=1e-5)
        >>> from privguard import mechanisms as M, RDPCurve, DEFAULT_ORDERS
        >>> RDPCurve(DEFAULT_ORDERS, M.SubsampledGaussian(s, 0.01, 1000).rdp(DEFAULT_ORDERS)).epsilon(1e-5) <= 2.0
        True
    """
    grid = _grid(orders)
    q = check.sample_rate("sample_rate", sample_rate)
    t = check.positive_int("steps", steps)
    if rdp_slope is not None:
        c = check.positive_finite("rdp_slope", rdp_slope)
        with np.errstate(over="ignore"):  # c·α beyond float range: +inf, above every curve
            line = c * grid
        return smallest_sigma(lambda s: bool(np.all(
            SubsampledGaussian(s, q, t)._rdp_checked(grid) <= line)), rtol, ("rdp_slope", c))
    e = check.positive_finite("epsilon", epsilon)
    d = check.delta("delta", delta)
    return smallest_sigma(lambda s: RDPCurve._trusted(
        grid, SubsampledGaussian(s, q, t)._rdp_checked(grid)).epsilon(d) <= e, rtol,
        ("epsilon", e))


def calibrate_tuning_noise(sample_rate: float, steps: int, runs: RunsDistribution,
                           epsilon: float, delta: float, *, orders=None,
                           rtol: float = 1e-4) -> float:
    """Smallest σ such that random-K tuning of ``steps``-step DP-SGD runs costs ≤ (ε, δ) in total."""
    grid = _grid(orders)
    q = check.sample_rate("sample_rate", sample_rate)
    t = check.positive_int("steps", steps)
    e = check.positive_finite("epsilon", epsilon)
    d = check.delta("delta", delta)
    return smallest_sigma(lambda s: RDPCurve._trusted(
        grid, RepeatAndSelect(SubsampledGaussian(s, q, t), runs)._rdp_checked(grid)).epsilon(d) <= e,
        rtol, ("epsilon", e))


def dpsgd_cost(epsilon: float, delta: float, *, orders=None, rate_key: str = "sample_rate",
               steps_key: str = "steps") -> Callable[[dict], SubsampledGaussian]:
    """Per-candidate cost for candidates that differ in sample rate and steps.

    Returns ``params -> SubsampledGaussian(σ, q, T)`` with σ calibrated (never
    overshooting) so that each candidate alone meets (ε, δ); their curves are
    then close, and the order-wise maximum the tuner uses stays tight
    (seed 000 §4.1). Calibrations are cached per (q, T).
    """
    # checked here, by name (review fs: a bad ε or δ, or a key that is not a str, surfaced
    # only when a tuner called the cost, as "cost=<function ...> raised ...")
    epsilon = check.positive_finite("epsilon", epsilon)
    delta = check.delta("delta", delta)
    for name, key in (("rate_key", rate_key), ("steps_key", steps_key)):
        if not isinstance(key, str):
            raise InvalidArgumentError(name, check.short(key), "must be a str (a key of params)")
    grid = tuple(_grid(orders).tolist())

    @functools.cache
    def sigma(q: float, t: int) -> float:
        return calibrate_noise_multiplier(q, t, epsilon, delta, orders=grid)

    def cost(params: dict) -> SubsampledGaussian:
        # checked, named by their keys (review bd: float()/int() let strings in, truncated
        # 10.7 steps to 10 and raised KeyError, TypeError or OverflowError)
        if not isinstance(params, Mapping) or rate_key not in params or steps_key not in params:
            raise InvalidArgumentError("params", check.short(params), f"must be a dict with the "
                                       f"keys {rate_key!r} and {steps_key!r}")
        q = check.sample_rate(rate_key, params[rate_key])
        steps = params[steps_key]
        if isinstance(steps, (float, np.floating)) and float(steps).is_integer():
            steps = int(steps)  # a whole float (a LogUniform's draw, rounded by the caller)
        t = check.positive_int(steps_key, steps, maximum=check.MAX_STEPS)
        return SubsampledGaussian(sigma(q, t), q, t)

    return cost
