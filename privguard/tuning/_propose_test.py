"""Propose-test tuning with doubling steps (seed 004, Ding & Wu 2022; formulas.md §7).

Utility: subsample-and-aggregate. Every training example is assigned to one
of k partitions independently at random, each candidate is trained on each
partition (privately or not), and its utility is the mean validation accuracy
over the k partitions. Adding or removing one example changes one partition,
hence one accuracy in [0, 1] by at most 1, hence the utility by at most 1/k.

Loop (Algorithm 1): propose û = u + step·g + Lap(2/(kε₀)); scan the
candidates in order with noise Lap(4/(kε₀)) each and record the first whose
noisy utility reaches û (AboveThreshold); on a record, u += step·g and the
step doubles, otherwise the step halves (integer division); stop when the
step is 0 or u ≥ 1. Each round is ε₀-DP (seed 004, Theorem, eq. 1). The
number of rounds depends on the data, so each round is charged to the
ledger as a pure ε₀-DP mechanism just before it runs; the ledger's filter
refuses a round that would overspend and its odometer bounds any number of
rounds. A refused round stops the tuner, which returns the best candidate
recorded so far.

What a run releases, and why each part is covered. Each round's output is
AboveThreshold's: the index of the first candidate whose noisy utility
clears the noisy threshold, or "none"; that is what each ε₀ charge pays for.
The ledger covers the whole transcript of round outputs by adaptive
composition (its filter refuses a round that would overspend, its odometer
bounds any number of rounds). Everything in :class:`ProposeTestResult` is a
function of that transcript, hence post-processing:

* ``params``: the candidate of the last recorded round;
* ``rounds``: the transcript's length — every round is charged before its
  noise is drawn, so ``rounds`` equals the number of charges;
* ``utility_level`` u: u₀ plus step·g at each recorded round, where the step
  starts at 1, doubles after a record and halves after a miss — a
  deterministic function of the transcript;
* ``stopped_by_refusal``: whether the ledger refused the next round, a
  function of the ledger's journal, which holds only data-independent
  mechanisms (PureDP(ε₀) once per round, and what else was charged to it).

The utilities themselves are never released by :meth:`ProposeTest.run`.
Nothing that depends on the data may end the run either: an exception
raised after the partitions exist would be an output no round paid for
(whether it happens depends on non-selected candidates' accuracies). So
one partition's accuracy is mapped to a fixed value in [0, 1], never
refused and never dropped (docs/theory.md §8):

* a finite number outside [0, 1] is clamped to [0, 1];
* NaN, ±inf, a non-number, or a call that raises (any exception but
  ``KeyboardInterrupt``, ``SystemExit`` included) counts as 0 (⊥).

Each mapped value is still a function of that partition alone, in [0, 1],
so the aggregate's sensitivity stays 1/k (seed 004's argument unchanged);
nothing about it is raised or logged. A ``KeyboardInterrupt`` is taken to
be the user's and propagates (a fresh one, nothing charged if it came
before the first round); an objective that raises it on purpose, like one
that prints its data, is outside what a tuner can seal.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from privguard import _validation as check
from privguard._accounting._accounting import check_label
from privguard._accounting._results import exact, upper
from privguard._errors import BudgetExhausted, InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard._mechanisms._mechanisms import PureDP
from privguard.tuning._base import (
    as_score,
    check_copyable,
    check_ledger,
    check_objective,
    check_seed,
    held,
    make_rng,
    own_copy,
    sealed,
)
from privguard.tuning._quiet import candidate_scope, inside_candidate
from privguard.tuning._rehearse import Rehearsal
from privguard.tuning._space import SearchSpace


@dataclasses.dataclass(frozen=True)
class ProposeTestResult:
    """Everything propose-test tuning releases; each field is a function of the
    transcript of round outputs, which the ledger accounted round by round.

    Attributes:
        selected: False if no candidate was ever recorded.
        params: the last recorded candidate's hyperparameters.
        rounds: rounds run, equal to the number of PureDP(ε₀) charges.
        stopped_by_refusal: True if the ledger refused a round.
        utility_level: the accumulated threshold u: u₀ plus step·g per record.
        seeded: True if the noise came from a fixed seed (tests only).
    """

    selected: bool
    params: dict[str, Any] | None
    rounds: int
    stopped_by_refusal: bool
    utility_level: float
    seeded: bool


def partitions(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Assign each of n examples to one of k partitions independently; return index arrays.

    Raises:
        InvalidArgumentError: ``n`` too large for this process to hold a label per
            example (numpy's ValueError or MemoryError escaped before, review fs).
    """
    try:
        labels = rng.integers(k, size=n)
        return [np.flatnonzero(labels == i) for i in range(k)]
    except (MemoryError, ValueError, OverflowError) as exc:
        raise InvalidArgumentError(
            "n_examples", n, f"its partition labels cannot be drawn in this process "
            f"({type(exc).__name__}: about 8 bytes per example); nothing was charged") from None


