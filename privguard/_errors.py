"""The few exception types privguard raises.

Every exception derives from :class:`PrivguardError`, so ``except
PrivguardError`` catches anything privguard refuses. Bad arguments are also
``ValueError`` so code written against the standard library keeps working.
"""

from __future__ import annotations

from typing import Any


class PrivguardError(Exception):
    """Base class of every error privguard raises on purpose."""


class SchemaUpgradeWarning(UserWarning):
    """A PostgreSQL database's privguard schema is older than this privguard's, and that
    costs something (an open that replays its journal) which ``privguard server-upgrade``,
    an explicit administrative step, would end. Said once per ledger and process."""


class InvalidArgumentError(PrivguardError, ValueError):
    """An argument is out of its domain; the message names it and its value.

    Nothing is charged, loaded or recorded by a call that raises this.
    """

    def __init__(self, name: str, value: Any, requirement: str) -> None:
        self.argument = name
        self.value = value
        self.requirement = requirement
        super().__init__(f"{name}={_shown(value)} is invalid: {requirement}")


def _shown(value: Any) -> str:
    """``repr(value)``, or a description when it raises: an int beyond Python's digit
    limit (``times=10**5000``), a deeply nested list, a user type whose ``__repr__``
    fails. The refusal must stay an InvalidArgumentError, not the built-in (adv24)."""
    try:
        return repr(value)
    except Exception:  # by design: any failure of a caller's repr
        if isinstance(value, int):
            return f"<an int of {value.bit_length()} bits>"
        return f"<a {type(value).__name__} whose repr failed>"


class UnknownMechanismError(InvalidArgumentError):
    """A serialised mechanism names a type privguard does not know."""


class BudgetExhausted(PrivguardError):
    """A charge was refused because it would overspend a filter.

    Nothing was recorded. ``requested`` is the mechanism that was refused,
    ``label`` its label and ``remaining`` what is left (a
    :class:`privguard.Remaining`).
    """

    def __init__(self, message: str, *, requested: Any, label: str | None,
                 remaining: Any) -> None:
        self.requested = requested
        self.label = label
        self.remaining = remaining
        super().__init__(message)


class LedgerStateError(PrivguardError):
    """The ledger's state is unreadable, inconsistent or ambiguous.

    privguard fails closed: a ledger in this condition refuses to load and
    refuses every charge; it never silently starts a fresh budget.
    """


class PipelineMismatchError(PrivguardError):
    """A runtime witness found that a step did not run as it is charged.

    Raised before the step is charged or released: the parameters are left
    untouched, nothing is charged, and the attach handle refuses every later
    step too. ``witness`` names the check (``"noise"``, ``"clipping"``,
    ``"sampling"``; ``"ghost_clipping"``: under ghost clipping a gradient that
    came through no backward of the wrapped loss, ``charged`` the wrapped
    backward passes and ``measured`` the others, which refuses that step only;
    or the optimizer's parameters changed since attach, ``charged`` and
    ``measured`` their numbers then and now, which refuses every later step,
    docs/theory.md §14.5), ``charged`` what the ledger was told, ``measured`` the
    point estimate and ``interval`` its confidence interval (``None`` for a
    deterministic check), ``step`` the 1-based real step of the handle.

    ``step_charged``: True for the one refusal that is a function of the step's noisy
    gradient and of the data (the noise witness's precision guard: the gradients' dtype
    cannot hold the charged noise). Its step is charged before it is raised (not applied):
    charged, the refusal is a post-processing of the step's release; uncharged, it would
    release a bit of the data (docs/theory.md §16.2, review rwl).
    """

    step_charged = False

    def __init__(self, message: str, *, witness: str, charged: float, measured: float,
                 interval: tuple[float, float] | None, step: int) -> None:
        self.witness = witness
        self.charged = charged
        self.measured = measured
        self.interval = interval
        self.step = step
        super().__init__(message)
