"""At which step each injected bug of tests/test_witnesses.py is refused (issue 28).

Run: python benchmarks/witness_injected_bugs.py
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
warnings.filterwarnings("ignore")

import test_witnesses as T  # noqa: E402

from privguard import InvalidArgumentError, Ledger, PipelineMismatchError  # noqa: E402
from privguard.integrations.opacus import attach  # noqa: E402


def _caught(handle, model, opt, loader, crit):
    try:
        T.run(model, opt, loader, crit, 50)
    except PipelineMismatchError as exc:
        return f"step {exc.step} ({exc.witness} witness)"
    return "not caught in 50 steps"


def main() -> None:
    torch.set_num_threads(1)
    cases = {
        "σ applied = ½ σ charged": (dict(), T._half_noise, {}),
        "noise off": (dict(), T._no_noise, {}),
        "clipping off (C = 0.01 < median norm)": (dict(clip=0.01), T._no_clipping, {}),
        "q charged = ½ the loader's": (dict(), None, {"sample_rate": 1 / 32}),
    }
    for name, (kw, bug, extra) in cases.items():
        model, opt, loader, crit = T.pipeline(**kw)
        if bug is not None:
            bug(opt)
        try:
            handle = attach(opt, Ledger(epsilon=10.0, delta=1e-5), data_loader=loader,
                            witnesses=True, **extra)
        except InvalidArgumentError as exc:
            print(f"{name:40s} refused at attach ({str(exc)[:60]}...)")
            continue
        print(f"{name:40s} {_caught(handle, model, opt, loader, crit)}")
    model, opt, loader, crit = T.pipeline(clip=0.01)
    handle = attach(opt, Ledger(epsilon=10.0, delta=1e-5), data_loader=loader, witnesses=True)
    T.run(model, opt, loader, crit, 3)
    T._no_clipping(opt, handle)
    print(f"{'clipping off from step 4 (C = 0.01)':40s} {_caught(handle, model, opt, loader, crit)}")
    model, opt, loader, crit = T.pipeline()
    handle = attach(opt, Ledger(epsilon=10.0, delta=1e-5), data_loader=loader, witnesses=True)
    T.run(model, opt, loader, crit, 5)
    T._half_noise(opt)  # from step 6: refused at step 6 (the noise test runs at every step)
    print(f"{'σ applied = ½ σ charged from step 6':40s} {_caught(handle, model, opt, loader, crit)}")
    model, opt, loader, crit = T.pipeline()
    handle = attach(opt, Ledger(epsilon=10.0, delta=1e-5), data_loader=loader, sample_rate=1 / 16,
                    witnesses=True)
    loader.batch_sampler.sample_rate = 1.5 / 16
    print(f"{'sampler draws 1.5× the charged q':40s} {_caught(handle, model, opt, loader, crit)}")
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(T.N, 20)
    net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    net, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.05),
        data_loader=DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=64),
        noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False)
    handle = attach(opt, Ledger(epsilon=10.0, delta=1e-5), data_loader=loader, check_poisson=False,
                    witnesses=True)
    caught = _caught(handle, net, opt, loader, nn.CrossEntropyLoss())
    print(f"{'fixed-size batches charged as Poisson':40s} {caught}")

    class HalfAtTwiceTheRate:  # the batch-size law of Poisson(q), the wrong records
        sample_rate = 1 / 16

        def __len__(self):
            return 16

        def __iter__(self):
            for _ in range(16):
                yield (torch.rand(T.N // 2) < 2 / 16).nonzero().reshape(-1).tolist()

    model, opt, loader, crit = T.pipeline()
    weighted = DataLoader(loader.dataset, batch_sampler=HalfAtTwiceTheRate())
    handle = attach(opt, Ledger(epsilon=10.0, delta=1e-5), data_loader=weighted,
                    sample_rate=1 / 16, check_poisson=False, witnesses=True)
    caught = _caught(handle, model, opt, weighted, crit)
    print(f"{'half the records at 2q, half never':40s} {caught}")


if __name__ == "__main__":
    main()
