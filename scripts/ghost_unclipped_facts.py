"""What Opacus' ghost clipping holds after each kind of backward (task gz, docs/theory.md §14.5).

Prints, for one parameter of an ``nn.Linear`` made private with ``grad_sample_mode="ghost"``
and attached to a ledger: ‖p.grad‖, ‖p.summed_grad‖, the shape of ``_norm_sample`` and the
wrapped backward passes counted, after (a) a wrapped backward, (b) a plain criterion's,
(c) both in either order, (d) a weight penalty or a plain criterion's loss added to the
wrapped loss (one sample scaled x1e4: the clipped sum is at most B * C) and the wrapped
loss's ``loss_per_sample.mean()``, (f) a skipped step then a real one.

    python scripts/ghost_unclipped_facts.py
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_ghost_backward_count import _ghost

from privguard import Ledger, PipelineMismatchError
from privguard.integrations.opacus import attach


def _norm(t: torch.Tensor | None) -> float | None:
    return None if t is None else round(float(t.norm()), 4)


def state(tag: str, model: nn.Module, handle) -> None:
    p = next(iter(model.parameters()))
    ns = getattr(p, "_norm_sample", None)
    print(f"{tag:42s} grad={_norm(p.grad)} summed={_norm(getattr(p, 'summed_grad', None))} "
          f"norm_sample={None if ns is None else tuple(ns.shape)} counted={handle.ghost.count}")


def setup():
    _, model, opt, loader, criterion = _ghost()
    handle = attach(opt, Ledger(delta=1e-5), data_loader=loader)
    return model, opt, criterion, iter(loader), handle


def step(tag: str, opt) -> None:
    try:
        opt.step()
        print(f"{tag:42s} step admitted")
    except PipelineMismatchError as exc:
        print(f"{tag:42s} step refused ({exc.witness}: {exc.charged:g} wrapped, "
              f"{exc.measured:g} unclipped)")


def main() -> None:
    warnings.filterwarnings("ignore")
    plain = nn.CrossEntropyLoss()
    model, opt, crit, it, h = setup()
    x, y = next(it)
    crit(model(x), y).backward()
    state("(a) wrapped", model, h)
    step("(a)", opt)
    for scale in (1, 50):
        model, opt, crit, it, h = setup()
        x, y = next(it)
        plain(model(x) * scale, y).backward()
        state(f"(b) plain criterion, logits x{scale}", model, h)
        step("(b)", opt)
    for order in (("wrapped", "plain"), ("plain", "wrapped")):
        model, opt, crit, it, h = setup()
        x, y = next(it)
        for kind in order:
            (crit if kind == "wrapped" else plain)(model(x), y).backward()
        state(f"(c) {order[0]}, then {order[1]}", model, h)
        step("(c)", opt)
    model, opt, crit, it, h = setup()
    x, y = next(it)
    penalty = 0.1 * sum((p ** 2).sum() for p in model.parameters())
    (crit(model(x), y) + penalty).backward()
    state("(d) wrapped + weight penalty", model, h)
    step("(d)", opt)
    for extra in (False, True):  # review rgz: one sample x 1e4; the clipped sum is <= B * C
        model, opt, crit, it, h = setup()
        x, y = next(it)
        x = x.clone()
        x[0] *= 1e4
        out = model(x)
        (crit(out, y) + plain(out, y) if extra else crit(out, y)).backward()
        state(f"(d) B={len(x)}, C=1, outlier, wrapped{' + plain CE' if extra else ''}", model, h)
        step("(d)", opt)
    model, opt, crit, it, h = setup()
    x, y = next(it)
    crit(model(x), y).loss_per_sample.mean().backward()
    state("(d) loss_per_sample.mean()", model, h)
    step("(d)", opt)
    model, opt, crit, it, h = setup()
    x, y = next(it)
    crit(model(x), y).backward()
    opt.signal_skip_step(do_skip=True)
    opt.step()
    state("(f) skipped step", model, h)
    opt.zero_grad()
    state("(f) zero_grad after it", model, h)
    x, y = next(it)
    crit(model(x), y).backward()
    state("(f) wrapped backward", model, h)
    step("(f)", opt)


if __name__ == "__main__":
    main()
