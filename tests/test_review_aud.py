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


@pytest.mark.parametrize("rank", [0, 1])
def test_a_distributed_optimizer_is_refused_naming_build(tmp_path, rank):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                            world_size=1)
    try:
        with pytest.raises(InvalidArgumentError, match="distributed optimizer") as info:
            audit_opacus(_ddp_build(rank), steps=30, canaries=1000, seed=0)
        assert info.value.argument == "build"
    finally:
        dist.destroy_process_group()
