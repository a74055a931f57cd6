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

And it refuses a real step whose sum holds a gradient that came through no
wrapped backward (task gz): a ``backward()`` of the user's own criterion (or
of ``loss_per_sample.mean()``) puts the unclipped batch gradient into
``p.grad``, which ``pre_step`` adds as if clipped. Every gradient accumulated
into a parameter is seen by a post-accumulate hook; of those since the last
wrapped backward's ``zero_grad`` only its second pass is clipped (the first
pass is cleared by that ``zero_grad``). The check reads only which backward
passes ran, never a value (docs/theory.md §14.5).
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


def _ghost_backward_frame(frame: Any) -> Any:
    """The frame of ``DPTensorFastGradientClipping.backward`` that called ``zero_grad``,
    directly or through up to ``_WRAPPERS`` wrappers set on the optimizer over privguard's
    (None if it was not called by one)."""
    code = _ghost_backward_code()
    for _ in range(_WRAPPERS + 1):
        if frame is None or code is None:
            return None
        if frame.f_code is code:
            return frame
        frame = frame.f_back
    return None


def _misreduced(tensor: Any) -> tuple[Any, Any] | None:
    """(the loss' reduction, its module's) where a wrapped loss averages over a module that
    does not (task adv6), else None. Opacus' first pass backpropagates the mean of the
    per-sample losses (each gradient / n) and a module of ``loss_reduction="mean"`` scales
    the backprops by n again; a module of ``"sum"`` does not, so its per-sample norms are
    n times too small and the clipping factors C/‖g‖ up to n times too large. The other
    mismatch (a sum into a module of ``"mean"``) reads norms n times too large: clipped
    harder, never above C."""
    loss = getattr(tensor, "loss_reduction", None)
    module = getattr(getattr(tensor, "module", None), "loss_reduction", None)
    return (loss, module) if loss == "mean" and module != "mean" else None


def _module_bound(frame: Any) -> float:
    """The clipping bound of the wrapped backward in ``frame``: its module's
    ``max_grad_norm`` (Opacus clips the per-sample gradients there, with that bound); inf
    where it cannot be read, so that the step is refused (fail closed)."""
    module = getattr(frame.f_locals.get("self"), "module", None)
    try:
        value = float(module.max_grad_norm)  # type: ignore[union-attr]
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return float("inf")
    return value if value == value else float("inf")  # NaN: inf


