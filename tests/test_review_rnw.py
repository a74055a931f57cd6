"""Review rnw: bad input an Opacus user hits (found by the newcomer's pass, branch nw).

* ``attach(..., data_loader="x")`` was refused as "does not do Poisson sampling" and, with
  ``check_poisson=False``, accepted, its ``len()`` setting the charged rate;
* the ``AccountantWarning`` of ``attach(..., privacy_engine=engine)`` before training named
  both numbers as "(0 now)";
* ``LedgerCallback(sample_rate="x")`` / ``LedgerTrainerCallback(sample_rate=2.0)`` were
  accepted at construction and refused only when fit/train began;
* a ``python -c "…"`` of the README wrapped across lines was a SyntaxError when pasted.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

pytest.importorskip("opacus")

import torch
from opacus.data_loader import DPDataLoader
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from test_opacus_integration import DELTA, make_private, train
from torch.utils.data import DataLoader, TensorDataset

from privguard import InvalidArgumentError, Ledger
from privguard import mechanisms as M
from privguard._accounting._results import upper
from privguard.integrations._sampling import NonPoissonSamplingError
from privguard.integrations.opacus import AccountantWarning, attach

warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

# ---------------------------------------------------------------- 7: a data_loader that is none
@pytest.mark.parametrize("check_poisson", [True, False])
@pytest.mark.parametrize("value, shown", [("x", "'x'"), ([1, 2, 3], "[1, 2, 3]"), (5, "5"),
                                          (0.5, "0.5"), ((1, 2), "(1, 2)"),
                                          (object(), "'<object object")])
def test_a_data_loader_that_is_not_a_loader_is_refused_naming_it(value, shown, check_poisson):
    _, model, opt, loader = make_private()
    ledger = Ledger(8.0, DELTA)
    with pytest.raises(InvalidArgumentError) as info:
        attach(opt, ledger, data_loader=value, check_poisson=check_poisson)
    # not "does not do Poisson sampling": it is no loader at all
    assert not isinstance(info.value, NonPoissonSamplingError)
    assert info.value.argument == "data_loader"
    assert str(info.value).startswith(f"data_loader={shown}")
    assert "is not a data loader" in str(info.value)
    # nothing attached, nothing charged: the optimizer trains uncharged and can be attached
    train(model, opt, loader, 2)
    assert len(ledger.history) == 0
    handle = attach(opt, ledger, data_loader=loader)
    train(model, opt, loader, 2)
    assert handle.steps_charged >= 2
    handle.detach()


@pytest.mark.parametrize("check_poisson", [True, False])
def test_a_dataset_passed_as_the_data_loader_is_refused(check_poisson):
    # a Subset has a `dataset`; opted out it was charged at 1/len(subset), one record's share
    _, _, opt, loader = make_private()
    data = loader.dataset
    for wrong in (data, torch.utils.data.Subset(data, range(100))):
        ledger = Ledger(8.0, DELTA)
        with pytest.raises(InvalidArgumentError, match=r"a torch Dataset, not the loader") as info:
            attach(opt, ledger, data_loader=wrong, check_poisson=check_poisson)
        assert not isinstance(info.value, NonPoissonSamplingError)
        assert info.value.argument == "data_loader" and len(ledger.history) == 0


def test_the_loaders_a_user_passes_are_still_accepted():
    x = torch.randn(64, 10)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    poisson = DPDataLoader.from_data_loader(DataLoader(data, batch_size=8))
    sampled = DataLoader(data, batch_sampler=UniformWithReplacementSampler(
        num_samples=64, sample_rate=0.125))
    for loader, check_poisson in ((poisson, True), (sampled, True),
                                  (DataLoader(data, batch_size=8), False)):
        _, _, opt, _ = make_private()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            handle = attach(opt, Ledger(8.0, DELTA), data_loader=loader,
                            check_poisson=check_poisson)
        assert handle.next_mechanism().sample_rate == pytest.approx(0.125)
        handle.detach()


class _Batches:
    """An iterable of batches with a length: Lightning trains on any iterable."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)

    def __len__(self):
        return len(self.loader)


