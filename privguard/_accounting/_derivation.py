"""Which derivation produced a ledger's plan-derived choices (issue 24, item 1).

A fix record (the δ shares, the mixture odometer's weights, a hybrid
filter's T_A) is a function of the plan and the configuration alone, chosen
before any output. A state or a file carries it only so that it can be
checked: on load every fix record is derived again from its plan, and a
record that differs is refused (:func:`privguard._stores._rows.check_fix`).

``DERIVATION`` names the code that derives: a state records it, and a
later privguard that changes a derivation keeps the old one under its
number, so that saved states and checkpoints stay loadable. A state
without the field predates it and was derived by version 1.

Version 1 covers two curve revisions: today's subsampled-Gaussian curve and the one before
e08c1f5 (step 3b's tolerance 1e-4, :mod:`privguard._curves._legacy`). ``check_fix``
accepts a record equal to either derivation and installs the derived one. No number was
added for that change: a fix entry is fixed for a ledger's life, so a ledger created
before e08c1f5 keeps its older entry through every later save, and store rows and
checkpoints record no number (docs/theory.md §1.1, "Fix entries derived before the
revision").
"""

from __future__ import annotations

from typing import Any

from privguard._errors import LedgerStateError

#: The derivation this privguard writes (and the only one it knows so far).
DERIVATION = 1
#: Every derivation this privguard can re-derive with.
KNOWN = (1,)


def derivation_of(state: dict[str, Any]) -> int:
    """The derivation a state records (1 for a state written before the field existed).

    Raises:
        LedgerStateError: not an integer this privguard knows.
    """
    version = state.get("derivation", 1)
    if type(version) is not int or version not in KNOWN:
        raise LedgerStateError(f"the state's derivation {version!r} is not one this privguard "
                               f"knows ({', '.join(map(str, KNOWN))}); upgrade privguard to "
                               "load it")
    return version


def first_difference(recorded: Any, derived: Any, path: str = "") -> str | None:
    """The dotted path of the first field where ``recorded`` differs from ``derived``
    (``same`` compares leaves), or None if they agree; "" names the whole record."""
    if isinstance(recorded, dict) and isinstance(derived, dict):
        for key in list(derived) + [k for k in recorded if k not in derived]:
            where = f"{path}.{key}" if path else str(key)
            if key not in recorded or key not in derived:
                return where
            found = first_difference(recorded[key], derived[key], where)
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(derived, list):
        if len(recorded) != len(derived):
            return path
        return next((path for a, b in zip(recorded, derived)
                     if first_difference(a, b, path) is not None), None)
    return None if _same_leaf(recorded, derived) else path


def _same_leaf(a: Any, b: Any) -> bool:
    """Equal leaves; floats may differ by 1e-9 relative (another CPU's libm), which the
    weight checks absorb: weights summing over 1 are scaled down, never up."""
    import math

    if type(a) is float and type(b) is float:
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return type(a) is type(b) and a == b
