"""The first broken step is refused before it is released (review rv of the x28 schedule).

x28 ran the noise test and the clipped-sum bound ``‖summed_grad‖ ≤ B·C`` on 1 step in 4
while σ and C stayed the same: a bug that starts mid-run was then released at each step
the schedule skipped (~3 steps on average; a step without noise is unbounded in ε). The
schedule is removed (git history 438c3a4): both run at every step. The per-sample
clipping check's own coins are forced to "skip" here, so only the every-step checks can
refuse. The ``skipped`` variants take the every-step check away from the broken step (what
a schedule with p < 1 does with probability 1 − p) and show that these tests then fail.
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


def _skip_every_step_checks(witnesses):
    """Take the noise test and the step bound away from every later step."""
    witnesses._check_noise = lambda sigma, records: None


def _noise_removed_mid_run(skip: bool) -> tuple[bool, int, int]:
    """(refused, steps charged before the bug, steps charged after one broken step)."""
    model, opt, loader, crit = pipeline()
    handle = attach(opt, Ledger(epsilon=EPSILON, delta=DELTA), data_loader=loader,
                    witnesses=True)
    assert run(model, opt, loader, crit, 3) == 3
    charged = handle.steps_charged
    if skip:
        _skip_every_step_checks(handle.witnesses)
    _no_noise(opt)  # from here on p.grad = summed_grad: no noise at all
    try:
        run(model, opt, loader, crit, 1)
    except PipelineMismatchError:
        return True, charged, handle.steps_charged
    return False, charged, handle.steps_charged


def _clipping_off_mid_run(skip: bool) -> tuple[bool, int, int]:
    model, opt, loader, crit = pipeline(clip=0.01)
    handle = attach(opt, Ledger(epsilon=EPSILON, delta=DELTA), data_loader=loader,
                    witnesses=True)
    assert run(model, opt, loader, crit, 3) == 3
    charged = handle.steps_charged
    handle.witnesses._coins = _Coins(1.0)  # the sampled per-sample check: not drawn (7/8)
    if skip:
        _skip_every_step_checks(handle.witnesses)
    _no_clipping(opt, handle)
    try:
        run(model, opt, loader, crit, 1)
    except PipelineMismatchError:
        return True, charged, handle.steps_charged
    return False, charged, handle.steps_charged


def test_noise_removed_mid_run_is_refused_at_its_first_step():
    refused, before, after = _noise_removed_mid_run(skip=False)
    assert refused and after == before


def test_clipping_off_mid_run_is_refused_at_its_first_step():
    refused, before, after = _clipping_off_mid_run(skip=False)
    assert refused and after == before


@pytest.mark.parametrize("broken_run", [_noise_removed_mid_run, _clipping_off_mid_run])
def test_the_tests_above_fail_when_the_broken_step_is_not_checked(broken_run):
    refused, before, after = broken_run(skip=True)
    assert not refused and after == before + 1  # released and charged: the bug got through
