"""Review ry: the repeat test's state when a step's check stops between the noise pass and
the repeat test (an interrupt, a torch error: not a refusal, which ends the run anyway).

Task t28 moved the difference ẑ_t − ẑ_{t−1} into :meth:`Witnesses._measure`, written in place
over ẑ_{t−1}'s row, while the row index of the last ẑ (``_zprev``) is committed later, in
``_noise_parts``. A check stopped in between (Ctrl-C during the step's one host sync, where
a GPU step waits) left that row holding the difference, and the next step's repeat test
compared the noise with it instead of with the last released step's: noise replayed from
that step then passed once more (cf54ad5, whose noise pass ran in ``_noise_parts`` after
``_measure``'s sync, compared with ẑ_{t−1} and refused it).
"""

from __future__ import annotations

import pytest
import torch
from test_witnesses import DELTA, EPSILON, _refusal, pipeline, reseeded

from privguard import Ledger
from privguard.integrations.opacus import attach


@pytest.mark.parametrize("where", ["during the sync", "after the noise pass"])
def test_noise_replayed_after_an_interrupted_check_is_caught_at_once(where, monkeypatch):
    model, opt, loader, crit = pipeline()
    handle = attach(opt, Ledger(epsilon=EPSILON, delta=DELTA), data_loader=loader, witnesses=True)
    w = handle.witnesses
    reseeded_step = reseeded(model, opt, loader, crit)
    reseeded_step()  # step 1: released (nothing to compare with yet)
    assert handle.steps_charged == 1
    measure = w._measure

    def interrupted(scale):
        if where == "during the sync":  # Ctrl-C while the host waits for the device
            def stop(self, *args, **kwargs):
                raise KeyboardInterrupt
            with monkeypatch.context() as m:
                m.setattr(torch.Tensor, "tolist", stop)
                measure(scale)
        measure(scale)
        raise KeyboardInterrupt  # after the noise pass, before the repeat test

    w._measure = interrupted
    with pytest.raises(KeyboardInterrupt):
        reseeded_step()  # step 2: stopped in its check, neither charged nor applied
    del w._measure
    assert handle.steps_charged == 1 and w.failure is None
    # step 3 replays step 1's noise (the generator reseeded again): refused at once
    exc = _refusal(handle, model, opt, loader, crit, steps=1, one_step=reseeded_step)
    assert exc.witness == "noise" and "previous step" in str(exc)
    assert handle.steps_charged == 1
