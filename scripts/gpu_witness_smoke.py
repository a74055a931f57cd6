"""The witnesses on an accelerator: clean runs raise no alarm, injected bugs are caught.

The test suite runs the witnesses on the CPU only (CI has no GPU). This runs the issue-28
checks on the device given (``--device cuda``): ``--runs`` clean runs of ``--steps`` steps
of a 20-64-2 MLP (batch 128, Poisson sampling) with ``attach(..., witnesses=True)``, counting
refusals (a false alarm: there should be none), then one run per injected bug (σ applied =
½ × σ charged, noise off, clipping off with C below the median per-sample norm), printing
the step at which each was refused (issue 28: within 50 steps).

Run: python scripts/gpu_witness_smoke.py [--device cuda] [--runs 20] [--steps 300]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import Ledger, PipelineMismatchError
from privguard.integrations.opacus import attach

# the injected bugs of the unit suite (tests/test_witnesses.py), the same code on a device
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_witnesses import _half_noise, _no_clipping, _no_noise

warnings.filterwarnings("ignore")


def pipeline(device: torch.device, seed: int, clip: float = 1.0):
    torch.manual_seed(seed)
    x = torch.randn(4096, 20)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=128), noise_multiplier=1.0,
        max_grad_norm=clip, poisson_sampling=True)
    return model, opt, loader


def train(model, opt, loader, device: torch.device, steps: int) -> int | None:
    """The step (1-based) at which a witness refused, or None after ``steps`` steps."""
    done = 0
    while True:
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            try:
                opt.step()
            except PipelineMismatchError:
                return done + 1
            done += 1
            if done == steps:
                return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__} on {name}")
    t0, alarms = time.perf_counter(), 0
    for run in range(args.runs):
        model, opt, loader = pipeline(device, run)
        attach(opt, Ledger(epsilon=50.0, delta=1e-5), data_loader=loader, witnesses=True)
        alarms += train(model, opt, loader, device, args.steps) is not None
    print(f"clean runs: {args.runs} of {args.steps} steps, refusals (false alarms): {alarms} "
          f"({time.perf_counter() - t0:.1f} s)")
    # C = 0.05 lies below the median per-sample gradient norm of this MLP at initialisation,
    # so clipping turned off moves the sum (issue 28: otherwise the bug is invisible)
    for bug, clip in (("σ applied = ½ σ charged", 1.0), ("noise off", 1.0),
                      ("clipping off (C = 0.05)", 0.05)):
        model, opt, loader = pipeline(device, 1000, clip)
        if bug.startswith("σ"):
            _half_noise(opt)
        elif bug == "noise off":
            _no_noise(opt)
        handle = attach(opt, Ledger(epsilon=50.0, delta=1e-5), data_loader=loader,
                        witnesses=True)
        if bug.startswith("clipping"):
            _no_clipping(opt, handle)
        caught = train(model, opt, loader, device, 50)
        print(f"{bug}: {'refused at step ' + str(caught) if caught else 'NOT caught in 50 steps'}")


if __name__ == "__main__":
    main()
