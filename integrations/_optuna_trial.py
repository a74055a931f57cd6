"""The restricted trial an objective sees under :func:`privguard.integrations.optuna.private_optimize`.

A :class:`PrivateTrial` offers Optuna's ``suggest_float``, ``suggest_int``,
``suggest_categorical`` (and Optuna 5's deprecated ``suggest_uniform``,
``suggest_loguniform``, ``suggest_discrete_uniform``), ``params``, ``user_attrs``,
``set_user_attr``, ``report`` and ``should_prune``, all of this trial alone,
and nothing that reaches another trial: no ``study`` (Optuna's exposes every
trial's value and ``stop()``), no ``number`` (the winner's number is a lower
bound on K), no system attributes, no ``datetime_start``. Its values come
from one of two sources, both fixed before the trial starts:

* ``seed``: an Optuna ``RandomSampler`` of its own, seeded with a number the
  driver drew for this trial alone. The draws of one trial cannot shift the
  draws of the next (Optuna's shared generator would let a data-dependent
  number of ``suggest_*`` calls do that), so the trials are independent and
  identically distributed, which the random-K theorem assumes (seed 002).
* ``fixed``: the candidate the driver drew from DP-HyPO's bounded density
  (seed 003, Framework 1); ``suggest_*`` returns its value.

Pruning reads only this trial's own reported values (``ThresholdPruner``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._errors import InvalidArgumentError
from privguard._optional import require

try:
    import optuna
except ImportError:  # the install hint
    require("optuna", "optuna")
    raise

#: The params key under which the driver hands a random trial its seed.
SEED_KEY = "__privguard_trial_seed__"

_WITHHELD = {
    "study": "it exposes every other trial's value and study.stop()",
    "number": "a trial's number is a lower bound on the number of trials K, which is not released",
    "_trial_id": "it identifies the trial within the study",
    "system_attrs": "they belong to the study, not to this trial",
    "set_system_attr": "system attributes belong to the study",
    "datetime_start": "timing across trials is not released",
    "relative_params": "they belong to the study's sampler",
    "distributions": "use the values suggest_* returned",
    "set_constraint": "constraints decide feasibility for the study's best trial and its "
                      "samplers; a private tuning selects by value alone (not covered)",
    "constraints": "constraints decide feasibility for the study's best trial and its "
                   "samplers; a private tuning selects by value alone (not covered)",
}


class _OwnValues:
    """What a pruner sees: this trial's own reported values (a FrozenTrial's two fields)."""

    __slots__ = ("intermediate_values", "last_step")

    def __init__(self, values: dict[int, float]) -> None:
        self.intermediate_values = values
        self.last_step = max(values) if values else None


class PrivateTrial:
    """One trial as the objective sees it: Optuna's ``suggest_*`` API and nothing of the study.

    Example:
        >>> trial = PrivateTrial({SEED_KEY: 7}, fixed=False, pruner=None)
        >>> lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
        >>> 1e-4 <= lr <= 1.0, trial.suggest_float("lr", 1e-4, 1.0, log=True) == lr
        (True, True)
        >>> trial.number
        Traceback (most recent call last):
        ...
        AttributeError: trial.number is withheld by privguard: a trial's number is a lower bound on the number of trials K, which is not released
    """

    __slots__ = ("_distributions", "_draw", "_params", "_pruner", "_user_attrs", "_values")

    def __init__(self, params: dict[str, Any], *, fixed: bool, pruner: Any) -> None:
        self._params: dict[str, Any] = {}
        self._distributions: dict[str, Any] = {}
        self._user_attrs: dict[str, Any] = {}
        self._values: dict[int, float] = {}
        self._pruner = pruner
        if fixed:
            chosen = dict(params)
            self._draw: Callable[[str, Any], Any] = lambda name, dist: _fixed(chosen, name, dist)
        else:
            sampler = optuna.samplers.RandomSampler(seed=int(params[SEED_KEY]))
            # RandomSampler.sample_independent reads neither the study nor the trial.
            self._draw = lambda name, dist: sampler.sample_independent(
                None, None, name, dist)  # type: ignore[arg-type]

    def _suggest(self, name: str, dist: Any) -> Any:
        if not isinstance(name, str):
            raise InvalidArgumentError("name", name, "a parameter name must be a string")
        if name in self._params:
            if self._distributions[name] != dist:
                raise InvalidArgumentError("name", name,
                                           f"was suggested before with "
                                           f"{self._distributions[name]}, now with {dist}")
            return self._params[name]
        value = self._draw(name, dist)
        self._params[name], self._distributions[name] = value, dist
        return value

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        """As Optuna's ``Trial.suggest_float``."""
        return float(self._suggest(name, _distribution(
            "suggest_float", optuna.distributions.FloatDistribution, low=low, high=high,
            log=log, step=step)))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        """As Optuna's ``Trial.suggest_int``."""
        return int(self._suggest(name, _distribution(
            "suggest_int", optuna.distributions.IntDistribution, low=low, high=high, log=log,
            step=step)))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        """As Optuna's ``Trial.suggest_categorical``."""
        return self._suggest(name, _distribution(
            "choices", optuna.distributions.CategoricalDistribution, choices=choices))

    def suggest_uniform(self, name: str, low: float, high: float) -> float:
        """As Optuna's (deprecated, still in Optuna 5) ``Trial.suggest_uniform``:
        ``suggest_float(name, low, high)``."""
        return self.suggest_float(name, low, high)

    def suggest_loguniform(self, name: str, low: float, high: float) -> float:
        """As Optuna's ``Trial.suggest_loguniform``: ``suggest_float(..., log=True)``."""
        return self.suggest_float(name, low, high, log=True)

    def suggest_discrete_uniform(self, name: str, low: float, high: float, q: float) -> float:
        """As Optuna's ``Trial.suggest_discrete_uniform``: ``suggest_float(..., step=q)``."""
        return self.suggest_float(name, low, high, step=q)

    @property
    def params(self) -> dict[str, Any]:
        """As Optuna's ``Trial.params``: this trial's own suggested values (a copy)."""
        return dict(self._params)

    @property
    def user_attrs(self) -> dict[str, Any]:
        """As Optuna's ``Trial.user_attrs``: this trial's own attributes (a copy)."""
        return dict(self._user_attrs)

    def set_user_attr(self, key: str, value: Any) -> None:
        """As Optuna's ``Trial.set_user_attr``: released only if this trial wins."""
        if not isinstance(key, str):
            raise InvalidArgumentError("key", key, "a user attribute's key must be a string")
        self._user_attrs[key] = value

    def report(self, value: float, step: int) -> None:
        """As Optuna's ``Trial.report``; the value must be privatised and charged to the
        trial's child ledger (it decides pruning, which is part of the trial's output)."""
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise InvalidArgumentError("step", step, "must be an integer >= 0")
        # a string or a bool was taken through float() ("0.5", True as 1.0; task adv2)
        try:
            if isinstance(value, (bool, np.bool_, str, bytes)):
                raise TypeError
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgumentError("value", check.short(value), "must be a number") from None
        self._values.setdefault(int(step), number)  # Optuna keeps the first report

    def should_prune(self) -> bool:
        """As Optuna's ``Trial.should_prune``, from this trial's own reported values only."""
        if self._pruner is None:
            return False
        return bool(self._pruner.prune(None, _OwnValues(dict(self._values))))

    def __getattr__(self, name: str) -> Any:
        reason = _WITHHELD.get(name)
        if reason is None:
            raise AttributeError(f"a privguard trial offers suggest_float, suggest_int, "
                                 f"suggest_categorical (and the deprecated suggest_uniform, "
                                 f"suggest_loguniform, suggest_discrete_uniform), params, "
                                 f"user_attrs, set_user_attr, report and should_prune; "
                                 f"not {name!r}")
        raise AttributeError(f"trial.{name} is withheld by privguard: {reason}")

    def __repr__(self) -> str:
        return "PrivateTrial()"


