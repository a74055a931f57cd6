"""Review sc: ``EpochCharges.rebind`` (a framework rebuilt the RandomAllocationSampler
loader, integrations/lightning.py) skipped attach's checks, and a never-begun iterator of
the old sampler could still draw an epoch of it that nothing charged."""

from __future__ import annotations

import pytest

from privguard import InvalidArgumentError, Ledger, Plan
from privguard import mechanisms as M
from privguard.integrations import RandomAllocationSampler
from privguard.integrations._allocation import EpochCharges


def _charged(old: RandomAllocationSampler) -> EpochCharges:
    charges = EpochCharges(old)
    next(iter(old))
    due = charges.pending(1.0)
    assert due is not None
    charges.done(1.0, due)
    return charges


def test_rebind_refuses_a_plain_sampler_under_ddp_and_keeps_the_old_one():
    old, new = RandomAllocationSampler(8, 2), RandomAllocationSampler(8, 2)
    charges = _charged(old)
    with pytest.raises(InvalidArgumentError, match="DistributedRandomAllocationSampler"):
        charges.rebind(new, Ledger(delta=1e-5), distributed=True)
    assert charges.sampler is old and old.epochs_started == 1  # nothing changed


def test_rebind_refuses_a_t_the_hybrid_filter_has_no_envelope_for():
    ledger = Ledger(epsilon=5.0, delta=1e-5, plan=Plan(M.RandomAllocation(2.0, 2), steps=2),
                    filter="hybrid")
    old = RandomAllocationSampler(8, 2)
    charges = _charged(old)
    charges.rebind(RandomAllocationSampler(8, 2), ledger, distributed=False)  # same t: fine
    with pytest.raises(InvalidArgumentError, match="no certified PLD envelope"):
        charges.rebind(RandomAllocationSampler(8, 4), ledger, distributed=False)


def test_a_never_begun_iterator_of_the_old_sampler_is_refused():
    old, new = RandomAllocationSampler(8, 2), RandomAllocationSampler(8, 2)
    charges = _charged(old)
    fresh = iter(old)  # made before the reload, not begun
    charges.rebind(new, Ledger(delta=1e-5), distributed=False)
    next(iter(new))  # the new loader's epoch: charged at the next step
    with pytest.raises(InvalidArgumentError, match="replaced RandomAllocationSampler"):
        next(fresh)  # was: drew epoch 2 of the old sampler, stepped on inside the new epoch
    with pytest.raises(InvalidArgumentError, match="replaced RandomAllocationSampler"):
        next(iter(old))
    assert old.epochs_started == 2  # the rebind's end of its open epoch; no epoch drawn since
    # handed back to the old sampler, its epochs are charged again
    charges.rebind(old, Ledger(delta=1e-5), distributed=False)
    next(iter(old))
    due = charges.pending(1.0)  # (the rebind's end of its epoch counts as one: conservative)
    assert due is not None and due.epochs >= 1
