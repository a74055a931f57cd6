"""How the one-run audit scores its canaries and turns guesses into a bound.

Two refinements of the Steinke–Nasr–Jagielski audit (docs/theory.md §16.4),
both sound for the same reason: they change only *which function of the
release* makes the guesses, or spend the confidence by a union bound fixed
before the run.

* :func:`step_log_likelihood_ratio`: the per-step score of a canary is the
  Neyman–Pearson statistic of the charged step seen by the canary, the
  Poisson-subsampled Gaussian with rate q and noise multiplier σ, as a
  function of the canary's projection x = ⟨u, y⟩/C of the released noisy
  clipped sum y:

      log( (1 − q)·φ_σ(x) + q·φ_σ(x − 1) ) − log φ_σ(x)
          = log(1 − q + q·exp((x − ½)/σ²)).

  It uses the charged q and σ (public, fixed before the step) and the
  release, never the canary's secret sampling; summed over all steps it is
  the log-likelihood ratio of "in" against "out" when the steps' noises are
  independent (exactly so for orthogonal canaries).
* :func:`lower_bound_over_guesses`: the guesses are the top-``k_in`` /
  bottom-``k_out`` scores for each of a few pairs fixed before the run; each
  pair's bound is computed at confidence 1 − (1 − c)/n and the largest is
  returned (Bonferroni: the probability that any of the n bounds exceeds the
  truth is at most n·(1 − c)/n).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from privguard._audit._one_run import epsilon_lower_bound, guess_and_count

__all__ = ["default_guesses", "lower_bound_over_guesses", "step_log_likelihood_ratio"]


def default_guesses(m: int) -> tuple[tuple[int, int], ...]:
    """The pre-registered (k_in, k_out) pairs for m canaries (fixed before any run).

    Chosen once, by simulation of Gaussian scores (docs/theory.md §16.4), not
    from any audited run: a few confident "in" guesses suit a strong signal,
    symmetric sets a weak one or a broken run.

    Example:
        >>> default_guesses(1000)
        ((20, 0), (100, 0), (100, 100), (250, 250))
    """
    pairs = ((m // 50, 0), (m // 10, 0), (m // 10, m // 10), (m // 4, m // 4))
    kept = tuple(p for p in pairs if p[0] + p[1] > 0)
    return tuple(dict.fromkeys(kept)) or ((1, 0),)


def step_log_likelihood_ratio(x: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """log(1 − q + q·exp((x − ½)/σ²)): one step's "in" vs "out" evidence for projections x.

    ``x`` is in units of the clip norm C. σ = 0 (a charge of ∞) falls back to
    the projection itself, which ranks the same way.

    Example:
        >>> round(float(step_log_likelihood_ratio(np.array([0.5]), 1.0, 0.25)[0]), 12)  # e^0 = 1
        0.0
    """
    x = np.asarray(x, dtype=np.float64)
    if sigma <= 0.0:
        return x.copy()
    z = (x - 0.5) / (sigma * sigma)
    if q >= 1.0:
        return z
    # log((1 − q)·1 + q·e^z), computed without overflow for large z
    return np.logaddexp(np.log1p(-q), np.log(q) + z)


def lower_bound_over_guesses(scores: np.ndarray, included: np.ndarray,
                             pairs: Sequence[tuple[int, int]], delta: float,
                             confidence: float) -> tuple[float, int, int]:
    """(ε_lower, r, v): the largest of the pairs' bounds, each at confidence 1 − (1 − c)/n.

    With probability ≥ ``confidence`` the true ε at ``delta`` is at least the
    value returned (union bound over the n pairs, docs/theory.md §16.4); r and
    v are the guesses and right guesses of the pair that gave it.

    Example:
        >>> inc = np.arange(1000) % 2 == 0
        >>> lower_bound_over_guesses(inc.astype(float), inc, [(100, 0), (50, 50)], 1e-5,
        ...                          0.95)[0] > 2.0
        True
    """
    m = len(scores)
    best = (0.0, pairs[0][0] + pairs[0][1], -1)
    for k_in, k_out in pairs:
        r, v = guess_and_count(scores, included, k_in, k_out)
        # each at level (1 − c)/n itself, not 1 − (1 − (1 − c)/n), which can round up (aud)
        low = epsilon_lower_bound(m, r, v, delta, confidence, splits=len(pairs))
        if best[2] < 0 or low > best[0]:
            best = (low, r, v)
    return best