def _distribution(argument: str, make: Callable[..., Any], **args: Any) -> Any:
    """Optuna's distribution, its refusal (low > high, NaN, a bad step) as InvalidArgumentError.

    Checked here first, since Optuna takes each of these with another meaning or lets a
    built-in escape (task adv2): NaN or ±inf bounds (its draw then overflows); a ``step``
    of NaN or ±inf (``OverflowError`` at the draw, after a warning); ``log="no"`` (truthy:
    a log scale); ``suggest_int`` with bounds or a step that are not integers (0.5 and
    1.5 were truncated); ``suggest_categorical`` with a string (its characters became the
    choices) or with no sequence at all.
    """
    integral = make is optuna.distributions.IntDistribution
    kind = "an integer" if integral else "a finite number"
    given = dict(args)  # as the caller gave them, for the messages
    for bound in ("low", "high", "step"):
        if bound not in args or (bound == "step" and args[bound] is None and not integral):
            continue
        # the project's own reading of a number: numpy scalars and 0-d arrays as the one
        # number they hold (review radv2: np.array(0.0) was refused), never a bool
        if integral:
            try:
                number: Any = check._as_int(bound, args[bound])
            except InvalidArgumentError:
                number = None
        else:
            number = check._real(args[bound])
            number = number if number is not None and math.isfinite(number) else None
        if number is None:
            raise InvalidArgumentError(argument, given, f"{bound} must be {kind}")
        args[bound] = number
    if "high" in args and not integral and not math.isfinite(
            (args["high"] - args["low"]) / (args["step"] or 1.0)):
        # numpy's draw overflowed (finite bounds, an infinite width; review radv2)
        raise InvalidArgumentError(argument, given, "(high - low) / step must be finite")
    if "log" in args:
        if not isinstance(args["log"], (bool, np.bool_)):  # numpy's True is True (radv2)
            raise InvalidArgumentError(argument, given, "log must be True or False")
        args["log"] = bool(args["log"])
    if "choices" in args:
        choices = args["choices"]
        if isinstance(choices, np.ndarray) and choices.ndim == 1:  # as Optuna takes it
            choices = args["choices"] = tuple(choices.tolist())
        if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
            raise InvalidArgumentError(argument, check.short(choices),
                                       "must be a sequence of choices (a list, a tuple or a "
                                       "1-d array)")
    try:
        return make(**args)
    except (TypeError, ValueError, ArithmeticError) as exc:  # decimal's too (radv2)
        raise InvalidArgumentError(argument, given, str(exc) or type(exc).__name__) from None


