"""Task lo5, item 4: does a hybrid ledger whose plan step is a k-step curve reload?

    PYTHONPATH=. python scripts/lo5_hybrid_reload_scan.py [SIGMA Q EPS,EPS,...]

For each target ε, k ∈ {1, 3, 7}, plan horizon T ∈ {None, 50} and one or two alternating
labels (two: one journal row per charge, so files past 512 rows hold checkpoints), it builds
``Ledger(epsilon=ε, delta=1e-5, filter="hybrid", plan=Plan(step, steps=T), path=...)`` for
three plan steps — ``SubsampledGaussian(σ, q, steps=k)``, ``RDPCurve * k`` of one step and
``Composed`` of k steps — charges the step until the ledger refuses (through part A's T_A and
on into part B), then reloads it from its ``state_dict`` and from its file. It prints every
reload that was refused or whose hybrid state (part A's count, alive, T_A) differs, then
``bad N of M``. (The ``RDPCurve`` and ``Composed`` plans declare no envelope: their ledgers
hold the RDP filter, and only the reload is checked.)
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

import numpy as np

from privguard import DEFAULT_ORDERS, BudgetExhausted, Ledger, LedgerStateError, Plan, RDPCurve
from privguard import mechanisms as M


def _steps(sigma: float, q: float, k: int) -> list[tuple[str, object]]:
    one = M.SubsampledGaussian(sigma, q)
    curve = RDPCurve(DEFAULT_ORDERS, one.rdp(np.array(DEFAULT_ORDERS)))
    return [("SubsampledGaussian", M.SubsampledGaussian(sigma, q, steps=k)),
            ("RDPCurve", curve * k), ("Composed", M.Composed((one,) * k))]


def _state(ledger: Ledger) -> tuple:
    flt = ledger._acc.filter
    return tuple(getattr(flt, name, None) for name in ("a_count", "a_alive", "steps_a"))


def main(sigma: float, q: float, epsilons: list[float]) -> int:
    bad = tried = 0
    folder = tempfile.mkdtemp()
    for eps in epsilons:
        for k in (1, 3, 7):
            for name, step in _steps(sigma, q, k):
                for horizon in (None, 50):
                    for labels in (1, 2):
                        tried += 1
                        path = os.path.join(folder, f"l{tried}.db")
                        ledger = Ledger(epsilon=eps, delta=1e-5, filter="hybrid",
                                        plan=Plan(step, steps=horizon), path=path)
                        n = 0
                        while n < 20_000:
                            try:
                                ledger.charge(step, label=str(n % labels))
                            except BudgetExhausted:
                                break
                            n += 1
                        before, state = _state(ledger), ledger.state_dict()
                        ledger.close()
                        for how, load in (("state_dict", lambda: Ledger.load_state_dict(state)),
                                          ("file", lambda: Ledger.open(path))):
                            try:
                                after: object = _state(load())
                            except LedgerStateError as exc:
                                after = f"refused: {exc}"
                            if after != before:
                                bad += 1
                                print(f"MISMATCH {how} ε={eps} {name} k={k} T={horizon} "
                                      f"labels={labels} charges={n}: {before} -> {after}")
        print(f"ε={eps}: {tried} ledgers so far", flush=True)
    print(f"bad {bad} of {tried}")
    return 1 if bad else 0


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    args = sys.argv[1:] or ["1.0", "0.01", "1.5,3.0"]
    sys.exit(main(float(args[0]), float(args[1]), [float(x) for x in args[2].split(",")]))
