"""Ghost-clipping backward passes since the last real step, counted at the optimizer (private).

Under ghost clipping (``grad_sample_mode="ghost"``) Opacus' optimizer reports
one micro-batch per step whatever the loop ran (``accumulated_iterations`` is
1), so several ``backward()`` before a ``step()`` were seen only by the loader
counter of ``integrations/_describe.py``, which misses an iterator made before
attach (docs/theory.md §14.5). Each backward of a loss from Opacus' wrapped
criterion (``DPTensorFastGradientClipping.backward``) runs its two passes
around one call of ``optimizer.zero_grad()`` on the optimizer it was wrapped
for: that call, recognised by its caller's code object (through up to four
wrappers set over privguard's; as
``integrations/_skips.py`` recognises ``BatchMemoryManager``'s signals), is
one Poisson micro-batch clipped into ``p.grad``.

:class:`BackwardCounter` counts those backward passes since the gradients were
last cleared: a ``zero_grad()`` of the loop's own (which clears ``p.grad``; the
clipped sum of skipped steps is counted by ``integrations/_skips.py``), a
charged step (its ``p.grad`` is the noisy gradient, a release) or a refused one
(privguard drops its gradients). It stands for ``accumulated_iterations``,
which counts the same thing under the hooks mode. Opacus 1.6's wrapped
backward clears ``p.grad`` itself, so the noise covers the last of them only:
counting every one over-counts there, and stays a floor for an Opacus whose
ghost backward accumulates.

It also refuses a real step whose clipped sum holds one batch twice (review
rgc): Opacus' ghost ``pre_step`` adds ``p.grad`` at every ``step()``, so a
``step()`` after a skipped one with no ``zero_grad`` between (none by a
wrapped backward either) adds the same batch again, one draw at weight 2,
which no count covers (docs/theory.md §14.5).
"""

from __future__ import annotations

import functools
import sys
from typing import Any


@functools.lru_cache(maxsize=1)
def _ghost_backward_code() -> Any:
    """The code object of Opacus' ``DPTensorFastGradientClipping.backward`` (None if absent)."""
    try:
        from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
    except ImportError:  # pragma: no cover - an Opacus without ghost clipping
        return None
    return getattr(DPTensorFastGradientClipping.backward, "__code__", None)


_WRAPPERS = 4  # frames above the caller searched: wrappers set over privguard's (rgc)


def _from_ghost_backward(frame: Any) -> bool:
    """Whether ``zero_grad`` was called by ``DPTensorFastGradientClipping.backward``, directly
    or through up to ``_WRAPPERS`` wrappers set on the optimizer over privguard's."""
    code = _ghost_backward_code()
    for _ in range(_WRAPPERS + 1):
        if frame is None or code is None:
            return False
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


class BackwardCounter:
    """Counts the wrapped ghost-clipping backward passes whose gradients ``p.grad`` may hold.

    Installed on the optimizer instance (``zero_grad``) by :meth:`install`;
    :meth:`restore` gives the optimizer back what it had.
    """

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.count = 0
        self._saved: Any = None
        self._zero_grad: Any = None
        # a zero_grad of the loop's own restarts the count only where it is the class's own
        # (it clears p.grad); an instance attribute set before attach may not: never restart
        self._clears = True
        # review rgc: Opacus' ghost pre_step adds p.grad to the clipped sum (accumulate) at
        # every step(), skipped or real, with no check that p.grad is new: a step() after a
        # skipped one with no zero_grad between (none by a wrapped backward either) adds the
        # same clipped batch twice, one draw at weight 2, which no count k covers
        self.added = False  # p.grad was added to the sum and not cleared since
        self.readded = False  # some step() since the last real one added it again

    def install(self) -> None:
        """Wrap the optimizer's ``zero_grad`` (an instance attribute)."""
        opt = self.optimizer
        self._saved = vars(opt).get("zero_grad")
        self._clears = self._saved is None
        self._zero_grad = opt.zero_grad
        opt.zero_grad = self._on_zero_grad

    def restore(self) -> None:
        """Give the optimizer back its own ``zero_grad`` (or the instance attribute it had)."""
        opt = self.optimizer
        if vars(opt).get("zero_grad") != self._on_zero_grad:
            return  # replaced since: leave it
        if self._saved is not None:
            opt.zero_grad = self._saved
        else:
            del opt.zero_grad

    def _on_zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        if _from_ghost_backward(sys._getframe(1)):
            self.count += 1  # between the two passes of one wrapped backward
            self.added = False  # p.grad cleared before the second pass writes the new batch
        elif self._clears:
            self.count = 0  # the loop's own: p.grad is cleared below
            self.added = False
        return self._zero_grad(*args, **kwargs)

    def pre_step(self) -> None:
        """A ``step()`` (skipped or real) has added ``p.grad`` to the clipped sum."""
        if self.added:
            self.readded = True
        self.added = True

    def check(self) -> None:
        """Refuse the real step whose clipped sum holds one batch twice (review rgc)."""
        if self.readded:
            from privguard._errors import InvalidArgumentError

            raise InvalidArgumentError(
                "optimizer", type(self.optimizer).__name__,
                "under ghost clipping, a step() after a skipped step() with neither "
                "backward() of the wrapped loss nor zero_grad() between adds the same clipped "
                "batch to the sum again (Opacus' accumulate): its records would be in one "
                "draw at weight 2, which no micro-batch count covers. The step is refused, "
                "nothing charged or applied; run backward() on a new batch (or zero_grad()) "
                "before every step()")

    def reported(self) -> int | None:
        """The backward passes counted (None for none: nothing to add to the other counts)."""
        return self.count or None

    def take(self) -> None:
        """The real step was charged or refused (its gradients released or dropped)."""
        self.count = 0
        self.added = self.readded = False
