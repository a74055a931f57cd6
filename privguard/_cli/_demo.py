"""``privguard demo``: tune, train and report a private model under one persistent ledger.

On scikit-learn's digits (ships with the package; nothing is downloaded):

1. a ledger file with a total (ε, δ) budget;
2. random-K tuning of the learning rate (Poisson number of runs), its whole
   bound charged to the ledger before any candidate runs; each candidate
   trains with DP-SGD and scores itself with a noisy validation count;
3. final DP-SGD training with the selected learning rate on the same ledger,
   the budget meter in the progress bar, stopping early when the
   noisy validation count stops improving (or when the filter refuses);
4. the report, a plot next to the database, and what ε to report and why.
"""

from __future__ import annotations

import math
import os
import time
import warnings

import numpy as np

from privguard import _validation as check
from privguard import mechanisms as M
from privguard._accounting._results import exact, upper
from privguard._errors import BudgetExhausted, InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard._optional import require
from privguard._stores import open_store

DELTA = 1e-5
BATCH, SIGMA, VAL_STD = 64, 1.0, 5.0


def _require_extras():
    require("matplotlib", "examples")
    require("sklearn", "examples")


def _data(seed: int = 0):
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.utils.data import TensorDataset

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    x_tr, x_va, y_tr, y_va = train_test_split(x_tr, y_tr, test_size=0.2, random_state=seed,
                                              stratify=y_tr)
    t = lambda a, b: TensorDataset(torch.tensor(a), torch.tensor(b))
    return t(x_tr, y_tr), t(x_va, y_va), t(x_te, y_te)


def _private_model(train, lr: float, seed: int):
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    engine = PrivacyEngine(accountant="rdp")
    return engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr),
                               data_loader=DataLoader(train, batch_size=BATCH),
                               noise_multiplier=SIGMA, max_grad_norm=1.0)


def _epoch(model, opt, loader) -> None:
    from torch import nn

    model.train()
    for x, y in loader:
        if len(x):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()


def _correct(model, data) -> int:
    import torch

    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        return int((model(x).argmax(1) == y).sum())


def _noisy_count(model, val, ledger_like, rng, label: str) -> float:
    ledger_like.charge(M.Gaussian(VAL_STD), label=label)  # charged before it is computed
    return _correct(model, val) + float(rng.normal(0.0, VAL_STD))


