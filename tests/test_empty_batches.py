"""Empty batches of random allocation (task hl): a plain ``DataLoader(ds,
batch_sampler=RandomAllocationSampler(...))`` with PyTorch's default collate raised
IndexError at an empty batch (probability (1 − 1/t)^n a batch); ``EmptyBatchCollate``
collates it with zero rows, and the step runs, adds its noise and is charged."""

from __future__ import annotations

import pickle
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError  # noqa: E402
from privguard.integrations import EmptyBatchCollate, RandomAllocationSampler  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off")]
# 2 examples in 4 steps: at least 2 batches of every epoch are empty
N, T = 2, 4


def _data():
    return TensorDataset(torch.randn(N, 3), torch.arange(N))


def _sampler(seed=0):
    return RandomAllocationSampler(N, T, generator=torch.Generator().manual_seed(seed))


def test_the_default_collate_fails_on_an_empty_batch():
    # What a user of a plain DataLoader met (the reason for the helper)
    with pytest.raises(IndexError):
        list(DataLoader(_data(), batch_sampler=_sampler()))


def test_every_batch_of_an_epoch_is_collated_and_an_empty_one_has_zero_rows():
    data = _data()
    loader = DataLoader(data, batch_sampler=_sampler(), collate_fn=EmptyBatchCollate(data))
    batches = list(loader)
    assert len(batches) == T and sum(len(x) == 0 for x, _ in batches) >= T - N
    for x, y in batches:
        assert x.shape[1:] == (3,) and x.dtype == torch.float32 and y.dtype == torch.int64
        assert len(x) == len(y)
    assert sorted(int(i) for _, y in batches for i in y) == list(range(N))


class Row(NamedTuple):
    x: object
    y: object


def test_structures_keep_their_types_and_plain_values_become_empty():
    data = [{"x": torch.ones(2), "name": "a", "row": Row(torch.zeros(1), 3)}]
    empty = EmptyBatchCollate(data)([])
    assert empty["x"].shape == (0, 2) and empty["name"] == []
    assert type(empty["row"]) is Row and empty["row"].x.shape == (0, 1)
    assert empty["row"].y.shape == (0,)
    again = pickle.loads(pickle.dumps(EmptyBatchCollate(data)))  # loader workers
    assert type(again([])["row"]) is Row


def test_bad_arguments_are_named():
    with pytest.raises(InvalidArgumentError, match="dataset"):
        EmptyBatchCollate(3)
    with pytest.raises(InvalidArgumentError, match="collate_fn"):
        EmptyBatchCollate([1], collate_fn=3)
    with pytest.raises(InvalidArgumentError, match="collate_fn"):
        EmptyBatchCollate([1], collate_fn=lambda rows: 7)([])


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_an_empty_step_runs_adds_noise_and_is_charged_under_attach(mode):
    # ghost (review ir2): an empty batch's wrapped backward is one the ghost check admits
    opacus = pytest.importorskip("opacus")
    from torch import nn

    from privguard import Ledger
    from privguard import mechanisms as M
    from privguard.integrations.opacus import attach

    torch.manual_seed(0)
    data = _data()
    loader = DataLoader(data, batch_sampler=_sampler(), collate_fn=EmptyBatchCollate(data))
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # loss_reduction="sum" (review rhl): with Opacus' "mean", N < t examples give an
    # expected batch size of int(N / t) = 0, every gradient was divided by it, the
    # parameters were ±inf and NaN from the first step, and "moved" held for any step,
    # noised or not
    ghost = {"criterion": nn.CrossEntropyLoss(reduction="sum"), "grad_sample_mode": "ghost"}
    made = opacus.PrivacyEngine().make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0,
        max_grad_norm=1.0, poisson_sampling=False, loss_reduction="sum",
        **(ghost if mode == "ghost" else {}))
    model, opt, loader = made[0], made[1], made[-1]
    criterion = made[2] if mode == "ghost" else nn.CrossEntropyLoss(reduction="sum")
    ledger = Ledger(epsilon=50.0, delta=1e-5)
    attach(opt, ledger, data_loader=loader)
    empty_steps = 0
    for x, y in loader:
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
        assert all(bool(p.isfinite().all()) for p in model.parameters())
        moved = any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
        assert moved  # the noise of every step, an empty one's included
        empty_steps += len(x) == 0
    assert empty_steps >= T - N
    assert [r.mechanism for r in ledger.history] == [M.RandomAllocation(1.0, T)]


class _Unsized:
    """A map-style dataset with no ``__len__`` and no examples."""

    def __getitem__(self, i):
        raise IndexError(i)


@pytest.mark.parametrize("data", [[], TensorDataset(torch.zeros(0, 3)), _Unsized()],
                         ids=["list", "tensors", "unsized"])
def test_an_empty_dataset_is_refused_naming_it(data):
    # Task lo: dataset[0] of an empty dataset raised IndexError at the first empty batch.
    with pytest.raises(InvalidArgumentError, match=r"dataset.*first example"):
        EmptyBatchCollate(data)([])


def test_a_dataset_emptied_after_the_collate_was_built_is_refused_naming_it():
    data = [torch.ones(2)]
    collate = EmptyBatchCollate(data)
    data.clear()
    with pytest.raises(InvalidArgumentError, match=r"dataset.*first example"):
        collate([])
