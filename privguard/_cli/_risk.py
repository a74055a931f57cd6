"""What an (ε, δ)-DP statement means for a membership attacker, in one sentence.

The hypothesis-testing characterisation of (ε, δ)-DP (Kairouz, Oh &
Viswanath 2015, Thm 2.1; Wasserman & Zhou 2010): every test deciding from the
output whether one person's record was used satisfies
FPR + e^ε·FNR ≥ 1 − δ and e^ε·FPR + FNR ≥ 1 − δ, so with TPR = 1 − FNR

    TPR ≤ min(e^ε·FPR + δ, 1 − e^{−ε}(1 − δ − FPR))        (docs/theory.md §12)

It applies to a filter's (ε, δ) statement, fixed in advance; not to the
odometer's data-dependent ε (a tail bound), so privguard never attaches it there.
"""

from __future__ import annotations

import math

from privguard import _validation as check
from privguard._accounting._results import upper

#: The false positive rate the report quotes.
REPORT_FPR = 0.01


def membership_tpr_bound(epsilon: float, delta: float, fpr: float = REPORT_FPR) -> float:
    """The largest true positive rate any membership test can have at ``fpr`` under (ε, δ)-DP.

    Example:
        >>> round(membership_tpr_bound(3.0, 1e-5, 0.01), 4)
        0.2009
    """
    epsilon = check.positive_finite("epsilon", epsilon)
    delta = check.delta("delta", delta)
    fpr = check.fraction("fpr", fpr)
    # Kairouz, Oh & Viswanath 2015, Thm 2.1, both inequalities solved for TPR. Beyond
    # exp's range (ε > 709) the first one is dropped: the min of the others is larger,
    # so the bound stays an upper bound (it used to raise OverflowError).
    first = math.exp(epsilon) * fpr + delta if epsilon <= 700.0 else math.inf
    return min(1.0, first, 1.0 - math.exp(-epsilon) * (1.0 - delta - fpr))


def risk_sentence(epsilon: float, delta: float, fpr: float = REPORT_FPR) -> str:
    """The bound in words, for a filter's (ε, δ) statement.

    Example:
        >>> risk_sentence(3.0, 1e-5)
        'a membership test wrong on 1% of non-members catches at most 20.1% of members (Kairouz–Oh–Viswanath 2015)'
        >>> risk_sentence(10.0, 1e-5)[:44]
        'at ε = 10 this statement does not limit a me'
    """
    tpr = membership_tpr_bound(epsilon, delta, fpr)
    if tpr >= 0.995:  # the bound is (nearly) vacuous: say so rather than "at most 100%"
        # ε rounded up, as every printed ε (task fp): the bound is vacuous above it too
        return (f"at ε = {upper(epsilon, '.4g')} this statement does not limit a membership "
                "test wrong "
                f"on {100 * fpr:g}% of non-members (Kairouz–Oh–Viswanath 2015)")
    return (f"a membership test wrong on {100 * fpr:g}% of non-members catches at most "
            f"{upper(100 * tpr, '.3g')}% of members (Kairouz–Oh–Viswanath 2015)")
