"""Review lr: more records drawn than the charge's draws of the dataset (k > n: impossible under
Binomial(n, q)) passed the sampling witness. scipy's I_q(k, n−k+1) is NaN for k > n, and
``min(lower, upper) > α/2`` kept the lower tail's 1.0 over the NaN. Seen with a stale dataset
size (a witness watching a loader of 16 records while the steps drew from 256)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from opacus import GradSampleModule  # noqa: E402
from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import Ledger, PipelineMismatchError  # noqa: E402
from privguard.integrations._tails import binomial_tail_upper, clopper_pearson  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*Full backward hook.*")


def test_the_upper_tail_of_a_count_above_its_draws_is_zero_not_nan():
    assert binomial_tail_upper(93, 80, 0.25) == 0.0  # was NaN
    assert binomial_tail_upper(80, 80, 0.25) == pytest.approx(0.25 ** 80)
    lo, hi = clopper_pearson(93, 80)
    assert not math.isnan(lo) and hi == 1.0


def _loader(n: int) -> DPDataLoader:
    x = torch.randn(n, 10, generator=torch.Generator().manual_seed(n))
    return DPDataLoader.from_data_loader(
        DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=n // 4),
        generator=torch.Generator().manual_seed(n))


def test_a_batch_larger_than_the_dataset_it_is_charged_on_is_refused():
    model = GradSampleModule(nn.Linear(10, 2))
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                      max_grad_norm=1.0, expected_batch_size=4)
    ledger = Ledger(8.0, 1e-5)
    handle = attach(opt, ledger, data_loader=_loader(16), witnesses=True)  # N = 16, q = 1/4
    x, y = next(iter(_loader(256)))  # about 64 records, drawn from 256 at q = 1/4
    assert len(x) > 16
    before = [p.detach().clone() for p in model.parameters()]
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(PipelineMismatchError, match="sampling witness") as caught:
        opt.step()  # was: passed, charged and applied
    assert caught.value.witness == "sampling"
    assert len(ledger.history) == 0
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    handle.detach()
