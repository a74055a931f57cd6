"""The noise ``DistributedPerLayerOptimizer`` draws in its backward hooks (private).

Opacus' other optimizers add the noise σ·C in ``pre_step``, right before the
step hook that charges the step, so the σ and C the charge reads are the ones
the noise used. ``DistributedPerLayerOptimizer`` adds each layer's noise in
that layer's backward hook (``_add_noise_parameter``, on rank 0), with the
``noise_multiplier`` and ``max_grad_norm`` in force then: a σ or C raised
between ``backward()`` and ``step()`` (a noise schedule stepped before the
optimizer) was charged at the raised value, above the noise drawn (review
lo2: an under-count). :class:`LayerNoise` records, on the instance, the
(σ, C) of the smallest noise σ·C drawn since the last real step; the step is
charged at that pair (docs/theory.md §14.7, Lemma 14.8: the charge's σ·C/C′
with the noise's own σ·C). Ranks other than 0 draw none and read σ and C
live; under DDP the ranks must then agree on σ (``Coordinator.step``), so a
pair changed between the noise and the step refuses the step on every rank.
"""

from __future__ import annotations

from typing import Any

from privguard.integrations import _skips


def refuse_insecure(optimizer: Any) -> None:
    """Refuse ``secure_mode=True`` with an optimizer whose backward hooks draw the noise.

    Task adv6: Opacus' ``DistributedPerLayerOptimizer._add_noise_parameter`` calls
    ``_generate_noise(..., generator=None, secure_mode=...)``: under ``secure_mode`` the
    noise comes from torch's default generator (a Mersenne twister anyone who knows the
    seed can replay), not the cryptographically secure one ``make_private`` built. σ and
    the accounting are unchanged, but the guarantee the user asked for is not there, and
    a replayable noise is no noise to an attacker who holds the seed: refused (fail
    closed), nothing charged."""
    if LayerNoise.applies(optimizer) and getattr(optimizer, "secure_mode", False):
        from privguard._errors import InvalidArgumentError

        raise InvalidArgumentError(
            "optimizer", type(optimizer).__name__,
            "has secure_mode=True, but Opacus' DistributedPerLayerOptimizer draws each "
            "layer's noise in its backward hook with generator=None (torch's default, "
            "replayable generator), not the secure generator secure_mode set up: its noise "
            "is not what secure_mode promises. Nothing charged; use "
            "clipping='flat' (or secure_mode=False, knowingly)")


class LayerNoise:
    """Records the (σ, C) of the noise the backward hooks drew since the last real step."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.drawn: tuple[float, float] | None = None  # (σ, C) of the smallest σ·C drawn
        self._saved: Any = None
        self._mine: Any = None

    @staticmethod
    def applies(optimizer: Any) -> bool:
        """Whether ``optimizer`` adds its noise in backward hooks (per layer, under DDP)."""
        return callable(getattr(type(optimizer), "_ddp_per_layer_hook", None)) and \
            callable(getattr(optimizer, "_add_noise_parameter", None))

    @staticmethod
    def pending(optimizer: Any) -> bool:
        """Whether a backward hook drew noise since the last real step (or ``zero_grad``):
        a parameter whose noisy gradient is there with ``accumulated_iterations`` > 0, which
        Opacus counts up when it draws and sets to 0 in ``pre_step``. Review rlo2: attach
        (or attach again after ``detach``) between ``backward()`` and ``step()`` recorded
        no draw, and the step was charged at the σ in force at ``step()``, not the noise's."""
        for p in getattr(optimizer, "params", ()):
            try:
                drawn = int(getattr(p, "accumulated_iterations", 0) or 0) > 0
            except (TypeError, ValueError):
                drawn = True  # not Opacus' count: taken as drawn (fail closed)
            if drawn and getattr(p, "grad", None) is not None:
                return True
        return False

    def install(self) -> None:
        """Wrap the optimizer's ``_add_noise_parameter`` (an instance attribute)."""
        opt = self.optimizer
        self._saved = vars(opt).get("_add_noise_parameter")
        original = opt._add_noise_parameter

        def add_noise_parameter(p: Any) -> Any:
            # read at the same instant as Opacus' own std = noise_multiplier·max_grad_norm
            pair = (float(opt.noise_multiplier), _skips.noise_bound(opt))
            if self.drawn is None or pair[0] * pair[1] < self.drawn[0] * self.drawn[1]:
                self.drawn = pair
            return original(p)

        self._mine = add_noise_parameter
        opt._add_noise_parameter = add_noise_parameter

    def restore(self) -> None:
        """Give the optimizer back its own method (unless it was replaced since)."""
        opt = self.optimizer
        if vars(opt).get("_add_noise_parameter") is not self._mine:
            return
        if self._saved is not None:
            opt._add_noise_parameter = self._saved
        else:
            del opt._add_noise_parameter

    def take(self) -> None:
        """The real step was charged or dropped: the next step's noise is recorded anew."""
        self.drawn = None
