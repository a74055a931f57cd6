"""Leaving the plan, made visible: the warning when a hybrid filter's part A closes.

A charge admitted without part A (outside the envelope σ ≥ σ₀, q ≤ q₀, or past
T_A) closes A for good (docs/theory.md §2b, C1); from then on only the RDP
fallback at δ_B decides. That is sound, and can cost most of the budget that
was left: the ledger says so once, with the number of plan steps that fit
before and after (issue 25).
"""

from __future__ import annotations

from typing import Any


class PlanDeviationWarning(UserWarning):
    """A hybrid filter's part A closed: the run left its declared plan's envelope.

    Example:
        >>> import warnings
        >>> from privguard import Ledger, PlanDeviationWarning, mechanisms as M
        >>> ledger = Ledger(3.0, 1e-5, plan=M.SubsampledGaussian(1.0, 0.01), filter="hybrid")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = ledger.charge(M.SubsampledGaussian(0.8, 0.01))   # σ below the plan's
        >>> [w.category.__name__ for w in caught]
        ['PlanDeviationWarning']
    """


def closes_part_a(verdict: Any) -> bool:
    """Whether an admitted verdict closes a live part A (it was admitted without A).

    Read from the verdict alone (the state before, in ``verdict.filter`` until applied,
    is compared with the state after, ``verdict.filter_state``); after ``apply`` the
    filter holds the closed state, so the caller keeps the answer it got before.
    """
    flt = verdict.filter
    return bool(verdict.admitted and flt is not None and flt.kind == "hybrid"
                and flt.a_alive and not verdict.filter_state.a_alive)


def plan_step(acc: Any, verdict: Any) -> Any:
    """The plan's step: the one being fixed by this very charge, or the one in force."""
    from privguard._accounting._plan import Plan

    fixed = verdict.fix if verdict.fix is not None else acc.fixed
    return Plan.from_dict(fixed["plan"]).step


def repeats_or_nan(acc: Any, step: Any, pid: int) -> float:
    """How many plan steps fit now; NaN if that cannot be computed (never raises: it is
    asked after the charge committed, inside the store's transaction)."""
    from privguard._errors import PrivguardError

    try:
        return float(acc.repeats(step, None, pid))
    except PrivguardError:
        return float("nan")


def message(flt: Any, mechanism: Any, label: str | None, step: Any, before: float,
            after: float) -> str:
    """What happened and what it cost, in plan steps."""
    from privguard._accounting._hybrid import envelope_steps_in, envelope_text
    from privguard._accounting._results import exact, whole_count

    env = flt.envelope
    inside = envelope_steps_in(mechanism, env) is not None
    why = (f"it would take part A past its {flt.steps_a} certified envelope steps" if inside
           else f"it is outside the plan's envelope (σ ≥ {exact(env.noise_multiplier)} and "
                f"q ≤ {exact(env.sample_rate)})"
           if env.micro_batches == 1 and not env.allocation_steps
           else f"it is outside the plan's envelope ({envelope_text(env)})")
    what = "charge" if label is None else f"charge {label!r}"
    # δ_B as used, the counts in full, never rounded up (":g" printed 1234567 steps as
    # 1.23457e+06, more than fit, and δ_B = 1.0000000000000026e-07 as 1e-07; review rfp)
    return (f"the {what} of {mechanism!r} left the plan: {why}, so the hybrid filter's PLD "
            f"part closed for good and only the RDP fallback at δ_B = {exact(flt.delta_b)} "
            f"decides from now on. Steps of the plan's step {step!r} that fit: "
            f"{whole_count(before)} before this charge, {whole_count(after)} after. Declare the "
            "most expensive step the run may take as the plan's (σ at most the smallest σ, q at "
            f"least the largest q; README, 'Leaving the plan'){_accumulated_hint(env)}")


def _accumulated_hint(env: Any) -> str:
    from privguard._accounting._results import exact

    if env.micro_batches == 1:
        return ""
    return (f"; an accumulated envelope holds only steps with q = {exact(env.sample_rate)} "
            f"and {env.micro_batches} micro-batches declared aligned=True, which privguard's "
            "integrations declare only when told to (aligned_micro_batches=True): they cannot "
            "rule out per-draw randomness such as dropout (docs/theory.md §2b.1, §14)")
