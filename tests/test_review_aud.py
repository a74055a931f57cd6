"""Review aud: the one-run audit under DDP, its scorer on an exactly known mechanism, the CLI.

Before the fix ``audit_opacus`` accepted Opacus' distributed optimizers. Those add the
noise on rank 0 only, before the all-reduce, so on every other rank ``p.grad`` at
``scale_grad`` (where the canaries are scored) is that rank's own noiseless sum, not a
release: on a correct pipeline (σ = 2, charged ε = 0.89) rank 1 guessed 100 of 100 and
reported ``epsilon_lower = 3.04``, a false alarm; and every rank inserted canaries of its
own into the one summed update.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _one_rank import one_rank_group  # noqa: F401  (fixture: a gloo group of one rank)
from test_witnesses import _one_thread  # noqa: F401  (autouse: one torch thread per test)
from torch import nn

from privguard import InvalidArgumentError
from privguard.audit import audit_opacus

warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def _ddp_build(rank: int):
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
    from torch.utils.data import DataLoader, TensorDataset

    def build():
        torch.manual_seed(0)
        x = torch.randn(1024, 20)
        y = (x[:, 0] > 0).long()
        model = DPDDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2)))
        model, opt, loader = PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=64),
            noise_multiplier=2.0, max_grad_norm=1.0)
        opt.rank = rank  # what rank 1 of a job runs locally: no noise before the all-reduce
        return model, opt, loader
    return build


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("rank", [0, 1])
def test_a_distributed_optimizer_is_refused_naming_build(rank):
    with pytest.raises(InvalidArgumentError, match="distributed optimizer") as info:
        audit_opacus(_ddp_build(rank), steps=30, canaries=1000, seed=0)
    assert info.value.argument == "build"


# ------------------------------------------------------------------ the real scorer's coverage
class _KnownStep:
    """The Opacus optimizer calls the canaries hook into (``params`` with ``summed_grad``,
    ``add_noise``, ``scale_grad``), around an exactly known mechanism: each step's clipped sum
    is an arbitrary data vector, and ``add_noise`` adds N(0, σ²C²I) as Opacus does."""

    def __init__(self, d: int, sigma: float, gen: torch.Generator) -> None:
        self.params = [torch.zeros(d, dtype=torch.float64)]
        self.max_grad_norm, self.noise_multiplier, self.loss_reduction = 1.0, sigma, "sum"
        self.gen = gen

    def add_noise(self) -> None:
        for p in self.params:
            noise = torch.randn(p.shape, generator=self.gen, dtype=p.dtype)
            p.grad = p.summed_grad + self.noise_multiplier * self.max_grad_norm * noise

    def scale_grad(self) -> None:
        pass

    def step(self) -> None:
        for p in self.params:  # the data's clipped sum: large, and new at every step
            p.summed_grad = 5.0 * torch.randn(p.shape, generator=self.gen, dtype=p.dtype)
        self.add_noise()
        self.scale_grad()


def _canary_audits(sigma, q, steps, m, d, audits, seed):
    import numpy as np

    from privguard._audit._audit_scoring import default_guesses, lower_bound_over_guesses
    from privguard.audit import _Canaries

    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    lowers = []
    for _ in range(audits):
        opt = _KnownStep(d, sigma, gen)
        probe = _Canaries(opt, m, q, rng)
        for _ in range(steps):
            opt.step()
        lowers.append(lower_bound_over_guesses(probe.scores(), probe.included,
                                               default_guesses(m), 1e-5, 0.95)[0])
    return lowers


def test_coverage_of_audit_opacus_s_own_canaries_and_scores():
    """tests/test_audit.py's coverage tests score simulated projections with the test's own
    copy of the scorer; this runs privguard.audit's canaries (insertion, hidden sampling,
    data removal, scores) on the Poisson-subsampled Gaussian, whose ε is known (PLD), at a
    rate where the amplification by the hidden sampling is large (truth 1.85): a scorer
    that reads the canaries' sampling coins (the unamplified Gaussian, σ/√(qT) = 0.5) put
    30 of 30 bounds above it (mean 3.3; this scorer: mean 0.35, max 0.71), so it fails.
    (tests/test_audit.py's σ = 0.6, q = 0.3, 4 steps has a truth of 11.2, above the 5.78
    that 1,000 canaries can ever show: no scorer can fail it.)"""
    import dp_accounting as dpa
    from test_audit import _covered_or_fail, _pld_epsilon

    sigma, q, steps, m = 1.0, 0.02, 200, 1000
    truth = _pld_epsilon(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    lowers = _canary_audits(sigma, q, steps, m, d=1200, audits=200, seed=7)
    covered, p = _covered_or_fail(lowers, truth)
    assert p > 1e-3, (covered, truth, max(lowers))
    assert sum(lowers) / len(lowers) > 0.05 * truth  # and the scores see the canaries


# ------------------------------------------------------------------ the CLI's rounding
def test_privguard_audit_prints_the_ratio_rounded_down(monkeypatch, capsys):
    """The ratio epsilon_lower / epsilon_charged was printed to nearest: 0.9996 read
    "1.000", as if the lower bound had reached the charge, beside the two numbers printed
    rounded down and up."""
    import privguard.audit as audit
    from privguard._cli._cli import main

    def fake(**_):
        return audit.AuditResult(epsilon_lower=0.9996, epsilon_charged=1.0, delta=1e-5,
                                 confidence=0.95, canaries=10, guesses=2, correct=2, steps=1)

    monkeypatch.setattr(audit, "demo_audit", fake)
    assert main(["audit", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "epsilon_lower   = 0.999 " in out and "epsilon_charged = 1.000 " in out, out
    assert "ratio           = 0.999" in out, out


# ------------------------------------------------------------------ the split level's rounding
@pytest.mark.parametrize("confidence", [0.9, 0.8])
def test_a_p_value_above_the_split_level_is_never_a_rejection(monkeypatch, confidence):
    """Each of n pairs must be tested at level ≤ (1 − c)/n (Proposition 16.4's union bound).
    The code tested at 1 − (1 − (1 − c)/n), which rounds above it at c = 0.9 and 0.8 with
    n = 4: a p-value just above (1 − c)/n, at every ε, was a rejection at every grid point
    and the bound read 60."""
    import math
    from fractions import Fraction

    import numpy as np

    import privguard._audit._one_run as one_run
    from privguard._audit._audit_scoring import default_guesses, lower_bound_over_guesses

    pairs = default_guesses(1000)
    exact = (1 - Fraction(confidence)) / len(pairs)
    above = math.nextafter(float(exact), 1.0) if Fraction(float(exact)) <= exact \
        else float(exact)
    assert Fraction(above) > exact
    monkeypatch.setattr(one_run, "_p_values", lambda m, r, v, eps, delta: np.full(eps.shape,
                                                                                 above))
    included = np.arange(1000) % 2 == 0
    low = lower_bound_over_guesses(included.astype(float), included, pairs, 1e-5, confidence)
    assert low[0] == 0.0, low


# ------------------------------------------------------------------ the pipeline left as found
def test_the_pipeline_s_own_add_noise_is_put_back_after_the_audit():
    """A pipeline that set its own ``optimizer.add_noise`` (an instance attribute) had it
    deleted by the audit, leaving Opacus' class method in its place."""
    from test_audit import _build

    made = []

    def build():
        model, opt, loader = _build(noise=1.0, half=True)()
        made.append(opt)
        return model, opt, loader

    audit_opacus(build, steps=2, canaries=10, seed=0)
    opt = made[0]
    assert "add_noise" in vars(opt) and "scale_grad" not in vars(opt)
    assert vars(opt)["add_noise"].__name__ == "add_noise"  # the pipeline's closure
    assert not hasattr(vars(opt)["add_noise"], "__self__")  # not a bound method of _Canaries


# ------------------------------------------------------------------ batches the audit cannot train on
def test_a_loader_of_other_than_input_label_pairs_is_refused_naming_build():
    """``for x, y in loader`` raised ValueError (3 tensors a batch) from inside the run."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    def build():
        torch.manual_seed(0)
        x = torch.randn(256, 8)
        y = (x[:, 0] > 0).long()
        model = nn.Linear(8, 2)
        return PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(x, y, y), batch_size=32),
            noise_multiplier=1.0, max_grad_norm=1.0)

    with pytest.raises(InvalidArgumentError, match="inputs, labels") as info:
        audit_opacus(build, steps=3, canaries=10, seed=0)
    assert info.value.argument == "build"