def check_torch(optimizer: Any) -> None:
    """Refuse ghost clipping where torch cannot tell which backward passes ran (< 2.1)."""
    import torch

    if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
        from privguard._errors import InvalidArgumentError

        raise InvalidArgumentError(
            "optimizer", type(optimizer).__name__,
            f"is a ghost-clipping optimizer, and torch {torch.__version__} has no "
            "Tensor.register_post_accumulate_grad_hook (torch >= 2.1), which privguard needs "
            "to refuse a step whose gradient did not come through the wrapped loss")


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
        # a wrapped backward whose loss was averaged over a module that sums (task adv6):
        # (the loss' reduction, the module's), the first seen since the last real step
        self.misreduced: tuple[Any, Any] | None = None
        # task gz: per parameter, whether the next gradient accumulated is a wrapped
        # backward's second pass (its clipped sum), and how many accumulated since p.grad
        # was last cleared came through no wrapped backward (unclipped)
        self._params: list[Any] = list(getattr(optimizer, "params", ()))
        self._awaiting = [False] * len(self._params)
        self._raw = [0] * len(self._params)
        self.unclipped = 0  # such backward passes added to the clipped sum since the last step
        self.unwatched = False  # the optimizer's parameters changed since attach (fail closed)
        self._handles: list[Any] = []
        # review rgz: the second pass is the backward pass through the wrapped loss's
        # per-sample losses after its zero_grad (a pre-hook on their grad_fn opens it, a
        # callback queued on that backward ends it); only accumulations inside it are clipped
        self._in_second_pass = False
        self._second_pass_hook: Any = None  # the pre-hook set at the wrapped zero_grad
        # review smp: the largest clipping bound a wrapped backward clipped at since the last
        # real step (the wrapped module's max_grad_norm, which the optimizer's noise σ·C does
        # not follow), None: none seen; the step is charged σ·C/C′ for C′ this bound
        # (docs/theory.md §14.7, Lemma 14.8)
        self.clip_bound: float | None = None

    def install(self) -> None:
        """Wrap the optimizer's ``zero_grad`` (an instance attribute)."""
        opt = self.optimizer
        self._saved = vars(opt).get("zero_grad")
        self._clears = self._saved is None
        self._zero_grad = opt.zero_grad
        opt.zero_grad = self._on_zero_grad
        for i, p in enumerate(self._params):  # torch >= 2.1 (checked at attach: check_torch)
            self._handles.append(p.register_post_accumulate_grad_hook(
                functools.partial(self._on_accumulate, i)))

    def restore(self) -> None:
        """Give the optimizer back its own ``zero_grad`` (or the instance attribute it had)."""
        opt = self.optimizer
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._disarm()
        if vars(opt).get("zero_grad") != self._on_zero_grad:
            return  # replaced since: leave it
        if self._saved is not None:
            opt.zero_grad = self._saved
        else:
            del opt.zero_grad

    def _on_accumulate(self, index: int, param: Any) -> None:
        """A backward pass accumulated a gradient into ``p.grad`` (task gz)."""
        if self._in_second_pass and self._awaiting[index]:
            self._awaiting[index] = False  # the wrapped backward's second pass: clipped
        else:
            self._raw[index] += 1  # a pass of no wrapped backward (or its first, cleared next)

    def _arm_second_pass(self, frame: Any) -> None:
        """At the wrapped backward's ``zero_grad``: its second pass, the next backward through
        its per-sample losses, is the one whose accumulations are clipped (review rgz)."""
        self._disarm()
        loss = getattr(frame.f_locals.get("self"), "loss_per_sample", None)
        node = getattr(loss, "grad_fn", None)
        if node is not None:  # else the second pass reaches no parameter
            self._second_pass_hook = node.register_prehook(self._on_second_pass)

    def _on_second_pass(self, grad_outputs: Any) -> None:
        """The second pass reached the per-sample losses: every accumulation until it ends
        (a callback on this backward, the outermost one under reentrant checkpointing) is
        clipped, one per parameter; a parameter it does not reach keeps none (review rgz:
        gz's head kept it awaiting, and the next backward's gradient on it, a plain loss on
        a head the wrapped loss did not reach, passed for a clipped one)."""
        import torch

        self._disarm()
        self._in_second_pass = True
        self._awaiting = [True] * len(self._params)
        torch.autograd.Variable._execution_engine.queue_callback(self._end_second_pass)

    def _end_second_pass(self) -> None:
        """The wrapped backward's second pass has ended (review rgz)."""
        self._in_second_pass = False
        self._awaiting = [False] * len(self._params)

    def _disarm(self) -> None:
        if self._second_pass_hook is not None:
            self._second_pass_hook.remove()
            self._second_pass_hook = None

    def _on_zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        frame = _ghost_backward_frame(sys._getframe(1))
        wrapped = frame is not None
        if wrapped:
            self.count += 1  # between the two passes of one wrapped backward
            bound = _module_bound(frame)
            self.clip_bound = bound if self.clip_bound is None else max(self.clip_bound, bound)
            self.added = False  # p.grad cleared before the second pass writes the new batch
            if self.misreduced is None:
                self.misreduced = _misreduced(frame.f_locals.get("self"))
        elif self._clears:
            self.count = 0  # the loop's own: p.grad is cleared below
            self.added = False
        result = self._zero_grad(*args, **kwargs)
        self._end_second_pass()  # a backward that raised never ran its callback
        for i, p in enumerate(self._params):
            if self._clears or p.grad is None:  # p.grad cleared: what it held is gone
                self._raw[i] = 0
        if frame is not None:
            self._arm_second_pass(frame)  # the second pass comes next
        else:
            self._disarm()
        return result

    def pre_step(self) -> None:
        """A ``step()`` (skipped or real) has added ``p.grad`` to the clipped sum."""
        self._disarm()  # a wrapped backward whose second pass never ran (it raised)
        if self.added:
            self.readded = True
        self.added = True
        params = getattr(self.optimizer, "params", ())
        if len(params) != len(self._params) or any(
                a is not b for a, b in zip(params, self._params)):
            self.unwatched = True  # e.g. add_param_group, a layer unfrozen: no hook on it
        self.unclipped += max(
            (n for n, p in zip(self._raw, self._params) if p.grad is not None), default=0)

    def check(self, step: int) -> None:
        """Refuse the real step (the ``step``-th of the handle) whose clipped sum holds a
        gradient of no wrapped backward (task gz), one batch twice (review rgc), or one
        clipped at norms read n times too small (a mean loss into a summing module, adv6)."""
        from privguard._errors import PipelineMismatchError

        if self.unwatched:
            raise PipelineMismatchError(
                f"under ghost clipping, the optimizer's parameters changed since attach "
                f"({len(self._params)} then): privguard cannot tell whether the gradients "
                f"of the others came through the wrapped loss. Step {step} is refused, "
                f"nothing charged or applied; detach and attach again after changing them",
                witness="ghost_clipping", charged=float(len(self._params)),
                measured=float(len(getattr(self.optimizer, "params", ()))), interval=None,
                step=step)
        if self.unclipped:
            raise PipelineMismatchError(
                f"under ghost clipping, step {step}'s gradient holds {self.unclipped} "
                f"backward pass(es) of a loss that is not from the criterion make_private "
                f"returned (a plain criterion, F.cross_entropy, loss.loss_per_sample.mean() "
                f"...): such a gradient is not clipped, while the step would be charged "
                f"for the {self.count} clipped backward pass(es) of the wrapped loss. "
                f"The step is refused, nothing charged or applied, its gradients dropped; "
                f"backpropagate the loss of the criterion make_private returned "
                f"(criterion(output, target).backward())"
                + ("" if self._clears else
                   "; or, the optimizer's zero_grad was replaced before attach (an instance "
                   "attribute), and privguard cannot tell that it clears p.grad when Opacus' "
                   "wrapped backward calls it between its two passes, so the first, "
                   "unclipped pass is counted at every step: replace zero_grad after attach "
                   "instead (privguard's is then the one it calls)"),
                witness="ghost_clipping", charged=float(self.count),
                measured=float(self.unclipped), interval=None, step=step)
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

        if self.misreduced is not None:
            from privguard._errors import InvalidArgumentError

            loss, module = self.misreduced
            raise InvalidArgumentError(
                "loss_reduction", loss,
                f"of a DPTensorFastGradientClipping backpropagated into a module whose "
                f"loss_reduction is {module!r}: Opacus' first pass takes the mean of the "
                f"per-sample losses while the module reads their gradients as a sum's, so "
                f"each per-sample norm is read n times too small (n the batch size) and a "
                f"record's clipped gradient reaches n·C under noise σ·C (docs/theory.md "
                f"§14.9). Step {step} is refused, nothing charged or applied; build the "
                f"loss with the module's loss_reduction (or use the criterion make_private "
                f"returned)")

    def reported(self) -> int | None:
        """The backward passes counted (None for none: nothing to add to the other counts)."""
        return self.count or None

    def take(self) -> None:
        """The real step was charged or refused (its gradients released or dropped)."""
        self.count = 0
        self.clip_bound = None
        self.added = self.readded = False
        self.misreduced = None
        self.unclipped = 0
        self._awaiting = [False] * len(self._params)
        self._raw = [0] * len(self._params)
        self._in_second_pass = False
        self._disarm()
