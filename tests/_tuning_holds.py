"""Shared setup of the tests of a tuner's hold on its ledger (tasks adv2, radv2, lo6): a
small seeded tuner, a charge that records whether it was refused, and a run whose
candidates probe the ledger, every probe refused, the journal the tuning charge alone."""

from __future__ import annotations

from collections.abc import Callable

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard.tuning import Poisson, RandomSearch

RUN = M.Gaussian(10.0)


def tuner() -> RandomSearch:
    """A random search over two candidates, K ~ Poisson(6), seeded, no progress bar."""
    return RandomSearch({"x": [1, 2]}, Poisson(6.0), cost=RUN, seed=3, progress=False)


def try_charge(handle: Ledger, seen: list) -> None:
    """Charge ``handle`` once; record whether it was charged or refused (held)."""
    try:
        handle.charge(M.Gaussian(100.0), label="leak")
        seen.append("charged")
    except LedgerStateError:
        seen.append("refused")


def usable_after(handle: Ledger) -> None:
    """After the run the file takes a charge again: its journal is the tuning, then it."""
    handle.charge(M.Gaussian(100.0), label="after")
    assert [r.label for r in handle.history] == ["tuning", "after"]
    handle.close()


def probes_refused(ledger: Ledger, probe: Callable[[list], None],
                   journal: Ledger | None = None) -> None:
    """Run :func:`tuner` on ``ledger``, each candidate calling ``probe(seen)`` (which
    records in ``seen`` what each probe of the held store met, as :func:`try_charge`
    does) and scoring 1: a winner is selected, every probe was refused, and the journal
    (``journal``'s, else ``ledger``'s) holds the tuning charge alone."""
    seen: list = []

    def objective(params, child):
        probe(seen)
        return 1.0

    assert tuner().run(objective, ledger).selected
    assert seen and set(seen) == {"refused"}
    assert [r.label for r in (journal or ledger).history] == ["tuning"]
