"""A gloo process group of one rank in this process, for Opacus' distributed optimizers."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank in this process (Opacus' distributed optimizers)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
