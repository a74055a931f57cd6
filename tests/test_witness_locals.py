"""Every refusal of the witnesses' entry points drops the frames that hold data (review sb).

``_without_locals`` (review rt) re-raised only :class:`PipelineMismatchError` without its
traceback; the noise witness's other refusal, the :class:`InvalidArgumentError` of a gradient
float64 cannot hold exactly, left check → _check_noise → _measure on the traceback, whose
locals hold the step's clipped sums (no noise) and gradients, on a step charged nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from privguard import InvalidArgumentError
from privguard.integrations._witnesses import Witnesses


def _tensors_in_frames(exc):
    tb, found = exc.__traceback__, []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == __file__:  # this test's own frame
            tb = tb.tb_next
            continue
        for key, value in tb.tb_frame.f_locals.items():
            items = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, torch.Tensor) for v in items):
                found.append((tb.tb_frame.f_code.co_name, key))
        tb = tb.tb_next
    return found


def test_an_invalid_gradient_refusal_carries_no_data_in_its_traceback():
    summed = [torch.full((3,), 7.0, dtype=torch.complex64)]
    params = [SimpleNamespace(grad=s + 1.0, summed_grad=s, dtype=s.dtype) for s in summed]
    opt = SimpleNamespace(params=params, max_grad_norm=1.0, loss_reduction="sum",
                          expected_batch_size=1, accumulated_iterations=1)
    w = Witnesses(opt, None, false_alarm=1e-10)
    try:
        w.check(SimpleNamespace(noise_multiplier=1.0))
    except InvalidArgumentError as exc:
        assert _tensors_in_frames(exc) == []
        assert exc.__context__ is None and exc.__cause__ is None
    else:  # pragma: no cover - the refusal is the point
        raise AssertionError("a complex gradient was not refused")


def test_a_torch_error_in_the_check_carries_no_data_in_its_traceback():
    """Review sc: ``_without_locals`` dropped the traceback of privguard refusals only; a
    torch error inside the check stage (a RuntimeError: an allocation that fails, a shape
    that does not match) left check → _check_noise → _measure on its traceback, whose locals
    hold the step's clipped sums (no noise) and gradients, on a step charged nothing."""
    params = [SimpleNamespace(grad=torch.ones(3), summed_grad=torch.full((4,), 7.0),
                              dtype=torch.float32)]
    opt = SimpleNamespace(params=params, max_grad_norm=1.0, loss_reduction="sum",
                          expected_batch_size=1, accumulated_iterations=1)
    w = Witnesses(opt, None, false_alarm=1e-10)
    try:
        w.check(SimpleNamespace(noise_multiplier=1.0))
    except RuntimeError as exc:  # torch's own error, its type and message kept
        assert _tensors_in_frames(exc) == []
        assert exc.__context__ is None and exc.__cause__ is None
    else:  # pragma: no cover - the mismatch is the point
        raise AssertionError("the size mismatch did not raise")


def test_the_exceptions_chained_to_a_refusal_lose_their_frames_too():
    """Review sc: an error raised while handling another inside the check stage kept the
    first one, with its traceback and the frames' locals, as ``__context__``."""
    from privguard.integrations._witnesses import _without_locals

    class _Stage:
        @_without_locals
        def run(self):
            clipped = torch.full((3,), 7.0)  # noqa: F841 - what must not travel on
            try:
                raise RuntimeError("first")
            except RuntimeError:
                raise ValueError("second")  # the implicit chain is the point

    try:
        _Stage().run()
    except ValueError as exc:
        assert _tensors_in_frames(exc) == [] and exc.__context__ is not None
        assert _tensors_in_frames(exc.__context__) == []
    else:  # pragma: no cover
        raise AssertionError("not raised")