def _fixed(chosen: dict[str, Any], name: str, dist: Any) -> Any:
    """The drawn candidate's value for ``name``, which must lie in ``dist``."""
    if name not in chosen:
        raise InvalidArgumentError("name", name, "is not in DPHyPOSampler's search_space")
    value = chosen[name]
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        ok = value in dist.choices
    else:
        ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
              and math.isfinite(float(value)) and dist.low <= value <= dist.high
              and (not isinstance(dist, optuna.distributions.IntDistribution)
                   or float(value).is_integer()))
    if not ok:
        raise InvalidArgumentError(name, value, f"(search_space's value) is outside {dist}")
    return value


def optuna_value(value: Any) -> Any:
    """A one-element list or tuple as its element, as Optuna's single-objective study takes
    it (``return [loss]``); anything else unchanged. Returned as is it was no score, and
    every such trial ⊥ (review at). A two-element tuple stays ``(value, artifact)``."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return value[0]
    return value


class Winner:
    """What a trial hands back besides its score: released only if it wins."""

    __slots__ = ("artifact", "params", "user_attrs")

    def __init__(self, params: dict[str, Any], user_attrs: dict[str, Any], artifact: Any) -> None:
        self.params, self.user_attrs, self.artifact = params, user_attrs, artifact


class TrialObjective:
    """``objective(trial, child)`` as a privguard tuner's ``objective(params, child)``.

    Picklable (for Ray) when the user's objective and pruner are. Returns
    ``(score, Winner)`` or ``None`` (⊥); a trial that raises (``TrialPruned``
    included) is ⊥ in the executor, as in every privguard tuner.
    """

    def __init__(self, objective: Callable[[PrivateTrial, Any], Any], *, fixed: bool,
                 pruner: Any) -> None:
        self.objective, self.fixed, self.pruner = objective, fixed, pruner

    def __call__(self, params: dict[str, Any], child: Any) -> tuple[Any, Winner] | None:
        from privguard.integrations._optuna_sampler import silenced
        from privguard.tuning._base import accept

        trial = PrivateTrial(params, fixed=self.fixed, pruner=self.pruner)
        with silenced():  # also on a Ray worker: no log line or warning of a trial leaves
            outcome = accept(optuna_value(self.objective(trial, child)))
        if outcome is None:
            return None
        return outcome[0], Winner(dict(trial._params), dict(trial._user_attrs), outcome[1])