@pytest.mark.parametrize("sample_rate", [None, 0.25])
def test_lightning_still_trains_opted_out_on_an_iterable_that_is_no_data_loader(sample_rate):
    # the callback passes its single training loader to attach, which now refuses one with no
    # batch_sampler, sampler or dataset: opted out, it is charged as before (1/len, or the
    # given rate), not refused
    pl = pytest.importorskip("lightning.pytorch")
    from _tiny_lightning import BATCH, TinyDP

    from privguard.integrations.lightning import LedgerCallback

    class Custom(TinyDP):
        def train_dataloader(self):
            return _Batches(DPDataLoader.from_data_loader(DataLoader(self.data, batch_size=BATCH)))

    ledger = Ledger(delta=DELTA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(callbacks=[LedgerCallback(ledger, check_poisson=False, sample_rate=sample_rate)],
                   accelerator="cpu", logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False,
                   max_steps=3).fit(Custom())
    assert [r.mechanism.sample_rate for r in ledger.history] == [sample_rate or 1 / 8] * 3


# ---------------------------------------------------------------- 8: the warning before training
def _engine_warning(engine, opt, loader, ledger):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    about = [str(w.message) for w in caught if issubclass(w.category, AccountantWarning)
             and "engine.get_epsilon" in str(w.message)]
    assert len(about) == 1
    return handle, about[0]


def test_the_engine_warning_before_training_says_nothing_ran_yet():
    engine, _, opt, loader = make_private(accountant="prv")
    _, text = _engine_warning(engine, opt, loader, Ledger(8.0, DELTA))
    assert "(0 now)" not in text, text
    assert "nothing has run yet" in text
    assert "engine.accountant.wrapped.get_epsilon(1e-05)" in text  # where Opacus' number is
    # its purpose stays: engine.get_epsilon changes meaning, and what to log instead
    assert "now reports the ledger's any-time ε" in text and "PRV" in text
    assert "ledger.budget()" in text and "guarantee()" in text


def test_the_engine_warning_names_both_numbers_once_either_is_not_zero(tmp_path):
    # a file ledger that spent before (Opacus' accountant is new): the ledger's number is news
    path = tmp_path / "budget.db"
    with Ledger(8.0, DELTA, path=path) as spent:
        spent.charge(M.Gaussian(5.0))
    engine, _, opt, loader = make_private(accountant="prv")
    ledger = Ledger(8.0, DELTA, path=path)
    handle, text = _engine_warning(engine, opt, loader, ledger)
    assert "nothing has run yet" not in text
    assert "(0 now)" in text and f"({upper(ledger.epsilon(DELTA), '.4g')} now)" in text
    handle.detach()
    ledger.close()


# ---------------------------------------------------------------- 9: callbacks' sample_rate
def _callbacks():
    out = []
    try:
        from privguard.integrations.lightning import LedgerCallback
        out.append(LedgerCallback)
    except ImportError:
        pass
    try:
        from privguard.integrations.huggingface import LedgerTrainerCallback
        out.append(LedgerTrainerCallback)
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("rate", ["x", 2.0, 0, -0.1, float("nan"), [0.1]])
def test_a_callback_refuses_a_bad_sample_rate_at_construction_as_attach_does(rate):
    callbacks = _callbacks()
    if not callbacks:
        pytest.skip("neither lightning nor transformers is installed")
    _, _, opt, _ = make_private()
    with pytest.raises(InvalidArgumentError) as by_attach:
        attach(opt, Ledger(8.0, DELTA), sample_rate=rate, check_poisson=False)
    for callback in callbacks:
        with pytest.raises(InvalidArgumentError) as info:
            callback(Ledger(8.0, DELTA), sample_rate=rate)
        assert info.value.argument == "sample_rate"
        assert str(info.value) == str(by_attach.value), callback


@pytest.mark.parametrize("rate", [None, 0.25, 1, lambda: 0.25])
def test_a_callback_takes_a_good_sample_rate(rate):
    for callback in _callbacks():
        assert callback(Ledger(8.0, DELTA), sample_rate=rate).sample_rate is rate


# ---------------------------------------------------------------- 10: README's python -c
@pytest.mark.parametrize("page", ["README.md", "docs/theory.md", "docs/performance.md",
                                  "docs/reference.md"])  # the README's details, moved (task rd)
def test_every_python_c_of_the_docs_pastes_from_the_markdown(page):
    # the command of README "What the numbers mean" was wrapped across lines: pasted from
    # the markdown, `from opacus.accountants import\n  RDPAccountant` is a SyntaxError (and
    # so were one more in the README, four in docs/theory.md, one in docs/performance.md)
    text = (Path(__file__).resolve().parents[1] / page).read_text(encoding="utf-8")
    found = re.findall(r'python -c\s+"((?:[^"\\]|\\.)*)"`', text)
    assert len(found) >= (1 if page == "docs/reference.md" else 2)
    for code in found:
        compile(code, f"{page} python -c", "exec")
