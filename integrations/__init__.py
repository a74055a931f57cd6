"""Integrations of privguard with training frameworks (``privguard.integrations``).

* :mod:`privguard.integrations.opacus` — ``attach(optimizer, ledger)`` charges
  every real noisy step of an Opacus ``DPOptimizer``; ``LedgerAccountant``
  stands in for Opacus' accountant.

* :mod:`privguard.integrations.lightning` — ``LedgerCallback``.
* :mod:`privguard.integrations.huggingface` — ``LedgerTrainerCallback``.
* :mod:`privguard.integrations.ray` — ``RayExecutor``, a tuning backend.
* :mod:`privguard.integrations.optuna` — ``private_optimize``: Optuna objectives
  tuned under the random-K or DP-HyPO bound, releasing the best trial only.
* ``RandomAllocationSampler`` — batches in which each example is used once
  per epoch, privately (random allocation; charge
  :class:`privguard.mechanisms.RandomAllocation`). It does not import torch.
* ``EmptyBatchCollate`` — a DataLoader ``collate_fn`` that also collates the
  empty batches such a sampler draws (PyTorch's default collate cannot).

Each integration lives in its own module; optional frameworks are imported
lazily with an install hint.
"""

from privguard.integrations._allocation import (
    DistributedRandomAllocationSampler,
    RandomAllocationSampler,
)
from privguard.integrations._empty_batches import EmptyBatchCollate

__all__ = ["DistributedRandomAllocationSampler", "EmptyBatchCollate", "RandomAllocationSampler"]
