"""DP-SGD for small MLPs, fast enough to train for 100+ epochs on CPU in an example.

One step: Poisson-sample the batch (each example independently with rate q),
compute each example's gradient norm exactly without materialising the
per-example gradients, clip each example to ``clip``, sum, add
N(0, (σ·clip)²) to every coordinate, divide by the expected batch size q·n
and take an SGD step — the same mechanism Opacus runs
(``make_private(poisson_sampling=True)``), a ``SubsampledGaussian(σ, q)`` per
step. The caller charges each step to a privguard ledger *before* calling
:meth:`DPMLP.step`.

For a linear layer z = a Wᵀ + b, one example's gradient is δ aᵀ (and δ for
the bias), where δ = ∂loss/∂z, so its squared norm is |δ|²(|a|² + 1). The
per-example δ of every layer comes from one backward pass (written out by
hand for the ReLU MLP and cross-entropy), and the clipped sum of gradients is
(c·δ)ᵀ a.
``tests/test_examples.py`` checks the norms against per-example autograd.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn


class DPMLP(nn.Module):
    """A ReLU MLP trained with DP-SGD. ``sizes`` = (inputs, hidden…, classes)."""

    def __init__(self, sizes: tuple[int, ...], generator: torch.Generator) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        for fan_in, fan_out in itertools.pairwise(sizes):
            layer = nn.Linear(fan_in, fan_out)
            bound = fan_in ** -0.5  # PyTorch's default init, drawn from ``generator``
            with torch.no_grad():
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)
            self.layers.append(layer)

    @torch.no_grad()
    def forward_saving(self, x: torch.Tensor) -> tuple[torch.Tensor, list, list]:
        """Logits, each layer's input a and pre-activation z."""
        inputs, pre = [], []
        a = x
        for k, layer in enumerate(self.layers):
            inputs.append(a)
            z = layer(a)
            pre.append(z)
            a = torch.relu(z) if k < len(self.layers) - 1 else z
        return a, inputs, pre

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k, layer in enumerate(self.layers):
            x = layer(x)
            x = torch.relu(x) if k < len(self.layers) - 1 else x
        return x

    @torch.no_grad()
    def per_example_norms(self, x: torch.Tensor, y: torch.Tensor):
        """Each example's gradient norm (over all parameters) of the cross-entropy
        loss, and the (a, δ) pair of every layer; backpropagated by hand."""
        logits, inputs, pre = self.forward_saving(x)
        d = torch.softmax(logits, 1)
        d[torch.arange(len(y)), y] -= 1.0  # ∂loss_i/∂logits_i
        deltas = [d]
        for k in range(len(self.layers) - 1, 0, -1):
            d = (d @ self.layers[k].weight) * (pre[k - 1] > 0)
            deltas.append(d)
        deltas.reverse()
        sq = torch.zeros(len(x))
        for a, d in zip(inputs, deltas):
            sq += d.square().sum(1) * (a.square().sum(1) + 1.0)
        return sq.sqrt(), list(zip(inputs, deltas))

    @torch.no_grad()
    def _sgd_update(self, grads, lr: float) -> None:
        for layer, (gw, gb) in zip(self.layers, grads):
            layer.weight -= lr * gw
            layer.bias -= lr * gb

    @torch.no_grad()
    def step(self, x: torch.Tensor, y: torch.Tensor, *, sample_rate: float, n: int, sigma: float,
             clip: float, lr: float, generator: torch.Generator) -> None:
        """One DP-SGD step on the Poisson-sampled batch (x, y) of a data set of size n."""
        grads = []
        if len(x):
            norms, saved = self.per_example_norms(x, y)
            scale = torch.clamp(clip / (norms + 1e-12), max=1.0)
        for k, layer in enumerate(self.layers):
            if len(x):
                a, d = saved[k]
                cd = d * scale[:, None]
                gw, gb = cd.T @ a, cd.sum(0)
            else:  # an empty Poisson batch still adds the noise
                gw, gb = torch.zeros_like(layer.weight), torch.zeros_like(layer.bias)
            gw = gw + sigma * clip * torch.randn(gw.shape, generator=generator)
            gb = gb + sigma * clip * torch.randn(gb.shape, generator=generator)
            expected = sample_rate * n
            grads.append((gw / expected, gb / expected))
        self._sgd_update(grads, lr)


def poisson_batch(n: int, sample_rate: float, rng: np.random.Generator) -> torch.Tensor:
    """Indices of a Poisson-sampled batch: each of n examples independently with rate q.

    Drawn as a size k ~ Binomial(n, q), then k distinct indices uniformly at
    random: the same distribution (given its size, a Poisson sample is a
    uniformly random subset), in O(k) instead of O(n).
    """
    k = int(rng.binomial(n, sample_rate))
    return torch.from_numpy(rng.choice(n, size=k, replace=False))


@torch.no_grad()
def correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    return int((model(x).argmax(1) == y).sum())
