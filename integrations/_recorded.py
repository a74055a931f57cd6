"""What Opacus' own accountant recorded for an optimizer (private).

``PrivacyEngine.make_private`` puts a step hook on the optimizer that feeds
its accountant; the hook is a closure over the accountant and the sample
rate. Attaching a ledger mid-run, or after ``engine.load_checkpoint``, must
charge the steps that accountant already holds (a filter has to see them), so
this module finds that hook, reads its accountant and rate, and compares
accountant histories (lists of ``(noise_multiplier, sample_rate, steps)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from privguard import _validation as check
from privguard import mechanisms as M
from privguard._accounting._results import exact
from privguard._errors import BudgetExhausted, LedgerStateError
from privguard.integrations._checkpoint import _item, is_step_row

__all__ = ["History", "find_opacus_hook", "history_of", "replay", "steps_beyond", "total_steps"]

History = list[tuple[float, float, int]]

_HOOK_QUALNAME = "IAccountant.get_optimizer_hook_fn.<locals>.hook_fn"


def find_opacus_hook(hook: Callable | None, depth: int = 3) -> tuple[Any, float | None]:
    """(accountant, sample_rate) of the Opacus accountant hook in ``hook``'s closure chain.

    ``hook`` is the optimizer's step hook: Opacus' own, or a function that
    wraps it (found up to ``depth`` closures deep). Returns ``(None, None)``
    when there is none.

    Example:
        >>> find_opacus_hook(None)
        (None, None)
    """
    if hook is None or depth < 0:
        return None, None
    code = getattr(hook, "__code__", None)
    cells = getattr(hook, "__closure__", None) or ()
    if code is None:
        return None, None
    free = dict(zip(code.co_freevars, cells))
    if getattr(hook, "__qualname__", "") == _HOOK_QUALNAME and "sample_rate" in free:
        rate = free["sample_rate"].cell_contents
        accountant = free["self"].cell_contents if "self" in free else None
        return accountant, _number(rate)
    for cell in cells:
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(inner) and inner is not hook:
            found = find_opacus_hook(inner, depth - 1)
            if found != (None, None):
                return found
    return None, None


def _number(rate: Any) -> float | None:
    """``rate`` as a float, where it is a number: a Python one, numpy's float32 or a 0-d
    tensor (review rlo2: a hook made with ``sample_rate=np.float32(q)`` was not found, and a
    hand rate below it was charged); None for anything else."""
    if isinstance(rate, (str, bytes)):
        return None
    try:
        return float(rate)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None


def history_of(accountant: Any) -> History:
    """The accountant's history as a list of (σ, q, steps), or [] if it has none.

    Raises:
        LedgerStateError: the history is not a list of (σ, q, steps) rows as Opacus writes
            them (numpy or torch numbers allowed). It read as [] before review radv: one
            malformed row in a loaded Opacus history, and attach charged none of the steps
            the others recorded.
    """
    rows = getattr(accountant, "history", None)
    if rows is None:
        return []
    if not isinstance(rows, (list, tuple)) or not all(map(is_step_row, rows)):
        raise LedgerStateError(
            f"Opacus' accountant history {check.short(rows)} is not a list of "
            "(noise_multiplier, sample_rate, steps) rows, so the steps it recorded cannot be "
            "charged; it was edited, or written by something other than Opacus")
    return [(float(_item(s)), float(_item(q)), int(_item(k))) for s, q, k in rows]


def total_steps(history: History) -> int:
    return sum(k for _, _, k in history)


def steps_beyond(current: History, held: History) -> History | None:
    """The steps of ``current`` after those of ``held``, if ``current`` extends ``held``.

    Returns ``[]`` when ``current`` is a prefix of ``held`` (or equal, or
    empty: nothing new to charge) and ``None`` when neither extends the other.

    Example:
        >>> steps_beyond([(1.0, 0.1, 5), (0.8, 0.1, 3)], [(1.0, 0.1, 5), (0.8, 0.1, 1)])
        [(0.8, 0.1, 2)]
        >>> steps_beyond([(1.0, 0.1, 2)], [(1.0, 0.1, 5)])
        []
        >>> steps_beyond([(1.0, 0.1, 2)], [(0.5, 0.1, 5)]) is None
        True
    """
    a, b = _expand_runs(current), _expand_runs(held)
    i = j = 0
    a_left = b_left = 0
    while True:
        if a_left == 0 and i < len(a):
            a_key, a_left = a[i][:2], a[i][2]
            i += 1
        if b_left == 0 and j < len(b):
            b_key, b_left = b[j][:2], b[j][2]
            j += 1
        if b_left == 0:  # held is used up: the rest of current is new
            rest = [(*a_key, a_left)] if a_left else []
            return rest + [(s, q, k) for s, q, k in a[i:]]
        if a_left == 0:  # current is used up inside held: nothing new
            return []
        if a_key != b_key:
            return None
        take = min(a_left, b_left)
        a_left -= take
        b_left -= take


def _expand_runs(history: History) -> History:
    """Merge consecutive equal (σ, q) rows and drop empty ones."""
    out: History = []
    for s, q, k in history:
        if k <= 0:
            continue
        if out and out[-1][:2] == (s, q):
            out[-1] = (s, q, out[-1][2] + k)
        else:
            out.append((s, q, k))
    return out


def recorded_step(sigma: float, rate: float, base_rate: float | None,
                  aligned: bool = False) -> M.Mechanism:
    """The mechanism of a step Opacus recorded at ``rate``, the loader's rate being ``base_rate``.

    Opacus records an accumulated step at q·k (its hook multiplies the rate by
    ``accumulated_iterations``): a rate that is an integer multiple k > 1 of
    the loader's q is k accumulated micro-batches (docs/theory.md §14), not
    one batch at rate k·q; ``aligned`` is the user's opt-in to the aligned curve
    (``aligned_micro_batches=True``, integrations/_aligned.py).
    """
    if base_rate is not None and rate > base_rate:
        ratio = rate / base_rate
        k = round(ratio)
        if k > 1 and abs(ratio - k) <= 1e-9 * k:
            return M.AccumulatedSubsampledGaussian(sigma, base_rate, k, aligned=aligned)
    return M.SubsampledGaussian(sigma, rate)


def replay(ledger: Any, todo: History, label: str | None, coordinator: Any = None,
           error: Exception | None = None, *, attach_label: str | None = None,
           base_rate: float | None = None, aligned: bool = False) -> int:
    """Charge ``todo`` to ``ledger``, all or nothing: each (σ, q, k) row as k
    identical charges in one transaction (``charge(..., times=k)``, the same
    journal as k single charges); a q that is an integer multiple of
    ``base_rate`` (the loader's) as accumulated steps (:func:`recorded_step`; aligned
    with ``aligned``).

    The whole sequence is first tried on a separate in-memory copy of the
    ledger, so a refusal charges nothing. Returns the number of steps charged.
    """
    try:
        segments = [(recorded_step(s, q, base_rate, aligned), k) for s, q, k in todo]
    except Exception as exc:
        if coordinator is None:
            raise
        segments, error = [], error or exc  # raised on this rank inside the collective
    total = sum(k for _, k in segments)
    refused: list[M.Mechanism] = []

    def attempt() -> bool:
        if error is not None:
            raise error
        if not segments:
            return True
        trial = type(ledger).load_state_dict(ledger.state_dict())
        for step, k in segments:
            try:
                trial.charge(step, label=label, times=k)
            except BudgetExhausted:
                refused.append(step)
                return False
        done = 0
        for step, k in segments:
            try:
                ledger.charge(step, label=label, times=k)
            except BudgetExhausted as exc:  # another process charged the file meanwhile
                raise BudgetExhausted(
                    f"{done} of the {total} steps Opacus recorded were charged ({label!r}); "
                    f"then the ledger refused: {exc}", requested=step, label=label,
                    remaining=exc.remaining) from exc
            done += k
        return True

    def refusal() -> BudgetExhausted:
        step = refused[0] if refused else segments[0][0]
        outcome = ("nothing was charged and nothing was attached" if label == attach_label
                   else "nothing was charged; do not train on from this checkpoint")
        return BudgetExhausted(
            f"the {total} steps Opacus' accountant recorded ({_describe(todo)}) do not "
            f"fit the ledger's budget ({label!r}); {outcome}. Start a new ledger only if "
            "these steps were already accounted elsewhere; otherwise the budget is spent",
            requested=step, label=label, remaining=ledger.remaining(step))

    if coordinator is not None:
        # every rank's recorded steps are in the global sums: the chargers charge their own,
        # so the ranks must have recorded the same steps (review rgc)
        coordinator.agree([[step.to_dict(), k] for step, k in segments],
                          f"on the steps Opacus recorded ({label!r})", error)
        coordinator.run(attempt, f"while charging the steps Opacus recorded ({label!r})", refusal)
    elif not attempt():
        raise refusal()
    return total


def _describe(history: History) -> str:
    # σ and q as recorded and charged, never rounded (review rfp)
    return ", ".join(f"{k} × (σ={exact(s)}, q={exact(q)})" for s, q, k in history)
