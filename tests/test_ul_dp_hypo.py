"""Task ul: DP-HyPO's sampler draws exactly from the projected density, whose exact sum
is within an ulp of 1 whatever the number of candidates (docs/theory.md §9)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from privguard.tuning._draw import draw_index, integer_weights
from privguard.tuning._projection import project_bounded_simplex, project_density


@pytest.mark.parametrize("n", [5, 50, 1000])
def test_the_projection_sums_to_one_within_an_ulp_exactly_for_many_candidates(n):
    # main left the exact Σ f up to n·2⁻⁵² from 1 (it corrected the float sum only; 2.4
    # ulps at n = 50 here), and a draw from f/Σf then exceeds C·π⁽⁰⁾ by that factor,
    # beyond the 2⁻⁵⁰ DP-HyPO's curve adds to log(C/c)
    rng = np.random.default_rng(n)
    for _ in range(40):
        prior = rng.uniform(0.01, 1.0, n) ** rng.uniform(1, 6)
        prior = prior / prior.sum()
        p = prior * np.exp(rng.normal(0.0, 3.0, n)) + rng.normal(0, 1 / n, n)
        big, small = float(rng.uniform(1, 5)), float(rng.uniform(0.05, 1))
        f = project_density(p, prior, big, small)
        exact = sum(map(Fraction, f.tolist()))
        assert abs(exact - 1) <= Fraction(2.0**-53), float(exact - 1) / 2**-53
        assert (f >= small * prior).all() and (f <= big * prior).all()


def test_a_density_whose_float_sum_is_one_is_moved_to_an_exact_sum_of_one():
    # numpy sums 128 values in 8 running sums: each of the 15 small values a sum meets is
    # below half an ulp of it and lost, so the float sum is 1.0 and the exact one 13.5
    # ulps (of 2⁻⁵³) above: main returned it unchanged
    big = [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.0078125]
    f = np.zeros(128)
    for j in range(8):
        f[j] = big[j]
        f[j + 8:128:8] = 0.9 * np.spacing(big[j]) / 2
    assert float(f.sum()) == 1.0 and sum(map(Fraction, f.tolist())) - 1 > 2 * 2.0**-53
    g = project_bounded_simplex(f, 0.5 * f, 2.0 * f)
    assert abs(sum(map(Fraction, g.tolist())) - 1) <= Fraction(2.0**-53)
    assert (g >= 0.5 * f).all() and (g <= 2.0 * f).all()


def test_integer_weights_are_exactly_proportional_to_the_floats():
    f = np.array([0.6, 1e-300, 5e-324, 0.0, 0.3999999999999999, 2.0**-60])
    w = integer_weights(f)
    ratio = Fraction(w[0]) / Fraction(f[0])
    assert all(Fraction(wi) == ratio * Fraction(fi) for wi, fi in zip(w, f.tolist()))


class _Fixed:
    """A generator whose random bytes encode one integer r (below the total)."""

    def __init__(self, r: int, bits: int) -> None:
        self.r, self.bits = r, bits

    def bytes(self, k: int) -> bytes:
        return (self.r << (8 * k - self.bits)).to_bytes(k, "little")


def test_each_index_owns_exactly_its_integer_interval():
    # the law is f/Σf exactly: r uniform on [0, ΣN) picks i on [N_0+…+N_(i−1), …+N_i)
    f = np.array([0.25, 1e-300, 0.0, 0.5, 5e-324, 0.25])
    w = integer_weights(f)
    total = sum(w)
    start = 0
    for i, wi in enumerate(w):
        for r in ({start, start + wi - 1} if wi else set()):
            assert draw_index(_Fixed(r, total.bit_length()), f) == i
        start += wi


def test_draws_follow_the_density():
    rng = np.random.default_rng(0)
    f = np.array([0.5, 0.3, 0.2])
    counts = np.bincount([draw_index(rng, f) for _ in range(30000)], minlength=3)
    assert np.all(np.abs(counts / 30000 - f) < 0.015)
    assert math.isclose(counts.sum(), 30000)


@pytest.mark.parametrize("bad", [[math.nan, 1.0], [-0.5, 1.0], [math.inf, 1.0], [0.0, 0.0], []])
def test_a_density_that_is_not_one_is_refused_not_drawn_from(bad):
    # review rul: NaN and negative weights were read as 0 (a candidate never drawn: below
    # c·π⁽⁰⁾, outside S_{C,c}), +inf raised OverflowError and no weights ValueError
    from privguard import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        draw_index(np.random.default_rng(0), np.array(bad))
