"""The first broken step is refused before it is released (review rv of the x28 schedule).

x28 ran the noise test and the clipped-sum bound ``‖summed_grad‖ ≤ B·C`` on 1 step in 4
while σ and C stayed the same: a bug that starts mid-run was then released at each step
whose coin said "skip" (3/4 for its first step, ~3 steps on average; a step without noise
is unbounded in ε). Both now run at every step (STEP_CHECK_RATE = 1). The coins are
forced to "skip" (what a schedule with p < 1 would do with probability 3/4, resp.
3/4 · 7/8 with the per-sample check): the first broken step must still be refused.
These tests fail with x28's p = 1/4.
"""

from __future__ import annotations

import pytest
from test_witnesses import (
    DELTA,
    EPSILON,
    _Coins,
    _no_clipping,
    _no_noise,
    pipeline,
    run,
)

from privguard import Ledger, PipelineMismatchError
from privguard.integrations.opacus import attach


def test_noise_removed_mid_run_is_refused_at_its_first_step():
    model, opt, loader, crit = pipeline()
    handle = attach(opt, Ledger(epsilon=EPSILON, delta=DELTA), data_loader=loader,
                    witnesses=True)
    assert run(model, opt, loader, crit, 3) == 3
    charged = handle.steps_charged
    handle.witnesses._step_coins = _Coins(1.0)  # this step's coin: not drawn (p = 3/4)
    _no_noise(opt)  # from here on p.grad = summed_grad: no noise at all
    with pytest.raises(PipelineMismatchError):
        run(model, opt, loader, crit, 1)
    assert handle.steps_charged == charged


def test_clipping_off_mid_run_is_refused_at_its_first_step():
    model, opt, loader, crit = pipeline(clip=0.01)
    handle = attach(opt, Ledger(epsilon=EPSILON, delta=DELTA), data_loader=loader,
                    witnesses=True)
    assert run(model, opt, loader, crit, 3) == 3
    charged = handle.steps_charged
    handle.witnesses._coins = _Coins(1.0)  # the sampled per-sample check: not drawn (7/8)
    handle.witnesses._step_coins = _Coins(1.0)  # the step bound: not drawn (3/4)
    _no_clipping(opt, handle)
    with pytest.raises(PipelineMismatchError):
        run(model, opt, loader, crit, 1)
    assert handle.steps_charged == charged
