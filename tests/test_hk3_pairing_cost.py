"""Task hk3 (issue 26): the pairing check's per-step work, with the same decisions.

* ``_describe.first_grad_sample`` is the one walk to the first ``grad_sample`` that
  ``held_sets`` (the trainers' ``BatchSets``) and ``_forward_pairing.held_rows`` (the
  pairing check) both read; they agree on every state Opacus leaves.
* ``PairingCheck.see`` reads the optimizer's parameters (a list Opacus builds at each
  read) once per clip for the rows and the marks (main: twice), and not at all before the
  loader counted a batch (main: once, then dropped the answer).
* Opacus' wrapped accumulation marks a parameter with no call of its own beyond
  ``hasattr`` and the original (main: ``setattr`` too), by keyword or by position.

The decisions themselves are pinned by tests/test_adv6*.py and tests/test_radv6*.py.
"""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from opacus.grad_sample import grad_sample_module as gsm  # noqa: E402

from privguard.integrations import _describe, _forward_pairing  # noqa: E402


class _Param:
    def __init__(self, grad_sample):
        self.grad_sample = grad_sample


class _Optimizer:
    """An optimizer stub whose ``params`` (a property, as Opacus') counts its reads."""

    def __init__(self, params):
        self._params, self.reads = params, 0

    @property
    def params(self):
        self.reads += 1
        return list(self._params)


class _Counter:
    def __init__(self):
        self.sizes: list[int] = []


def _states():
    t8, t5 = torch.zeros(8, 3), torch.zeros(5, 3)
    return [
        [],
        [_Param(None)],
        [_Param(None), _Param(t8)],
        [_Param(t8), _Param(t5)],
        [_Param(None), _Param([t8, t5]), _Param(t5)],
        [_Param([t5])],
        [_Param([])],
    ]


@pytest.mark.parametrize("params", _states())
def test_held_sets_and_held_rows_read_the_same_first_entry(params):
    opt = _Optimizer(params)
    sets = _describe.held_sets(opt)
    rows = _forward_pairing.held_rows(opt.params)
    first = _describe.first_grad_sample(opt.params)
    if first is None:
        assert sets == [] and rows is None
    else:
        assert all(a is b for a, b in zip(sets, first if isinstance(first, list) else [first]))
        assert rows == (len(sets), sum(int(t.shape[0]) for t in sets))


def _check(opt, counter):
    check = _forward_pairing.PairingCheck(opt, lambda: counter)
    check._sizes, check._seen = counter.sizes, 0
    return check


def test_see_reads_no_parameter_before_a_batch_is_counted():
    counter = _Counter()
    opt = _Optimizer([_Param(torch.zeros(8, 3))])
    check = _check(opt, counter)
    check.see()  # an iterator made before attach: nothing counted, nothing compared
    assert opt.reads == 0 and check.failure is None


@pytest.mark.parametrize("rows", [8, 4])
def test_see_reads_the_parameters_once_per_clip(rows):
    assert _forward_pairing.watch_opacus()
    counter = _Counter()
    marked = _Param(torch.zeros(rows, 3))
    setattr(marked, _forward_pairing._MARK, True)  # two forwards through one backward
    opt = _Optimizer([_Param(None), marked])
    check = _check(opt, counter)
    counter.sizes.append(8)  # one batch of 8 records delivered
    check.see()
    assert opt.reads == 1
    assert not getattr(marked, _forward_pairing._MARK)  # the mark is cleared at the clip
    assert (check.failure is None) == (rows >= 8)  # 4 rows for 8 records: marked, refused


def _calls_in(wrapper, call):
    """The C functions ``wrapper``'s own frame calls while ``call()`` runs."""
    own, calls = wrapper.__code__, []

    def profile(frame, event, arg):
        if event == "c_call" and frame.f_code is own:
            calls.append(getattr(arg, "__name__", repr(arg)))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return calls


def test_opacus_accumulation_is_wrapped_with_its_own_signature():
    assert _forward_pairing.watch_opacus()
    wrapper = gsm.create_or_accumulate_grad_sample
    assert wrapper.__code__.co_kwonlyargcount == 3 and not wrapper.__code__.co_argcount
    param = torch.nn.Parameter(torch.zeros(3))
    gs = torch.ones(4, 3)
    calls = []
    for _ in range(2):  # the second accumulation of one backward marks the parameter
        calls += _calls_in(wrapper, lambda: wrapper(param=param, grad_sample=gs,
                                                    max_batch_len=4))
    assert getattr(param, _forward_pairing._MARK, False) is True
    assert torch.equal(param._current_grad_sample, 2 * gs)  # Opacus' own sum, unchanged
    assert set(calls) <= {"hasattr"}, calls  # main: setattr too
    with pytest.raises(TypeError):  # refused as Opacus' function refuses it
        wrapper(param, grad_sample=gs, max_batch_len=4)


@pytest.mark.parametrize("by_keyword", [True, False])
def test_another_signature_gets_the_general_wrapper(monkeypatch, by_keyword):
    seen = []

    def stand_in(param, grad_sample, max_batch_len=0):  # a future Opacus' signature
        seen.append(param)
        param._current_grad_sample = grad_sample

    monkeypatch.setattr(gsm, "create_or_accumulate_grad_sample", stand_in)
    assert _forward_pairing.watch_opacus() and _forward_pairing.watched()
    wrapper = gsm.create_or_accumulate_grad_sample
    assert wrapper is not stand_in and wrapper.__code__.co_kwonlyargcount == 0
    param = torch.nn.Parameter(torch.zeros(3))
    calls = []
    for _ in range(2):
        if by_keyword:
            calls += _calls_in(wrapper, lambda: wrapper(param=param, grad_sample=1))
        else:
            calls += _calls_in(wrapper, lambda: wrapper(param, 1, 4))
    assert seen == [param, param]
    assert getattr(param, _forward_pairing._MARK, False) is True
    assert set(calls) <= {"hasattr"}, calls
