"""secure_mode with Opacus' DistributedPerLayerOptimizer is refused (task adv6).

Its backward hooks draw each layer's noise with ``generator=None`` (torch's default,
replayable generator), not the secure generator ``secure_mode`` asks for; attach refused
nothing on main. σ is unchanged, so the flat and ``secure_mode=False`` cases attach as
before.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from _one_rank import one_rank_group  # noqa: E402, F401 (a fixture)
from torch import nn  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.usefixtures("one_rank_group")]


def _per_layer(secure_mode: bool):
    from opacus import GradSampleModule
    from opacus.optimizers.ddp_perlayeroptimizer import DistributedPerLayerOptimizer

    model = GradSampleModule(nn.Linear(4, 2))
    return DistributedPerLayerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        noise_multiplier=1.0, max_grad_norm=[1.0, 1.0],
                                        expected_batch_size=8, secure_mode=secure_mode)


def test_secure_mode_per_layer_ddp_is_refused_at_attach_nothing_charged():
    opt = _per_layer(secure_mode=True)
    ledger = Ledger(delta=1e-5)
    with pytest.raises(InvalidArgumentError, match="generator=None") as info:
        attach(opt, ledger, sample_rate=0.125)
    assert "optimizer" in str(info.value) and "DistributedPerLayerOptimizer" in str(info.value)
    assert ledger.history == [] and opt.step_hook is None


def test_per_layer_ddp_without_secure_mode_attaches_as_before():
    opt = _per_layer(secure_mode=False)
    handle = attach(opt, Ledger(delta=1e-5), sample_rate=0.125)
    handle.detach()
