"""One charge per global step and one decision on every rank under DDP (private).

Under Opacus' distributed optimizers (``DistributedDPOptimizer`` and its
per-layer, ghost-clipping and FSDP variants, built by ``make_private`` on a
``DPDDP``/``DDP``/FSDP module), every rank runs the optimizer's step hook once
per global step: after the noise is formed (on rank 0) and before any rank
reduces gradients or updates parameters. The global step is one
Poisson-subsampled Gaussian with the σ and q in force, whatever the number of
ranks, so it must be charged once, and every rank must take the same
admit/refuse decision before any of them enters ``all_reduce``.

The protocol (every rank runs it, at the same point):

1. **At attach** (collective: call ``attach`` on every rank). Each rank
   describes its ledger: the file it lives in (host and file identity), the
   server ledger's identity, or "in memory". Ranks whose ledgers are the same file on the same host share
   one ledger; its lowest rank is its *charger* and the others never charge
   it. Every in-memory ledger is its own charger (one replica per rank).
   All chargers' ledgers must be replicas: the same configuration, journal
   length and spent curve. Otherwise every rank raises
   :class:`RankDisagreementError`.
2. **Each step.** Every rank all-gathers ``(operation, status, σ, q, k)``,
   k the micro-batches it accumulated into the step: an error on some rank
   or ranks with different σ or q → every rank raises before anything is
   charged. Each charger then charges its ledger (one atomic
   check-and-charge) with the largest k of any rank (review rgc: every
   rank's draws are in the global sum; docs/theory.md §14.6) and asks
   whether the next step of the same mechanism would fit. Every rank then
   all-gathers ``(operation, status, -, k, next fits)`` and decides from the
   same table: all chargers admitted → every rank updates; all refused →
   every rank raises :class:`privguard.BudgetExhausted` before any update;
   anything else (mixed verdicts, an error on some rank) → every rank raises
   :class:`RankDisagreementError` before any update (fail closed; a charger
   that had admitted keeps the charge, an over-count). Steps Opacus recorded
   before attach are replayed only where every rank recorded the same
   (:meth:`Coordinator.agree`).

Under random allocation (``DistributedRandomAllocationSampler``) an epoch is charged
at its first step (:meth:`Coordinator.charge_once`) and whether the next one fits is
decided at its last (:meth:`Coordinator.all_fit`); every step's own refusals (k > 1
micro-batches, σ changed inside the epoch, more steps than batches) are taken together
first (:meth:`Coordinator.together`, one all-gather per step; task hl: a rank that
refused alone left the others waiting in the gradient ``all_reduce`` until the process
group's timeout), and every rank's σ and epochs to charge must be alike (review rhl:
rank 0 adds the noise, and each charger charged the epoch at its own σ).

So each distinct ledger is charged exactly once per global step (a shared
file once in all), ledger replicas stay equal, and no rank enters the
gradient ``all_reduce`` alone. The cost is two all-gathers of five
numbers per step. Loading a checkpoint through the engine is collective too (every
rank loads, as every rank attached); ranks found in different operations
raise :class:`RankDisagreementError` instead of pairing the wrong rows. A
server ledger (PostgreSQL) is one ledger for every rank that opens it, on any
machine: ranks are grouped by the identity the server gave it at creation,
not by the spelling of its URL.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
from collections.abc import Callable
from typing import Any

from privguard._accounting._results import exact
from privguard._errors import BudgetExhausted, InvalidArgumentError, LedgerStateError
from privguard._ledger._ledger import Ledger

__all__ = ["Coordinator", "RankDisagreementError", "is_distributed"]

NOT_CHARGER, ADMITTED, REFUSED, ERROR = 0.0, 1.0, 2.0, 3.0
# Which collective a row belongs to: ranks at different points (one loading a checkpoint,
# another stepping) meet in the same all_gather; the tag turns that into an error on both.
_STEP, _RUN, _FIT, _CHECK, _CHARGE, _AGREE, _TOGETHER = 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0
_OPS = {_STEP: "a training step", _RUN: "attach or a checkpoint load", _FIT: "attach",
        _CHECK: "a step's witness check", _CHARGE: "a training step's charge",
        _AGREE: "attach or a checkpoint load", _TOGETHER: "a random-allocation step's check"}
_WITNESSES = ("noise", "clipping", "sampling")  # their codes in the check's row: 1, 2, 3


class RankDisagreementError(LedgerStateError):
    """The ranks of a distributed run disagree about a charge; every rank stops.

    Raised on every rank at the same step, before any rank updates its
    parameters: the ranks' ledgers are not replicas of one another, some rank
    failed while charging, or ranks would charge different steps.
    """


def is_distributed(optimizer: Any) -> bool:
    """Whether ``optimizer`` is an Opacus distributed optimizer in a process group of >1 rank."""
    if not hasattr(optimizer, "world_size"):
        return False
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _ledger_key(ledger: Ledger, rank: int) -> tuple:
    if ledger.path is None:
        return ("memory", rank)
    server_id = getattr(ledger._store, "ledger_id", None)
    if server_id is not None:  # a server ledger: its identity, however each rank spells its URL
        return ("server", server_id)
    try:
        st = os.stat(ledger.path)
        return ("file", socket.gethostname(), st.st_dev, st.st_ino)
    except OSError:
        return ("store", ledger.path)


def _describe(ledger: Ledger, rank: int) -> dict[str, Any]:
    config = json.dumps(ledger._acc.config.to_dict(), sort_keys=True)
    spent = json.dumps(ledger.spent.tolist())
    return {"key": _ledger_key(ledger, rank),
            "config": hashlib.sha256(config.encode()).hexdigest(),
            "charges": len(ledger.history),
            "spent": hashlib.sha256(spent.encode()).hexdigest()}


class Coordinator:
    """Runs the protocol above for one attached ledger on this rank.

    Built inside ``attach`` on every rank (a collective call).
    """

    def __init__(self, ledger: Ledger, local_error: BaseException | None = None) -> None:
        import torch
        import torch.distributed as dist

        self._dist, self._torch = dist, torch
        self.ledger = ledger
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._device = (torch.device("cuda", torch.cuda.current_device())
                        if dist.get_backend() == "nccl" else torch.device("cpu"))
        mine: dict[str, Any] = {"error": None if local_error is None else repr(local_error)}
        if local_error is None:
            try:
                mine.update(_describe(ledger, self.rank))
            except Exception as exc:  # reported to every rank below
                local_error, mine["error"] = exc, repr(exc)
        table: list[Any] = [None] * self.world
        dist.all_gather_object(table, mine)
        self._raise_errors([row["error"] for row in table], local_error, "at attach")
        first: dict[tuple, int] = {}
        for r, row in enumerate(table):
            first.setdefault(row["key"], r)
        self.chargers = sorted(set(first.values()))
        self.is_charger = self.rank in self.chargers
        ref = table[self.chargers[0]]
        for r in self.chargers[1:]:
            if (table[r]["config"], table[r]["charges"], table[r]["spent"]) != (
                    ref["config"], ref["charges"], ref["spent"]):
                raise RankDisagreementError(
                    f"the ranks' ledgers are not replicas of one another (rank "
                    f"{self.chargers[0]}: {ref['charges']} charges, rank {r}: "
                    f"{table[r]['charges']} charges, or another configuration or spend); give "
                    "every rank the same ledger: one shared file (Ledger(..., path=...) on "
                    "every rank), or equal in-memory ledgers (built the same way, or restored "
                    "from the same state)")
        self.shared = len(self.chargers) < self.world

    # ----------------------------------------------------------------- steps
    def step(self, make_mechanism: Callable[[int], Any], micro_batches: int,
             label: str | None) -> tuple[bool, int]:
        """Charge one global step on every distinct ledger once; same outcome on every rank.

        ``make_mechanism(k)`` builds the step's mechanism for k micro-batches;
        ``micro_batches`` is this rank's k (the Poisson draws it accumulated
        into the step). Two all-gathers: the first agrees on the mechanism
        (every rank's σ, q and k, before anything is charged: errors and
        different σ or q raise on every rank, nothing charged); every charger
        then charges the step with the largest k of any rank (review rgc: a
        rank that accumulated more micro-batches than the charger adds more
        draws to the global sum than the charger's own k counts), and the
        second all-gather takes the verdicts. Returns whether the next step of
        the same mechanism fits (as decided together) and the k charged.
        Raises BudgetExhausted or RankDisagreementError on every rank alike.
        """
        sigma, q, err, mine = math.nan, math.nan, None, None
        status = NOT_CHARGER
        try:
            k = int(micro_batches)
            mech = mine = make_mechanism(k)
            sigma, q = float(mech.noise_multiplier), float(mech.sample_rate)
        except Exception as exc:  # reported to every rank below
            status, err, k = ERROR, exc, 0
        table = self._gather(_STEP, [status, sigma, q, float(k)])
        self._raise_errors([f"rank {r} failed" if row[0] == ERROR else None
                            for r, row in enumerate(table)], err, "while describing a step")
        for r, row in enumerate(table):
            if (row[1], row[2]) != (table[0][1], table[0][2]):
                raise RankDisagreementError(
                    # as gathered, never rounded: ':g' could show two different σ alike
                    f"ranks would charge different steps: rank 0 has σ={exact(table[0][1])}, "
                    f"q={exact(table[0][2])}, rank {r} has σ={exact(row[1])}, "
                    f"q={exact(row[2])}; every rank "
                    "stops before the update, nothing charged")
        # every rank's draws are in the global sum: the step holds up to the largest k
        widest = max(int(row[3]) for row in table)
        status, next_ok = NOT_CHARGER, 1.0
        try:
            if widest != k:
                mech, k = make_mechanism(widest), widest
            else:
                mech = mine
            if self.is_charger:
                try:
                    self.ledger.charge(mech, label=label)
                    status = ADMITTED
                    next_ok = float(self.ledger.can_afford(mech))
                except BudgetExhausted as exc:
                    status, err = REFUSED, exc
        except Exception as exc:  # reported to every rank below
            status, err = ERROR, exc
        table = self._gather(_CHARGE, [status, 0.0, float(k), next_ok])
        self._raise_errors([f"rank {r} failed" if row[0] == ERROR else None
                            for r, row in enumerate(table)],
                           err if status == ERROR else None, "while charging a step")
        self._decide([table[r][0] for r in self.chargers], err, mech, label)
        return all(table[r][3] > 0.5 for r in self.chargers), k

    def run(self, attempt: Callable[[], bool], what: str, refusal: Callable[[], BudgetExhausted]
            ) -> None:
        """Run ``attempt`` on chargers (True: done, False: refused); same outcome everywhere."""
        status, err = NOT_CHARGER, None
        try:
            if self.is_charger:
                status = ADMITTED if attempt() else REFUSED
        except Exception as exc:
            status, err = ERROR, exc
        table = self._gather(_RUN, [status, 0.0, 0.0, 1.0])
        self._raise_errors([f"rank {r} failed" if row[0] == ERROR else None
                            for r, row in enumerate(table)], err, what)
        verdicts = {table[r][0] for r in self.chargers}
        if verdicts == {REFUSED}:
            raise refusal()
        if verdicts != {ADMITTED}:
            raise RankDisagreementError(f"ranks disagree {what}: some ledgers admitted and "
                                        "others refused; the ledgers are not replicas")

    def agree(self, charges: list[Any], what: str, error: BaseException | None = None) -> None:
        """Every rank is about to charge ``charges`` (a list of JSON-able descriptions): raise
        on every rank unless all ranks hold the same list (review rgc: each charger charged
        the steps its own Opacus accountant recorded, and a rank whose recorded steps held
        more micro-batches than the charger's were charged as the charger's). ``error``: a
        failure found before on this rank, raised here as :meth:`run` would (collective).
        A list that is not strict JSON (a numpy scalar, NaN or ±inf, an object) is such a
        failure: InvalidArgumentError on its rank, RankDisagreementError on the others."""
        digest, count = bytes(12), 0
        if error is None:
            try:  # inside the collective (task lo: a TypeError here left before the gather,
                # and the other ranks' gathers met this rank's next collective call)
                if not isinstance(charges, list):
                    raise TypeError(f"a list, not {type(charges).__name__}")
                text = json.dumps(charges, sort_keys=True, allow_nan=False)
                digest, count = hashlib.sha256(text.encode()).digest(), len(charges)
            except (TypeError, ValueError) as exc:  # not JSON; NaN or inf (equal to nothing)
                error = InvalidArgumentError("charges", charges, "must be a JSON-able list "
                                             f"of finite values ({exc})")
        # two 48-bit pieces of the digest: exact in float64
        row = [ERROR if error is not None else NOT_CHARGER,
               float(int.from_bytes(digest[:6], "big")), float(int.from_bytes(digest[6:12], "big")),
               float(count)]
        table = self._gather(_AGREE, row)
        self._raise_errors([f"rank {r} failed" if t[0] == ERROR else None
                            for r, t in enumerate(table)], error, what)
        differ = [r for r, t in enumerate(table) if t[1:] != table[0][1:]]
        if differ:
            raise RankDisagreementError(
                f"ranks disagree {what}: rank 0 and rank {differ[0]} would charge different "
                "steps (their Opacus accountants recorded different steps: e.g. ranks that "
                "accumulated different numbers of micro-batches per step); nothing charged, "
                "every rank stops")

    def charge_once(self, ledger: Ledger, mechanism: Any, label: Any, what: str,
                    refused: str) -> None:
        """Charge ``mechanism`` once per distinct ledger (each charger charges its own), with
        the same outcome on every rank (:meth:`run`): admitted everywhere, or
        BudgetExhausted with the message ``refused`` everywhere, before any rank updates."""

        def attempt() -> bool:
            try:
                ledger.charge(mechanism, label=label)
            except BudgetExhausted:
                return False
            return True

        def refusal() -> BudgetExhausted:
            return BudgetExhausted(refused, requested=mechanism, label=label, remaining=None)

        self.run(attempt, what, refusal)

    def check_together(self, check: Callable[[], None]) -> None:
        """Run this rank's witness ``check``; refuse the step on every rank if any refused.

        Collective, before the step's charge (issue 28): every rank all-gathers
        (status, witness, charged, measured, step); a rank whose check raised
        :class:`~privguard.PipelineMismatchError` re-raises its own, every other
        rank raises one naming that rank's witness and numbers, so no rank
        charges or reduces gradients. Any other failure of a check stops every
        rank with :class:`RankDisagreementError`, as a failed charge does.
        """
        from privguard._errors import PipelineMismatchError

        status, row, err = ADMITTED, [0.0, 0.0, 0.0, 0.0], None
        try:
            check()
        except PipelineMismatchError as exc:
            status, err = REFUSED, exc
            mine = _WITNESSES.index(exc.witness) + 1.0 if exc.witness in _WITNESSES else 0.0
            if exc.step_charged:  # review rwl: every rank charges the step before refusing it
                mine = -mine
            row = [mine, float(exc.charged), float(exc.measured), float(exc.step)]
        except Exception as exc:  # reported to every rank below
            status, err = ERROR, exc  # type: ignore[assignment]
        table = self._gather(_CHECK, [status, *row])
        self._raise_errors([f"rank {r} failed" if t[0] == ERROR else None
                            for r, t in enumerate(table)],
                           err if status == ERROR else None, "while checking a step")
        # review rwl: the step is charged on every rank (one collective charge) where any
        # rank's refusal depends on its noisy gradient (step_charged), else on none
        charge = any(t[0] == REFUSED and t[1] < 0 for t in table)
        if err is not None:
            err.step_charged = charge
            raise err
        refused = [r for r, t in enumerate(table) if t[0] == REFUSED]
        if refused:
            r = refused[0]
            code, charged, measured, step = table[r][1:5]
            witness = _WITNESSES[int(abs(code)) - 1] if 1 <= abs(code) <= len(_WITNESSES) \
                else "?"
            error = PipelineMismatchError(
                f"{witness} witness on rank {r} refused this step (charged {exact(charged)}, "
                f"measured {measured:.4g}; its message is on that rank); every rank refuses it. "
                + ("The step was charged (the refusal depends on its noisy gradient), not "
                   "applied" if charge else "Nothing was charged or applied"),
                witness=witness, charged=charged, measured=measured, interval=None,
                step=int(step))
            error.step_charged = charge
            raise error

    def together(self, fn: Callable[[], Any], what: str,
                 agree: Callable[[Any], tuple[float, float]] | None = None) -> Any:
        """``fn()`` on every rank (a collective call): its result where it raised on no
        rank; else every rank raises before the update, its own error where ``fn`` raised,
        :class:`RankDisagreementError` naming that rank elsewhere (as a charge's refusal:
        no rank enters the gradient ``all_reduce`` alone). ``agree(result)``: two numbers
        every rank must hold alike (else every rank raises RankDisagreementError; review
        rhl: a random-allocation step's σ, which rank 0's noise has and each charger
        charged its own, and the epochs it charges, a collective each rank enters or not)."""
        out, err, status, mine = None, None, NOT_CHARGER, (0.0, 0.0)
        try:
            out = fn()
            if agree is not None:
                first, second = agree(out)
                mine = (float(first), float(second))
        except Exception as exc:  # reported to every rank below
            err, status = exc, ERROR
        table = self._gather(_TOGETHER, [status, *mine, 0.0])
        self._raise_errors([f"rank {r} refused the step" if row[0] == ERROR else None
                            for r, row in enumerate(table)], err, what)
        differ = [r for r, row in enumerate(table) if row[1:3] != table[0][1:3]]
        if differ:
            raise RankDisagreementError(
                f"ranks disagree {what}: rank 0 has (σ, epochs to charge) = "
                f"{tuple(table[0][1:3])} and rank {differ[0]} {tuple(table[differ[0]][1:3])} "
                "(every rank must step with the same noise multiplier and data loader "
                "epochs); every rank stops before the update")
        return out

    def all_fit(self, fits: Callable[[], bool]) -> bool:
        """Whether ``fits()`` holds on every charger (a collective call)."""
        ok = 1.0
        try:
            if self.is_charger:
                ok = float(fits())
        except Exception:
            ok = 0.0
        table = self._gather(_FIT, [NOT_CHARGER, 0.0, 0.0, ok])
        return all(table[r][3] > 0.5 for r in self.chargers)

    # --------------------------------------------------------------- helpers
    def _gather(self, op: float, row: list[float]) -> list[list[float]]:
        """All-gather one row per rank; every rank must be in the same operation."""
        torch = self._torch
        mine = torch.tensor([op, *row], dtype=torch.float64, device=self._device)
        out = [torch.empty_like(mine) for _ in range(self.world)]
        self._dist.all_gather(out, mine)
        table = [t.tolist() for t in out]
        for r, other in enumerate(table):
            if other[0] != op:
                raise RankDisagreementError(
                    f"rank {r} is in {_OPS.get(other[0], 'another operation')} while rank "
                    f"{self.rank} is in {_OPS[op]}: every rank must attach, step and load "
                    "checkpoints together")
        return [row[1:] for row in table]

    def _raise_errors(self, errors: list[Any], local: BaseException | None, what: str) -> None:
        if local is not None:
            raise local
        failed = [r for r, e in enumerate(errors) if e]
        if failed:
            raise RankDisagreementError(
                f"rank {failed[0]} failed {what} ({errors[failed[0]]}); every rank stops "
                "before the update")

    def _decide(self, verdicts: list[float], err: BaseException | None, mech: Any,
                label: str | None) -> None:
        kinds = set(verdicts)
        if kinds == {ADMITTED}:
            return
        if kinds == {REFUSED}:
            if err is not None:
                raise err
            try:
                remaining = self.ledger.remaining(mech)
            except Exception:
                remaining = None
            raise BudgetExhausted(
                f"charge {label!r} of {mech!r} refused by the ledger this rank shares with "
                f"rank {self.chargers[0]}, which charges it; nothing was recorded ({remaining})",
                requested=mech, label=label, remaining=remaining)
        raise RankDisagreementError(
            "the ranks' ledgers disagree about this step (some admitted it, others refused "
            "it): they are not replicas; every rank stops before the update")
