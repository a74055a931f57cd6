"""Independent, slow reference of seed 000 Theorems 4 and 6 (loops, lgamma, manual log-sum-exp)."""

import math


def lse(terms):
    terms = [t for t in terms if t != -math.inf]
    m = max(terms)
    if m == math.inf:
        return math.inf
    return m + math.log(sum(math.exp(t - m) for t in terms))


def lbinom(n, k):
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def lpow(x, k):
    """log(x^k) with 0^0 = 1."""
    if k == 0:
        return 0.0
    return -math.inf if x == 0 else k * math.log(x)


def times(c, e, a):
    """c·e(a), with a zero coefficient meaning 0 (e is not evaluated)."""
    return 0.0 if c == 0 else c * e(a)


def eps1(a, q, et, eb):
    t = [lpow(q, a) + times(a - 1, et, a), lpow(1 - q, a) + times(a - 1, eb, a)]
    for j in range(1, a):
        t.append(lbinom(a, j) + lpow(q, a - j) + lpow(1 - q, j)
                 + times(a - j - 1, et, a - j) + times(j - 1, eb, j))
    return lse(t) / (a - 1)


def eps2(a, q, et, eb):
    t = [lpow(1 - q, a - 1) + times(a - 1, eb, a)]
    for j in range(1, a):
        t.append(lbinom(a - 1, j) + lpow(q, j) + lpow(1 - q, a - 1 - j)
                 + times(j, et, j + 1) + times(a - j - 1, eb, a - j))
    return lse(t) / (a - 1)


def zhu_wang(a, g, e):
    t = [lpow(1 - g, a - 1) + math.log(a * g - g + 1),
         lbinom(a, 2) + lpow(g, 2) + lpow(1 - g, a - 2) + e(2)]
    for j in range(3, a + 1):
        t.append(math.log(3) + lbinom(a, j) + lpow(g, j) + lpow(1 - g, a - j) + (j - 1) * e(j))
    return lse(t) / (a - 1)
