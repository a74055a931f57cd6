"""Under DDP, whether the next random-allocation epoch fits is one decision for all ranks.

Each rank answering ``should_stop`` from its own ledger could differ between ranks (a shared
file charged by another job between two ranks' reads): one rank would stop while the other
entered the next epoch's collective charge alone. The decision is taken together, at attach
and at each epoch's last step (``Coordinator.all_fit``), which every rank reaches together.
Here one process stands in for a rank whose peers found the next epoch not to fit.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

import test_allocation_attach as A  # noqa: E402

from privguard import Ledger  # noqa: E402
from privguard import mechanisms as M  # noqa: E402
from privguard.integrations._distributed import Coordinator  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = A.pytestmark


class _Peers:
    """A coordinator whose other ranks admit every charge and find the next epoch unaffordable."""

    def __init__(self):
        self.asked = 0

    def run(self, attempt, what, refusal):  # the epoch's charge: this rank's own attempt
        assert attempt()

    charge_once = Coordinator.charge_once  # the real one, through run() above

    def together(self, fn, what, agree=None):  # a step's own checks: no peer refuses (task hl)
        return fn()

    def all_fit(self, fits):
        self.asked += 1
        fits()  # this rank's answer (True here) ...
        return False  # ... and a peer's "no": not every charger fits


def test_the_next_epoch_is_decided_together_at_the_last_step_of_an_epoch():
    model, opt, loader = A._setup()
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    handle = attach(opt, ledger, data_loader=loader)
    peers = handle._coordinator = _Peers()
    handle._next_ok = True  # as decided at attach
    stops = []
    for x, y in loader:
        A._step(model, opt, x, y)
        stops.append(handle.should_stop)
    assert [r.mechanism for r in ledger.history] == [M.RandomAllocation(A.SIGMA, A.T)]
    assert ledger.can_afford(M.RandomAllocation(A.SIGMA, A.T))  # this rank alone would go on
    assert peers.asked == 1  # once, at the epoch's last step
    assert stops == [False] * (A.T - 1) + [True]  # the ranks' decision, not this ledger's