def run(db: str | None = None, quick: bool | None = None, epsilon: float = 10.0) -> dict:
    """Run the demo; returns the numbers it printed.

    Raises:
        InvalidArgumentError: a bad argument, before anything is printed or created.
    """
    epsilon = check.positive_finite("epsilon", epsilon)  # before anything is printed
    if quick is not None and not isinstance(quick, bool):
        raise InvalidArgumentError("quick", quick, "must be None, True or False")
    if db is not None:
        open_store(db).close()  # a malformed path is refused here, before the demo starts
    _require_extras()
    from privguard._cli._report import plot, print_report, report
    from privguard._cli._risk import risk_sentence
    from privguard._progress import progress
    from privguard.integrations.opacus import attach
    from privguard.tuning import Poisson, RandomSearch

    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message=".*Full backward hook.*")
    warnings.filterwarnings("ignore", message=".*Optimal order is the.*")
    reason = "--quick" if quick else ""
    if quick is None:
        quick = os.environ.get("CI") == "true"
        reason = "CI=true" if quick else ""
    cand_epochs, final_epochs, mean_runs = (2, 6, 3.0) if quick else (5, 40, 6.0)
    start = time.time()
    if db is None:
        folder = os.path.abspath("privguard-demo")
        os.makedirs(folder, exist_ok=True)
        db = os.path.join(folder, time.strftime("budget-%Y%m%d-%H%M%S.db"))
    rng = np.random.default_rng()  # OS entropy: noise and K must be unpredictable
    train, val, test = _data()
    # exactly what Opacus' make_private will use: q = 1/len(loader), ceil(n/batch) batches
    steps_per_epoch = math.ceil(len(train) / BATCH)
    q = 1.0 / steps_per_epoch

    print(f"privguard demo{f' (reduced size: {reason})' if quick else ''}: digits, "
          f"{len(train)} private training examples, DP-SGD σ={SIGMA}, batch {BATCH}")
    ledger = Ledger(epsilon=epsilon, delta=DELTA, path=db, plan=M.SubsampledGaussian(SIGMA, q))
    print(f"ledger {db}: budget (ε = {exact(epsilon)}, δ = {exact(DELTA)})\n")

    # 1. Random-K tuning of the learning rate.
    per_candidate = M.Composed((M.SubsampledGaussian(SIGMA, q, cand_epochs * steps_per_epoch),
                                M.Gaussian(VAL_STD)))

    def objective(params, child):
        model, opt, loader = _private_model(train, params["lr"], int(rng.integers(1 << 30)))
        attach(opt, child, data_loader=loader)
        for _ in range(cand_epochs):
            _epoch(model, opt, loader)
        return _noisy_count(model, val, child, rng, "candidate score")

    tuner = RandomSearch({"lr": [0.05, 0.1, 0.2, 0.5, 1.0, 2.0]}, Poisson(mean_runs),
                         cost=per_candidate)
    plan = tuner.plan(DELTA)
    print(f"1. tuning the learning rate: {plan}")
    result = tuner.run(objective, ledger, label="random-K tuning")
    lr = result.params["lr"] if result.selected and result.params is not None else 0.5
    # K is not released with the winner (privguard.tuning), nor why there is none
    print(f"   selected lr = {lr}\n" if result.selected else
          f"   no winner (the tuning released none); training with the default lr = {lr}\n")

    # 2. Final training under the same ledger, with early stopping.
    model, opt, loader = _private_model(train, lr, int(rng.integers(1 << 30)))
    handle = attach(opt, ledger, data_loader=loader, label="final training",
                    on_exhausted="stop")
    best, stale, stop_reason, epochs = -np.inf, 0, f"planned {final_epochs} epochs done", 0
    print(f"2. final training (up to {final_epochs} epochs; stop after 2 epochs without "
          "improvement of a noisy validation count)")
    # on a terminal a bar; in a log file or a pipe one line per epoch, no carriage returns
    with progress("final training", total=final_epochs, unit="epoch", per_update=True) as bar:
        try:
            for epoch in range(1, final_epochs + 1):
                _epoch(model, opt, loader)
                if handle.exhausted:
                    stop_reason = "the filter refused the next step"
                    break
                epochs = epoch
                try:
                    score = _noisy_count(model, val, ledger, rng, "early-stopping check")
                finally:  # the epoch trained: its line, also when the count is refused
                    meter = ledger.budget()
                    bar.set_postfix_str(f"budget {upper(meter.spent, '.3f')} of ε = "
                                        f"{exact(meter.epsilon)}" if meter is not None else "")
                    bar.update(1)
                best, stale = (score, 0) if score > best + VAL_STD else (best, stale + 1)
                if stale >= 2:
                    stop_reason = "no significant improvement for 2 epochs"
                    break
        except BudgetExhausted:
            stop_reason = "the filter refused the next noisy validation count"
    handle.detach()
    test_acc = _correct(model, test) / len(test.tensors[1])
    print(f"   stopped after {epochs} epochs: {stop_reason}; test accuracy {test_acc:.4f}\n")

    # 3. Report, plot, and what to report.
    print("3. report (privguard report " + db + ")\n")
    data = report(ledger)
    print_report(data)
    png = plot(ledger, os.path.splitext(db)[0] + ".png")
    eps, naive = ledger.epsilon(), ledger.nonadaptive_epsilon()
    claim = ledger.guarantee()
    print(f"\nplot: {png}\n")
    meter = ledger.budget()
    print(f"{str(meter)[:1].upper()}{str(meter)[1:]}: the filter admitted every charge with its meter "
          "within the target.\n")
    print(f"What to report: {claim}. It covers everything this run did with the private data — "
          f"the tuning (charged up front by the random-K theorem, {upper(plan.epsilon, '.3f')} on its "
          "own), every DP-SGD step of the final training, and the noisy validation counts that "
          "decided when to stop — although the learning rate and the stopping time were chosen "
          "from earlier results: the filter checked every charge before it ran. For an attacker: "
          f"{risk_sentence(claim.epsilon, claim.delta)}. The any-time ε "
          f"(odometer) is {upper(eps, '.3f')}: with probability ≥ 1 − {exact(DELTA)} the privacy loss is below "
          "it, at the moment the run stopped, without relying on the filter; it can exceed the "
          "target while the filter's guarantee holds, because it is a different statement (a "
          "tail bound for any stopping time), and reporting the smaller of the two after "
          "seeing both would hold only at 2δ. The naive conversion of "
          f"the spent curve ({upper(naive, '.3f')}, rounded up) assumes every choice was fixed in advance and is not "
          f"a guarantee for this run (docs/theory.md §3–4). ({time.time() - start:.0f} s)")
    return {"db": db, "png": png, "epsilon": eps, "guarantee": claim.epsilon,
            "naive_epsilon": naive, "tuning_epsilon": plan.epsilon, "selected_lr": lr,
            "final_epochs": epochs, "test_accuracy": test_acc, "charges": len(ledger.history),
            "quick": quick}
