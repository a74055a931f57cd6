"""How a ledger travels: its state as plain data, and pickling. A mixin of the Ledger.

``state_dict()`` / ``Ledger.load_state_dict(state)`` build a separate ledger
from any valid state; ``ledger.load_state_dict(state)`` only moves a ledger
forward (the loaded journal must extend its own). An in-memory ledger
pickles as its verified state; a file-backed one as a reference to its store.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from privguard._accounting._accounting import is_retarget
from privguard._accounting._derivation import first_difference
from privguard._accounting._journal import Run
from privguard._errors import LedgerStateError
from privguard._ledger import _fork
from privguard._stores import _handles
from privguard._stores import _state as state_io

if TYPE_CHECKING:
    from privguard._accounting._accounting import Accounting

L = TypeVar("L", bound="LedgerState")


class _hybridmethod:
    """``Ledger.load_state_dict(sd)`` builds a ledger; ``ledger.load_state_dict(sd)`` loads in place."""

    def __init__(self, cls_func: Callable, inst_func: Callable) -> None:
        self.cls_func, self.inst_func = cls_func, inst_func
        self.__doc__ = inst_func.__doc__

    def __get__(self, obj: Any, cls: Any) -> Any:
        return (self.cls_func if obj is None else self.inst_func).__get__(obj, cls)



class LedgerState:
    """State and pickling for :class:`privguard.Ledger` (see the module docstring)."""

    _acc: Accounting
    _backend: Any
    _store: Any
    _broken: str | None
    _lock: Any
    _txn: Any
    _pending: Any

    if TYPE_CHECKING:  # provided by the Ledger
        def _synced(self, write: bool) -> AbstractContextManager[Any]: ...
        def _setup(self, listeners: Any, store: Any) -> None: ...
        def _settle(self) -> None: ...
        def close(self) -> None: ...

        @classmethod
        def open(cls: type[L], path: Any, *, lease: int | None = None,
                 prefetch: bool | None = None, read_only: bool = False) -> L: ...

    def state_dict(self) -> dict[str, Any]:
        """A JSON-ready snapshot: configuration, journal (as runs) and a checksum.

        Raises:
            LedgerStateError: the ledger's file cannot be read back whole.
        """
        with self._synced(write=False):
            return state_io.state_dict(self._acc, self._backend.items(self._acc))

    @classmethod
    def _from_state_dict(cls: type[L], state: Any) -> L:
        """A new in-memory ledger from :meth:`state_dict` output, validated and replayed."""
        acc, _ = state_io.load(state)
        self = cls.__new__(cls)
        self._setup([], None)
        self._acc = acc
        return self

    def _load_state_dict_inplace(self: L, state: Any) -> L:
        """Bring this ledger forward to ``state`` after validating it fully.

        The state must have this ledger's configuration and its journal must
        extend this ledger's journal (a checkpoint this ledger wrote later,
        say): a ledger never goes backwards. A file-backed ledger accepts only
        a state its file already holds. Anything else raises
        :class:`LedgerStateError` and leaves this ledger unchanged.
        ``Ledger.load_state_dict(state)``, called on the class, builds a
        separate ledger from any valid state instead.
        """
        loaded, _ = state_io.load(state)
        if state.get("version") == 1:  # load() read a dict; a 0.1 state never extends a ledger
            raise LedgerStateError(
                "a privguard 0.1 state (version 1) loads only as a separate ledger: use "
                "Ledger.load_state_dict(state), called on the class")
        with self._synced(write=False):
            problem = self._refusal(loaded, self._backend.items(self._acc))
            if problem is None and self._store is None:
                self._acc = loaded
        # Raised outside the transaction: a state the caller passed that does not fit is
        # the argument's problem, and leaves this ledger usable (a store that fails its
        # checks inside the transaction breaks it).
        if problem is not None:
            raise LedgerStateError(problem)
        return self

    def _refusal(self, loaded: Accounting, mine: list[Any]) -> str | None:
        """Why ``loaded`` may not be loaded in place over journal ``mine``, or None."""
        theirs = loaded.items()
        if loaded.config != self._acc.config:
            return ("state was written by a ledger with another configuration ("
                    f"{loaded.config.mismatch(self._acc.config, 'state', 'this ledger')}). "
                    "Load it into a ledger built with the state's configuration, or build "
                    "one from it: Ledger.load_state_dict(state)")
        if self._store is not None:
            if not _is_prefix(theirs, mine):
                return (f"{self._store.path}: the state to load is not a prefix of this "
                        "file's journal; a file-backed ledger never replaces its journal. "
                        "Resume an in-memory ledger's checkpoint into an in-memory ledger "
                        "(Ledger(...) without path=, or Ledger.load_state_dict(state)); a "
                        "file ledger resumes from checkpoints written while it was attached")
            return None
        fix = _differing_fix(mine, theirs)
        if fix is not None:
            return (f"the state's fix entry (the choices derived from the plan before the "
                    f"first charge) is not the one this ledger fixed ({fix} differs): it was "
                    "written by another ledger or for another plan, so it does not extend "
                    "this ledger's journal. Build a separate ledger with "
                    "Ledger.load_state_dict(state) if that is what you mean")
        if not _is_prefix(mine, theirs):
            return (f"the state to load ({loaded.journal.charges} charges) does not extend "
                    f"this ledger's journal ({self._acc.journal.charges} charges): loading it "
                    "would rewind or rewrite spent budget. A ledger never goes backwards; "
                    "build a separate ledger with Ledger.load_state_dict(state) if that is "
                    "what you mean")
        if any(not isinstance(item, Run) and (is_retarget(item[1]) or "retargets" in item[1])
               for item in theirs[len(mine):]):
            # An in-memory ledger has no retarget: a state that retargets after this
            # ledger's journal is not a later checkpoint of it. Loaded, a retarget (or a
            # round trip to another target and back) would swap a hybrid filter for the
            # RDP filter at the full δ, a relaxation. A migrate event's list of 0.1
            # retargets would move guarantee() to the δ it names (adv24).
            return ("the state to load retargets this ledger after its journal; an in-memory "
                    "ledger never retargets, so loading it in place would change the rule "
                    "that admitted its charges. Build a separate ledger with "
                    "Ledger.load_state_dict(state) if that is what you mean")
        return None

    load_state_dict = _hybridmethod(_from_state_dict, _load_state_dict_inplace)

    def __getstate__(self) -> dict[str, Any]:
        """An in-memory ledger pickles as its verified state; a file-backed one as a
        reference to its file, reopened and verified on load. Listeners are not pickled."""
        if self._store is not None:  # a lease cap set by the user travels (never the lease)
            from privguard._accounting._lease import DEFAULT_CAP

            # A prefetch in flight commits first (one not begun never does): the file a
            # copy reopens holds what this ledger's reads show (docs/theory.md §13).
            with self._txn, self._lock:
                if self._pending is not None:
                    self._settle()
                # how far its journal went, read between two transactions, as every read
                # holds both locks (docs/theory.md §13 "Locks"; review rsq)
                reference = self._store.reference()

            cap = getattr(self, "_lease_cap", DEFAULT_CAP)
            prefetch = getattr(self, "_prefetch_arg", None)
            # a read-only ledger reopens read-only: its copy was writable (review at); a
            # closed one reopens closed: its copy was open and writable (review lo2)
            closed = self._broken == "closed"
            return {"store": reference} | ({} if cap == DEFAULT_CAP else {"lease": cap}) \
                | ({} if prefetch is None else {"prefetch": prefetch}) \
                | ({"read_only": True} if self._store.read_only or closed else {}) \
                | ({"closed": True} if closed else {})
        return {"state": self.state_dict()}  # a closed in-memory ledger refuses it

    def __setstate__(self, data: dict[str, Any]) -> None:
        # the payload __getstate__ writes, else refused: an edited pickle raised KeyError or
        # TypeError here (review fs)
        # exactly one of the two: a 'state' beside a 'store' that is not a reference (None)
        # passed and then raised TypeError (review radv)
        store = data.get("store") if isinstance(data, dict) else None
        if not isinstance(data, dict) or ("store" in data) == ("state" in data) or (
                "store" in data and not (isinstance(store, dict) and "path" in store)):
            raise LedgerStateError(
                "a pickled Ledger's payload is not one privguard writes (a dict with a "
                "'store' reference naming its 'path', or a 'state', not both): the pickle was "
                "edited or is not a Ledger's; refusing it")
        other = (type(self).open(data["store"]["path"], lease=data.get("lease"),
                                 prefetch=data.get("prefetch"),
                                 read_only=data.get("read_only", False))
                 if "store" in data else type(self)._from_state_dict(data["state"]))
        check = getattr(other._store, "check_reference", None)
        if check is not None and "store" in data and ("file_id" in data["store"]
                                                      or "ledger_id" in data["store"]):
            try:  # the pickled ledger, as far as it went or further: a file's file_id
                # (review sq), a server ledger's ledger_id (review pgf), and how far its
                # journal went (reviews rsq, pgx); a pickle from before has neither
                check(data["store"])
            except BaseException:
                other._store.close(warn=False)
                raise
        if data.get("closed", False) is not False:  # read as the file holds it, then closed
            other.close()
        self.__dict__.update(other.__dict__)
        # ``other`` registered itself for the at-fork hook (its locks, the lease drop:
        # docs/theory.md §13 "Forks") and as a handle of its store, which a tuner's hold
        # reaches (review radv2: a copy made before the run was not, and charged the
        # journal once per candidate); ``self`` is the ledger that lives on from now on
        _fork.track(self)
        if self._store is not None and self._broken is None:  # a closed copy stays closed
            _handles.register(self)


def _differing_fix(mine: list[Any], theirs: list[Any]) -> str | None:
    """The field in which the first fix entry of ``theirs`` differs from the one in
    ``mine`` when both have one ("" for the whole record), else None."""
    fixes = [next((item[1] for item in items if not isinstance(item, Run)
                   and item[0] == "fix"), None) for items in (mine, theirs)]
    if fixes[0] is None or fixes[1] is None:
        return None
    return first_difference(fixes[1], fixes[0])


def _is_prefix(shorter: list[Any], longer: list[Any]) -> bool:
    """Whether journal ``shorter`` is a prefix of ``longer`` (its last run may have grown)."""
    if len(shorter) > len(longer):
        return False
    for i, (a, b) in enumerate(zip(shorter, longer)):
        if isinstance(a, Run) and isinstance(b, Run):
            grew = i == len(shorter) - 1 and a.count <= b.count
            if a.key() != b.key() or a.start != b.start or a.first_time != b.first_time \
                    or not (a == b or grew):
                return False
        elif a != b:
            return False
    return True
