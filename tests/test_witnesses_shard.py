"""Issue 28: the sampling witness under DDP (integrations/_shard.py).

Opacus' ``DistributedUniformWithReplacementSampler`` skips a draw that takes no
record, so a rank's batch sizes are zero-truncated Binomial(n, q) draws from its
shard of n records. The witness tests them exactly: the tie probability of the
truncated law, and the running count at α·(1 − p₀)^m. These tests feed the
witness's tests directly (no process group); tests/test_ddp.py runs it on 2 gloo
ranks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler
from scipy import stats
from torch import nn

from privguard import PipelineMismatchError
from privguard.integrations._shard import ShardDraws, truncation_factor
from privguard.integrations._witnesses import Witnesses


def _sampler(total: int, q: float, ranks: int = 2, rank: int = 0, steps: int | None = None):
    """Opacus' distributed sampler as rank ``rank`` of ``ranks`` builds it (no process group)."""
    s = DistributedUniformWithReplacementSampler.__new__(DistributedUniformWithReplacementSampler)
    s.total_size, s.sample_rate, s.generator = total, q, None
    s.num_replicas, s.rank, s.epoch, s.shuffle, s.shuffle_seed = ranks, rank, 0, True, 0
    s.num_samples = total // ranks + (1 if rank < total % ranks else 0)
    s.num_batches = steps if steps is not None else int(1 / q)
    return s


class _Loader:
    def __init__(self, sampler):
        self.batch_sampler = sampler


def _witnesses(total: int, q: float, ranks: int = 2, false_alarm: float = 1e-10):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.params = list(model.parameters())  # what the witnesses read of a DPOptimizer here
    sampler = _sampler(total, q, ranks)
    w = Witnesses(opt, None, false_alarm=false_alarm, noise=False,
                  shard_loader=_Loader(sampler))
    w.shard = ShardDraws(sampler)
    return w, sampler


def _truncated(rng, n, q, size):
    """``size`` zero-truncated Binomial(n, q) draws (rejection: the sampler's own rule)."""
    out = []
    while len(out) < size:
        b = rng.binomial(n, q, size=size)
        out.extend(int(v) for v in b if v > 0)
    return out[:size]


def _feed(w, sizes, q, per_step=1):
    for i in range(0, len(sizes), per_step):
        w.steps += 1
        w._check_sampling(sizes[i:i + per_step], q, 1)


def test_truncation_factor_is_the_probability_of_no_empty_draw():
    n, q = 16, 0.1
    p0 = (1 - q) ** n
    assert math.isclose(truncation_factor(n, q, 7), (1 - p0) ** 7, rel_tol=1e-12)
    assert truncation_factor(n, q, 0) == 1.0
    assert truncation_factor(10**6, 0.01, 10**9) == 1.0  # p₀ = e^−10050: no loss
    assert truncation_factor(1, 0.5, 10**6) == 0.0  # half the draws empty: nothing left


def test_shard_mode_reads_the_rank_shard_and_splits_the_level_over_ranks():
    w, sampler = _witnesses(257, 1 / 8, ranks=2)
    assert w.dataset_size == 129 == sampler.num_samples  # rank 0 holds the odd record
    assert "sampling" in w.active and "noise" not in w.active
    assert w._sampling_alarm == pytest.approx(w.false_alarm / 2)
    assert w.inclusion is None  # no per-record counts under DDP


def test_ties_use_the_zero_truncated_law():
    """c = Σ_{b≥1} (P(B=b)/(1−p₀))²: with p₀ = 0.19 the untruncated c is 23% too small."""
    n, q = 16, 0.1
    w, _ = _witnesses(2 * n, q)
    rng = np.random.default_rng(0)
    _feed(w, _truncated(rng, n, q, 4), q)
    pmf = stats.binom.pmf(np.arange(n + 1), n, q)
    p0 = pmf[0]
    exact = float(np.sum((pmf[1:] / (1 - p0)) ** 2))
    assert math.isclose(w._tie_rate, exact, rel_tol=1e-5)
    assert exact > 1.25 * float(np.sum(pmf * pmf))


