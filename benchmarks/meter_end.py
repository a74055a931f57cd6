"""Where the budget meter ends (issue 25): at most the target, and within 1% of it
when the filter refused or the plan ended.

    python benchmarks/meter_end.py

1. The README quick start (RDP filter, adaptive σ), run until the filter refuses.
2. Plans calibrated by Opacus' PRV accountant (what make_private_with_epsilon
   does, q = 1/len(loader)) under the hybrid filter, run to the plan's end.
3. What leaving the plan costs (README, "Leaving the plan").
"""

from __future__ import annotations

import warnings

from privguard import BudgetExhausted, Ledger, Plan
from privguard import mechanisms as M


def quick_start() -> None:
    q = 256 / 60_000
    ledger = Ledger(epsilon=3.0, delta=1e-5,
                    plan=Plan(M.SubsampledGaussian(1.1, q), steps=234 * 100))
    try:
        for epoch in range(100):
            sigma = 1.1 if epoch < 10 else 0.9
            ledger.charge(M.SubsampledGaussian(sigma, q), label="step", times=234)
    except BudgetExhausted:  # the last epoch does not fit whole: finish it step by step
        while ledger.can_afford(M.SubsampledGaussian(sigma, q)):
            ledger.charge(M.SubsampledGaussian(sigma, q), label="step")
    b = ledger.budget()
    print(f"quick start: {b}; meter/target {b.spent / b.epsilon:.5f}; any-time ε "
          f"{ledger.epsilon():.3f}")


def prv_plans() -> None:
    from opacus.accountants.utils import get_noise_multiplier

    for target, q, epochs in [(3.0, 256 / 60_000, 10), (3.0, 1 / 29, 10), (8.0, 1 / 235, 20)]:
        steps = round(epochs / q)
        sigma = get_noise_multiplier(target_epsilon=target, target_delta=1e-5, sample_rate=q,
                                     steps=steps, accountant="prv")
        step = M.SubsampledGaussian(sigma, q)
        ledger = Ledger(target, 1e-5, plan=Plan(step, steps=steps), filter="hybrid")
        fit = int(min(steps, ledger.remaining(step).repeats))
        ledger.charge(step, times=fit)
        b = ledger.budget()
        print(f"PRV plan ε={target:g}, q={q:.5f}, σ={sigma:.4f}: {fit}/{steps} steps; {b}; "
              f"meter/target {b.spent / b.epsilon:.5f}; any-time ε {ledger.epsilon():.3f}")


def leaving_the_plan() -> None:
    """One step of σ = 0.8 as the first charge off a σ = 1, q = 0.01 plan (README)."""
    from privguard import PlanDeviationWarning

    plan = M.SubsampledGaussian(1.0, 0.01)
    ledger = Ledger(3.0, 1e-5, plan=Plan(plan, steps=3000), filter="hybrid")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ledger.charge(M.SubsampledGaussian(0.8, 0.01))
    text = next(str(w.message) for w in caught if w.category is PlanDeviationWarning)
    print("leaving the plan:", text[text.index("that fit:") + 10:text.index(" Declare")])


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    quick_start()
    prv_plans()
    leaving_the_plan()
