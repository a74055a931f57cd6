"""Drawing a candidate with probability exactly f_i / Σ f (task ul; docs/theory.md §9).

``rng.choice(n, p=f/Σf)`` rounds twice: the division, and the cumulative sum that numpy's
``Generator.choice`` builds before ``searchsorted`` of a uniform in multiples of 2⁻⁵³.
A candidate's probability then differs from f_i/Σf by up to about n·2⁻⁵³ absolute, not
relative: a small f_i (a prior mass near c·π⁽⁰⁾ of 10⁻²⁰) can be drawn with many times
its density, which DP-HyPO's bound C/c does not charge for. Here the floats f_i are read
as the exact dyadic rationals they are, scaled to integers N_i over one power of two, and
an integer uniform on [0, Σ N_i) (rejection from the generator's random bytes) picks the
i whose interval holds it: the law is f/Σf exactly, whatever n and the magnitudes.
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np

from privguard._errors import InvalidArgumentError


def draw_index(rng: np.random.Generator, f: np.ndarray) -> int:
    """An index i with probability exactly f_i / Σ f (f finite, ≥ 0, Σ f > 0)."""
    cumulative = list(itertools.accumulate(integer_weights(f)))
    total = cumulative[-1]
    nbytes = (total.bit_length() + 7) // 8
    shift = 8 * nbytes - total.bit_length()
    while True:  # rejection: uniform on [0, 2^bits), kept when below total (≥ half the time)
        r = int.from_bytes(rng.bytes(nbytes), "little") >> shift
        if r < total:
            return bisect.bisect_right(cumulative, r)  # the i with N_0+…+N_(i−1) ≤ r < …+N_i


def integer_weights(f: np.ndarray) -> list[int]:
    """Integers N_i = f_i · 2^k for one k (exact: a float is m·2^e, m·2^53 an integer).

    Raises:
        InvalidArgumentError: a value NaN, infinite or negative, or none positive (review
            rul: a NaN or negative value was read as 0, a candidate never drawn, below the
            c·π⁽⁰⁾ the bound assumes; +inf raised OverflowError, no values ValueError).
    """
    values = np.asarray(f, dtype=float).ravel()
    if not (values.size and np.all(np.isfinite(values)) and np.all(values >= 0)
            and np.any(values > 0)):
        # the values are withheld: a density depends on the candidates' scores
        raise InvalidArgumentError("f", f"{values.size} weights (withheld)",
                                   "must be finite weights >= 0, one positive")
    parts = [math.frexp(x) for x in values.tolist()]
    low = min(e for m, e in parts if m > 0)  # the smallest binary exponent carried
    return [int(m * 2**53) << (e - low) if m > 0 else 0 for m, e in parts]
