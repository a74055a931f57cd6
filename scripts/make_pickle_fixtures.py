"""Write tests/data/*-0.2.pickle: objects pickled by privguard 0.2 (issue 30, item 4).

A pickle names the module of every class in it (``privguard._ledger._ledger.Ledger`` in 0.2), so
these files pin the private paths a user's checkpoint may hold; tests/test_pickle_compat.py
unpickles them with the current code. The fixtures were made by running this script on the
commit that added it (privguard 0.2.0.dev0, before the layout of issue 30):

    python scripts/make_pickle_fixtures.py

It refuses to run on another version, so the files always say where they came from. The
numbers the test compares with are stored beside them in tests/data/pickles-0.2.json.
"""
from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import privguard
from privguard import Ledger
from privguard import mechanisms as M

OUT = Path(__file__).resolve().parent.parent / "tests" / "data"
PROTOCOL = 4  # Python 3.8+'s default: what a framework checkpoint holds


def _ledger() -> Ledger:
    ledger = Ledger(epsilon=8.0, delta=1e-5)
    for _ in range(3):
        ledger.charge(M.SubsampledGaussian(1.1, 0.01), label="step")
    ledger.charge(M.Gaussian(5.0), label="release")
    return ledger


def main() -> int:
    if privguard.__version__ != "0.2.0.dev0":
        print(f"made by privguard 0.2.0.dev0, not {privguard.__version__}", file=sys.stderr)
        return 1
    from privguard.integrations.huggingface import LedgerTrainerCallback
    from privguard.integrations.lightning import LedgerCallback
    from privguard.tuning import Poisson, RandomSearch

    objects = {"ledger": _ledger(), "lightning-callback": LedgerCallback(_ledger()),
               "huggingface-callback": LedgerTrainerCallback(_ledger())}
    tuning_ledger = Ledger(epsilon=30.0, delta=1e-5)
    tuner = RandomSearch({"lr": [0.1, 0.2, 0.3]}, Poisson(3.0),
                         cost=M.SubsampledGaussian(1.0, 0.01, steps=10), seed=7, progress=False)
    objects["tuning-result"] = tuner.run(lambda params, child: params["lr"], tuning_ledger)
    expected = {}
    for name, obj in objects.items():
        (OUT / f"{name}-0.2.pickle").write_bytes(pickle.dumps(obj, protocol=PROTOCOL))
        ledger = getattr(obj, "ledger", obj)
        if isinstance(ledger, Ledger):
            expected[name] = {"epsilon": ledger.epsilon(), "charges": len(ledger.history)}
        else:
            expected[name] = {"selected": obj.selected, "params": obj.params,
                              "score": obj.score, "seeded": obj.seeded,
                              "cost": obj.cost.to_dict()}
    (OUT / "pickles-0.2.json").write_text(json.dumps(expected, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