class ProposeTest:
    """Propose-test tuning with doubling steps.

    Args:
        candidates: a finite :class:`SearchSpace`, a ``{name: values}``
            mapping, or a list of hyperparameter dicts (scanned in order).
        epsilon0: the privacy cost ε₀ of one round.
        partitions: k, the number of disjoint training partitions.
        granularity: g, the utility step.
        lower_bound: u₀, the starting utility level.
        seed: ONLY for tests (predictable noise breaks the guarantee).
        progress: show a progress bar of rounds.

    Example:
        >>> from privguard import Ledger
        >>> tuner = ProposeTest([{"lr": 0.1}, {"lr": 1.0}], epsilon0=0.5, partitions=5,
        ...                     granularity=0.05, progress=False)
        >>> ledger = Ledger(delta=1e-5)
        >>> result = tuner.select([0.2, 0.9], ledger)
        >>> result.rounds == len(ledger.history)
        True
    """

    def __init__(self, candidates: SearchSpace | Mapping | Sequence[dict], *, epsilon0: float,
                 partitions: int, granularity: float = 0.01, lower_bound: float = 0.0,
                 seed: int | None = None, progress: bool = True) -> None:
        if isinstance(candidates, (SearchSpace, Mapping)):
            space = candidates if isinstance(candidates, SearchSpace) else SearchSpace(candidates)
            candidates = space.candidates()
        if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence) or any(
                not isinstance(c, Mapping) for c in candidates):
            raise InvalidArgumentError("candidates", candidates,
                                       "must be a search space or a list of hyperparameter dicts")
        self.candidates = [dict(c) for c in candidates]
        if not self.candidates:
            raise InvalidArgumentError("candidates", candidates, "need at least one candidate")
        self.epsilon0 = check.positive_finite("epsilon0", epsilon0)
        self.k = check.positive_int("partitions", partitions)
        self.g = check.fraction("granularity", granularity)
        u0 = check.non_negative_finite("lower_bound", lower_bound)
        if u0 >= 1:
            raise InvalidArgumentError("lower_bound", lower_bound, "must lie in [0, 1)")
        self.u0 = u0
        self.seed = check_seed(seed)
        self.progress = check.flag("progress", progress)

    @property
    def threshold_scale(self) -> float:
        """Scale of the threshold noise: 2/(kε₀) (Algorithm 1, line 14)."""
        return 2.0 / (self.k * self.epsilon0)

    @property
    def candidate_scale(self) -> float:
        """Scale of each candidate's noise: 4/(kε₀) (Algorithm 1, line 17)."""
        return 4.0 / (self.k * self.epsilon0)

    def round_mechanism(self) -> PureDP:
        """What one round costs: pure ε₀-DP (seed 004, Theorem, eq. 1)."""
        return PureDP(self.epsilon0)

    def utilities(self, objective: Callable[[dict, np.ndarray], float], n_examples: int,
                  rng: np.random.Generator | None = None) -> np.ndarray:
        """Subsample-and-aggregate utilities, one per candidate (sensitivity 1/k).

        ``objective(params, indices)`` trains on the training examples at
        ``indices`` and returns a validation accuracy in [0, 1]. These
        utilities are NOT private: :meth:`run` never releases them.
        """
        check_objective(objective, call=("params", "indices"))
        n = self._examples(n_examples)
        rng = make_rng(self.seed) if rng is None else rng
        return self.aggregate(objective, partitions(n, self.k, rng))

    def aggregate(self, objective: Callable[[dict, np.ndarray], float],
                  parts: Sequence[np.ndarray]) -> np.ndarray:
        """Mean accuracy over the given partitions, per candidate.

        With the assignment of the other examples held fixed (the coupling
        in the sensitivity argument), adding or removing one example changes
        one partition, so each utility moves by at most 1/k. A partition on
        which the objective raises or returns NaN, ±inf or a non-number
        counts as accuracy 0, and a finite accuracy outside [0, 1] is
        clamped to [0, 1] (see the module docstring): each partition's
        value stays in [0, 1], so the sensitivity stays 1/k.

        Raises:
            InvalidArgumentError: ``objective`` or ``parts`` is malformed
                (checked before the objective runs).
        """
        check_objective(objective, call=("params", "indices"))
        if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence):
            raise InvalidArgumentError("parts", parts, "must be a sequence of index arrays")
        if len(parts) != self.k:
            raise InvalidArgumentError("parts", len(parts), f"need exactly k = {self.k} partitions")
        check_copyable("candidates", self.candidates)  # each call gets its own copy
        return _collect(objective, self.candidates, parts, self.k)

    def select(self, utilities: Sequence[float] | np.ndarray, ledger: Ledger,
               rng: np.random.Generator | None = None, label: str | None = "propose-test round"
               ) -> ProposeTestResult:
        """The propose-test loop on precomputed utilities, charging each round to ``ledger``.

        Raises:
            InvalidArgumentError: a bad argument (before any round is charged).
        """
        try:
            u_s = np.array(utilities, dtype=float)
        except Exception:  # by design: an int beyond float range, a raising __float__ (adv24)
            u_s = np.full(1, np.nan)
        if (u_s.shape != (len(self.candidates),) or not np.all(np.isfinite(u_s))
                or np.any((u_s < 0) | (u_s > 1))):
            raise InvalidArgumentError("utilities", utilities,
                                       f"need {len(self.candidates)} values in [0, 1]")
        check_ledger(ledger)
        label = check_label(label)
        if rng is not None and not callable(getattr(rng, "laplace", None)):
            raise InvalidArgumentError("rng", rng, "must be None or a numpy Generator")
        return self._loop(u_s, ledger, make_rng(self.seed) if rng is None else rng, label)

    def _loop(self, u_s: np.ndarray, ledger: Ledger, rng: Any, label: str | None
              ) -> ProposeTestResult:
        mech = self.round_mechanism()
        u, step, chosen, rounds, refused = self.u0, 1, None, 0, False
        from privguard._progress import progress

        shown = self.progress and not inside_candidate()  # nested in a candidate: nothing shown
        # not a terminal: one line when the rounds end, no carriage returns (task rd)
        with progress("propose-test", unit="round", shown=shown, leave=False) as bar:
            while step != 0 and u < 1:
                try:
                    ledger.charge(mech, label=label)  # before the round's noise is drawn
                except BudgetExhausted:
                    refused = True
                    break
                rounds += 1
                meter = ledger.budget() if shown else None
                if meter is not None:  # a round's charge is public (the bar counts rounds)
                    bar.set_postfix_str(  # spent rounded up, as every printed ε (review rlo2)
                        f"budget {upper(meter.spent, '.3g')} of ε = {exact(meter.epsilon)}")
                proposal = u + step * self.g + rng.laplace(0.0, self.threshold_scale)
                hit = None
                for s in range(len(u_s)):
                    if u_s[s] + rng.laplace(0.0, self.candidate_scale) >= proposal:
                        hit = s
                        break
                if hit is not None:  # the round's output: hit (or none)
                    chosen = hit
                    u += step * self.g
                    step *= 2
                else:
                    step //= 2
                bar.update(1)  # rounds are released: a function of the transcript
        params = None if chosen is None else own_copy(self.candidates[chosen])
        return ProposeTestResult(chosen is not None, params, rounds, refused, u,
                                 self.seed is not None)

    def rehearse(self, objective: Callable[[dict, np.ndarray], float], n_examples: int
                 ) -> Rehearsal:
        """Rehearse before :meth:`run`: the first candidate on one partition, nothing charged.

        Bind the objective to public or synthetic data of ``n_examples``
        examples: a rehearsal shows everything. Whatever the objective raises is
        re-raised as it is; an accuracy that is not a number in [0, 1] raises
        :class:`privguard.InvalidArgumentError` with its value (a run withholds it).
        """
        check_objective(objective, call=("params", "indices"))
        n = self._examples(n_examples)
        check_copyable("candidates", self.candidates)  # the call gets its own copy, as in run
        params = own_copy(self.candidates[0])
        part = partitions(n, self.k, make_rng(self.seed))[0]
        # its own copy (review rtl): an in-place edit stayed in the candidate for the real
        # run, which then trained and released hyperparameters nobody declared
        value = objective(own_copy(params), part)
        score = as_score(value)
        if score is None or not 0.0 <= score <= 1.0:
            raise InvalidArgumentError("objective", objective,
                                       f"returned {value!r} for {params!r}: utilities must be "
                                       "accuracies in [0, 1] (sensitivity 1/k)")
        return Rehearsal(params, score, None)

    def run(self, objective: Callable[[dict, np.ndarray], float], ledger: Ledger,
            n_examples: int) -> ProposeTestResult:
        """Utilities by subsample-and-aggregate, then the charged propose-test loop.

        Every argument is checked before the objective runs or anything is
        charged. Only the :class:`ProposeTestResult` leaves this call: the
        utilities and the partitions live in a frame that is dropped before
        anything is raised (as in :meth:`RandomSearch.run`).

        Once the data is touched, nothing about it can end the run: an
        accuracy outside [0, 1] is clamped, and a partition that raises or
        returns NaN or a non-number counts as 0 (module docstring).

        Raises:
            InvalidArgumentError: a bad argument; the objective did not run
                and nothing was charged.
            LedgerStateError: the ledger is unusable; the objective did not run.
            KeyboardInterrupt: interrupted (a fresh one, carrying nothing of
                the run); rounds already charged stay charged.
            TuningAborted: anything else escaped (cause withheld), e.g. the
                ledger failing mid-loop; rounds already charged stay charged.
        """
        check_objective(objective, call=("params", "indices"))
        check_ledger(ledger)
        n = self._examples(n_examples)
        check_copyable("candidates", self.candidates)  # each call gets its own copy
        # an unusable ledger raises here (LedgerStateError), before the objective runs;
        # one without room for a single round ends the run before it touches the data
        if not ledger.can_afford(self.round_mechanism()):
            return ProposeTestResult(False, None, 0, True, self.u0, self.seed is not None)
        rng = make_rng(self.seed)
        # The partitions are drawn before the sealed part (data-independent, from the
        # same stream, first, as before): an n_examples too large to draw them for is
        # refused here, not as a TuningAborted saying a bound was charged (review fs).
        # They then live only in _run's frame (the list is emptied there).
        drawn = [partitions(n, self.k, rng)]
        return sealed(lambda: self._run(objective, ledger, drawn, rng))

    def _examples(self, n_examples: Any) -> int:
        """``n_examples``, at least the number of partitions k (review bx: k = 10⁹ over 100
        examples built 10⁹ index arrays and called the objective 10⁹ times per candidate
        on empty ones, for hours or until MemoryError; each partition needs examples)."""
        n = check.positive_int("n_examples", n_examples)
        if n < self.k:
            raise InvalidArgumentError("n_examples", n_examples, f"must be at least the number "
                                       f"of partitions, {self.k} (each trains on its own part)")
        return n

    def _run(self, objective: Callable, ledger: Ledger, drawn: list,
             rng: np.random.Generator) -> ProposeTestResult:
        """Everything that touches the data; its only exit is the charged loop's result.

        ``ledger`` refuses every read and charge while the partitions train (as in every
        tuner, :func:`~privguard.tuning._base.held`): a partition's objective that charged
        the ledger it captured wrote one journal entry per (candidate, partition), whose
        times are each candidate's data-dependent training time and whose count the
        objective may decide from a utility, none of it paid for by a round; held, such a
        call raises ``LedgerStateError`` and the partition is ⊥ (0).
        """
        parts = drawn.pop()
        with held(ledger):
            u_s = _collect(objective, self.candidates, parts, self.k)
        del parts
        return self._loop(u_s, ledger, rng, "propose-test round")

    def worst_case_rounds(self) -> int:
        """Rounds never exceed 2⌈(1 − u₀)/g⌉ + 1.

        Each recorded round adds at least g to u (stop at u ≥ 1) and doubles
        the step; each other round halves it, and the loop stops at step 0, so
        unrecorded rounds are at most recorded rounds + 1.
        """
        return 2 * math.ceil((1 - self.u0) / self.g - 1e-12) + 1

    def worst_case_epsilon(self, delta: float) -> float:
        """The paper's bound: advanced composition (Dwork, Rothblum & Vadhan 2010,
        Thm III.3) of the worst-case number of ε₀-DP rounds, at δ:
        ε = sqrt(2T·log(1/δ))·ε₀ + T·ε₀·(e^ε₀ − 1)."""
        d = check.delta("delta", delta)
        t, e = self.worst_case_rounds(), self.epsilon0
        return math.sqrt(2 * t * math.log(1 / d)) * e + t * e * math.expm1(e)


