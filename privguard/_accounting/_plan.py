"""The plan a run declares before its first output: step, horizon and read cadence.

A plan is a promise about intent, not a constraint: the ledger stays sound
whatever is actually charged. It only shapes choices that must be fixed
before any output exists: how the (ε, δ) filter splits δ over orders, which
orders the odometer's mixture weights favour, and the envelope of the hybrid
filter. A run that follows its plan gets the tightest numbers; one that
leaves it pays a bounded price (docs/theory.md §2–3).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from privguard import _validation as check
from privguard._errors import InvalidArgumentError
from privguard._mechanisms._base import Mechanism, mechanism_from_dict


@dataclasses.dataclass(frozen=True)
class Plan:
    """The planned per-step mechanism, number of steps, and how often ε is read.

    Args:
        step: the mechanism each step will charge (e.g. one DP-SGD step).
        steps: the planned number of steps, or None if the horizon is unknown.
        every: read ε every this many steps. Default: once per epoch
            (⌈1/q⌉ steps) for a :class:`~privguard.mechanisms.SubsampledGaussian`
            step with rate q, otherwise every step.

    The ledger's guarantees hold whenever ε is read and whatever is charged;
    ``steps`` and ``every`` only decide where the odometer's weights go.

    Example:
        >>> from privguard import Plan, mechanisms as M
        >>> plan = Plan(M.SubsampledGaussian(1.0, 512 / 50_000), steps=98 * 20)
        >>> plan.read_every, plan.steps
        (98, 1960)
    """

    step: Mechanism
    steps: int | None = None
    every: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.step, Mechanism):
            raise InvalidArgumentError("plan.step", self.step, "must be a privguard mechanism")
        # At most 2⁵³ (check.MAX_STEPS, as a mechanism's steps and charge's times): the
        # mixture odometer's smallest δ share, 0.9/(reads of the plan) (check.MIN_DELTA),
        # must keep log(share·δ) finite; 10³⁰⁰ steps made it log(0): ValueError (review bx).
        if self.steps is not None:
            object.__setattr__(self, "steps", check.positive_int(
                "plan.steps", self.steps, maximum=check.MAX_STEPS))
        if self.every is not None:
            object.__setattr__(self, "every", check.positive_int(
                "plan.every", self.every, maximum=check.MAX_STEPS))

    @property
    def read_every(self) -> int:
        """The read cadence in steps (``every``, or its default)."""
        if self.every is not None:
            return self.every
        rate = getattr(self.step, "sample_rate", None)
        if type(self.step).__name__ == "SubsampledGaussian" and rate:
            # at most MAX_STEPS: 1/q overflows to inf for a subnormal q (review bi: q = 5e-324
            # made every charge raise OverflowError from math.ceil)
            return max(1, math.ceil(min(1.0 / rate - 1e-9, float(check.MAX_STEPS))))
        return 1

    @classmethod
    def from_opacus(cls, optimizer: Any, data_loader: Any, *, epochs: int | None = None,
                    steps: int | None = None, gradient_accumulation_steps: int = 1,
                    every: int | None = None, aligned_micro_batches: bool = False) -> Plan:
        """The plan of the run Opacus will execute with ``optimizer`` and ``data_loader``.

        σ is ``optimizer.noise_multiplier`` and q the rate ``data_loader``'s
        Poisson sampler uses (``DPDataLoader``: 1/len(loader), as Opacus
        samples and calibrates; not batch/len(dataset)). The step is
        :class:`~privguard.mechanisms.SubsampledGaussian`, or with
        ``gradient_accumulation_steps`` k > 1 (k Poisson micro-batches per
        optimizer step)
        :class:`~privguard.mechanisms.AccumulatedSubsampledGaussian`.

        Args:
            optimizer: the Opacus ``DPOptimizer``.
            data_loader: its Poisson data loader (``DPDataLoader``).
            epochs: passes over the loader (⌈len(loader)/k⌉ steps each), or
            steps: the number of optimizer steps (exactly one of the two).
            gradient_accumulation_steps: micro-batches per optimizer step.
            every: read cadence (see :class:`Plan`).
            aligned_micro_batches: with k > 1, the step is
                ``AccumulatedSubsampledGaussian(..., aligned=True)``
                (docs/theory.md §14), the plan of a run attached with
                ``aligned_micro_batches=True``: the only accumulated plan
                ``filter="hybrid"`` takes (§2b.1). Default False (§14.2).

        Raises:
            NonPoissonSamplingError: the loader does not sample by Poisson
                sampling, so no step mechanism can be named.
            InvalidArgumentError: a bad argument, named.

        Example:
            >>> import torch
            >>> from opacus.data_loader import DPDataLoader
            >>> from opacus.optimizers import DPOptimizer
            >>> from torch.utils.data import DataLoader, TensorDataset
            >>> w = torch.nn.Parameter(torch.zeros(2))
            >>> opt = DPOptimizer(torch.optim.SGD([w], lr=0.1), noise_multiplier=1.0,
            ...                   max_grad_norm=1.0, expected_batch_size=8)
            >>> data = TensorDataset(torch.zeros(64, 2))
            >>> loader = DPDataLoader.from_data_loader(DataLoader(data, batch_size=8))
            >>> plan = Plan.from_opacus(opt, loader, epochs=3)
            >>> plan.step, plan.steps
            (SubsampledGaussian(noise_multiplier=1.0, sample_rate=0.125, steps=1), 24)
        """
        from privguard.integrations._plan_opacus import plan_from_opacus

        return cls(**plan_from_opacus(optimizer, data_loader, epochs=epochs, steps=steps,
                                      gradient_accumulation_steps=gradient_accumulation_steps,
                                      every=every,
                                      aligned_micro_batches=aligned_micro_batches))

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step.to_dict(), "steps": self.steps, "every": self.every}

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        if not isinstance(data, dict) or set(data) != {"step", "steps", "every"}:
            raise InvalidArgumentError("data", data, "must be a dict with keys step, steps, every")
        return cls(mechanism_from_dict(data["step"]), data["steps"], data["every"])


def as_plan(plan: Any) -> Plan | None:
    """``None``, a :class:`Plan`, or a bare mechanism (= this step, horizon unknown)."""
    if plan is None or isinstance(plan, Plan):
        return plan
    if isinstance(plan, Mechanism):
        return Plan(plan)
    raise InvalidArgumentError("plan", plan, "must be a privguard.Plan or a mechanism")