@pytest.mark.parametrize("n,q", [(16, 0.1), (64, 1 / 8)])
def test_zero_truncated_draws_of_the_charged_rate_do_not_alarm(n, q):
    """2,000 steps of a correct rank (p₀ = 0.19 and 2·10⁻⁴): no alarm. Tested as untruncated
    Binomial(n, q) draws (the witness before this change), the same draws alarm: their mean is
    nq/(1−p₀), and they tie more often than Binomial(n, q) draws."""
    rng = np.random.default_rng(1)
    sizes = _truncated(rng, n, q, 2000)
    w, _ = _witnesses(2 * n, q)
    _feed(w, sizes, q)
    assert w.failure is None
    if n == 16:  # the plain binomial tests on the same draws
        plain = Witnesses(w.optimizer, n, false_alarm=1e-10, noise=False)
        with pytest.raises(PipelineMismatchError):
            _feed(plain, sizes, q)


def test_a_rank_drawing_at_twice_the_charged_rate_is_caught_within_a_few_steps():
    n, q = 128, 1 / 8
    w, _ = _witnesses(2 * n, q)
    rng = np.random.default_rng(2)
    sizes = _truncated(rng, n, 2 * q, 50)
    with pytest.raises(PipelineMismatchError) as info:
        _feed(w, sizes, q)
    assert info.value.witness == "sampling" and info.value.step <= 10
    assert "shard of n = 128 records" in str(info.value)


def test_fixed_size_batches_on_a_rank_are_caught_by_the_ties():
    n, q = 128, 1 / 8
    w, _ = _witnesses(2 * n, q)
    with pytest.raises(PipelineMismatchError) as info:
        _feed(w, [16] * 50, q)
    assert "pairs of batches had equal sizes" in str(info.value)


def test_the_recorder_sees_what_the_sampler_yields_and_is_undone():
    torch.manual_seed(0)
    sampler = _sampler(64, 0.05, ranks=2, steps=200)
    draws = ShardDraws(sampler)
    yielded = [len(b) for b in sampler]
    assert draws.take() == yielded and 0 < len(yielded) < 200  # empty draws were skipped
    assert min(yielded) >= 1
    draws.restore()
    assert type(sampler) is DistributedUniformWithReplacementSampler
    assert ShardDraws.sampler_of(_Loader(sampler)) is sampler
    assert ShardDraws.sampler_of(_Loader(object())) is None


def test_false_alarms_stay_within_the_level_where_truncation_matters():
    """At p₀ = 0.19 and a large α = 0.1 (split α/2 per rank, two tests: ≤ 0.1 per run),
    60 correct runs of 1,000 steps alarm no more than a one-sided binomial test at 10⁻³
    allows of a rate 0.1. Tested as untruncated draws, every run alarms (their mean is
    nq/(1 − p₀), 24% above nq)."""
    n, q, runs = 16, 0.1, 60
    rng = np.random.default_rng(3)
    alarms = 0
    for _ in range(runs):
        w, _ = _witnesses(2 * n, q, false_alarm=0.1)
        try:
            _feed(w, _truncated(rng, n, q, 1000), q)
        except PipelineMismatchError:
            alarms += 1
    assert stats.binom.sf(alarms - 1, runs, 0.1) > 1e-3, alarms


def test_opacus_distributed_sampler_itself_passes_at_a_small_shard_rate():
    """Opacus' own sampler (nq = 3.2 on a shard of 32: 3.4% of its draws are empty and
    skipped), 20 epochs of 100 draws fed step by step: no alarm, and the ties were tested."""
    torch.manual_seed(4)
    sampler = _sampler(64, 0.1, ranks=2, steps=100)
    w, _ = _witnesses(64, 0.1)
    w.shard = ShardDraws(sampler)
    for _ in range(20):
        for _batch in sampler:
            w.steps += 1
            w._check_sampling(w.shard.take(), 0.1, 1)
    assert w.failure is None and w._pairs > 900