def _collect(objective: Callable, candidates: list[dict], parts: Sequence[np.ndarray],
             k: int) -> np.ndarray:
    """Mean accuracy per candidate over ``parts``, each partition's accuracy in [0, 1]."""
    out = np.empty(len(candidates))
    for s, params in enumerate(candidates):
        out[s] = sum(_accuracy(objective, params, part) for part in parts) / k
    return out


def _accuracy(objective: Callable, params: dict, part: Any) -> float:
    """One partition's accuracy, mapped to a fixed value in [0, 1] whatever happens.

    A finite number is clamped to [0, 1]; ⊥ (the call raised anything but
    ``KeyboardInterrupt``, or returned NaN, ±inf or a non-number) is 0.0.
    Never raises (but ``KeyboardInterrupt``), never drops the partition: an
    aggregate that could switch between a number and −∞ or an exception
    with one partition would not have sensitivity 1/k (docs/theory.md §8).
    """
    # about a candidate that may not be selected (review bx, at); the scope also covers the
    # except clauses, where a raising call's frames (its locals) are finalised (review rtl)
    with candidate_scope():
        try:
            # its own copy: an in-place edit of a value reached the next partitions' calls
            # (their accuracies then depended on each other: sensitivity not 1/k; review tl)
            # and of the indices (an in-place sort or shuffle reached the next candidates)
            value = as_score(objective(own_copy(params), np.array(part)))
        except KeyboardInterrupt:
            raise  # the user's; sealed() replaces it with a fresh one
        except BaseException:  # by design: a failed partition is ⊥ (SystemExit included)
            return 0.0
    if value is None:
        return 0.0
    return min(max(value, 0.0), 1.0)  # clamp to [0, 1] (seed 004: utilities in [0, 1])
