"""``Plan.from_opacus``: the plan of the run Opacus will execute (private).

σ is the optimizer's ``noise_multiplier`` and q the rate its Poisson loader
samples at, exactly as Opacus uses them (``DPDataLoader`` samples at
1/len(loader), not batch/len(dataset)); the step's mechanism follows from the
sampler and the accumulation (integrations/_describe.py), and a loader whose
sampling privguard cannot account is refused by name.
"""

from __future__ import annotations

import math
from typing import Any

from privguard import _validation as check
from privguard._errors import InvalidArgumentError
from privguard.integrations import _describe, _sampling


def plan_from_opacus(optimizer: Any, data_loader: Any, *, epochs: int | None = None,
                     steps: int | None = None, gradient_accumulation_steps: int = 1,
                     every: int | None = None,
                     aligned_micro_batches: bool = False) -> dict[str, Any]:
    """See :meth:`privguard.Plan.from_opacus`: the plan's arguments (``Plan(**them)``).

    The integration hands back arguments, not a ``Plan``: ``_plan`` imports this module,
    so importing ``_plan`` here would be an import cycle (tests/test_import_graph.py).
    """
    sigma = getattr(optimizer, "noise_multiplier", None)
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)):
        raise InvalidArgumentError("optimizer", type(optimizer).__name__,
                                   "must be an Opacus DPOptimizer (it has no noise_multiplier)")
    sigma = check.positive_finite("optimizer.noise_multiplier", sigma)
    k = check.positive_int("gradient_accumulation_steps", gradient_accumulation_steps)
    aligned = check.flag("aligned_micro_batches", aligned_micro_batches)
    rate = _sampling.check_poisson(data_loader)
    if (epochs is None) == (steps is None):
        raise InvalidArgumentError("epochs", epochs, "give exactly one of epochs= and steps=")
    if steps is None:
        epochs = check.positive_int("epochs", epochs)
        # an epoch of a DPDataLoader is len(loader) Poisson draws; k of them per step
        # (a last partial accumulation is still a step: rounded up)
        steps = epochs * max(1, math.ceil(len(data_loader) / k))
    steps = check.positive_int("steps", steps)
    return {"step": _describe.step_mechanism(sigma, rate, k, aligned), "steps": steps, "every": every}
