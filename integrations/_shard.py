"""The sampling witness under DDP: one rank's draws from Opacus' distributed Poisson sampler.

Part of the witnesses (issue 28, integrations/_witnesses.py). Under DDP,
Opacus' ``DistributedUniformWithReplacementSampler`` gives each rank a shard
of ``num_samples`` records (⌊N/W⌋ or ⌈N/W⌉) and, at each of its draws, takes
every record of the shard independently with probability q; a draw that
takes no record is *skipped* (not yielded). The draws are independent
Binomial(n, q), n = ``num_samples``, so the yielded batch sizes are the
non-zero draws: independent and zero-truncated, P(Y = b) = P(B = b)/(1 − p₀)
for b ≥ 1, p₀ = (1 − q)ⁿ (docs/theory.md §16.1, "Sampling under DDP").

:class:`ShardDraws` records the size of each batch the sampler yields (its
class is swapped for a recording subclass, as
:class:`~privguard.integrations._inclusion.InclusionCounts` does); the
witness tests them with the binomial tests, at levels that pay for the
truncation exactly (:func:`truncation_factor`).
"""

from __future__ import annotations

import math
from typing import Any

from privguard.integrations._describe import swap_iter

__all__ = ["ShardDraws", "truncation_factor"]


def truncation_factor(n: int, q: float, m: int) -> float:
    """(1 − p₀)^m, p₀ = (1 − q)ⁿ: what a level is multiplied by to test m zero-truncated draws.

    For m independent draws of Binomial(n, q) conditioned on ≥ 1, every event A
    of the sizes has P_trunc(A) = P(A ∩ {all ≥ 1})/(1 − p₀)^m ≤ P(A)/(1 − p₀)^m
    (the joint law is the untruncated one restricted and renormalised), so a
    test of level β·(1 − p₀)^m under independent Binomial(n, q) draws has
    level ≤ β under the truncated law (docs/theory.md §16.1).

    Example:
        >>> truncation_factor(128, 1 / 8, 1) == 1 - (7 / 8) ** 128
        True
        >>> truncation_factor(128, 1 / 8, 0)
        1.0
    """
    if m <= 0 or not 0.0 < q < 1.0:
        return 1.0
    p0 = math.exp(n * math.log1p(-q))  # (1 − q)ⁿ
    return math.exp(m * math.log1p(-p0)) if p0 < 1.0 else 0.0


class ShardDraws:
    """Records the sizes of the batches a rank's distributed Poisson sampler yields.

    Args:
        sampler: the loader's ``DistributedUniformWithReplacementSampler``.

    Attributes:
        shard: n, the records of this rank's shard (the sampler's ``num_samples``).
        ranks: W, the number of ranks (each runs its own sampling tests).
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.shard = int(sampler.num_samples)
        self.ranks = int(sampler.num_replicas)
        self._sizes: list[int] = []
        self._original, self._recording = swap_iter(sampler, self._record)

    @staticmethod
    def sampler_of(loader: Any) -> Any:
        """``loader.batch_sampler`` if it is Opacus' distributed Poisson sampler, else None."""
        try:
            from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler
        except ImportError:  # pragma: no cover - an Opacus without it
            return None
        sampler = getattr(loader, "batch_sampler", None)
        if type(sampler) is not DistributedUniformWithReplacementSampler:
            return None  # a subclass may draw otherwise: not witnessed
        n, ranks = getattr(sampler, "num_samples", None), getattr(sampler, "num_replicas", None)
        if not (isinstance(n, int) and n > 0 and isinstance(ranks, int) and ranks > 0):
            return None
        return sampler

    def _record(self, indices: Any) -> None:
        self._sizes.append(len(indices))

    def take(self) -> list[int]:
        """The sizes yielded since the last call, in order."""
        sizes, self._sizes = self._sizes, []
        return sizes

    def restore(self) -> None:
        """Give the sampler its own class back."""
        if type(self.sampler) is self._recording:
            self.sampler.__class__ = self._original
