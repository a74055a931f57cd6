"""privguard: the privacy-budget layer for differentially private training.

Every private computation is charged to a :class:`Ledger`, which holds a
hard (ε, δ) budget (a filter that refuses before anything is released) and a
running ε that stays valid under adaptive choices and early stopping (an
odometer), over a grid of Rényi orders.

Example:
    >>> from privguard import Ledger, mechanisms as M
    >>> ledger = Ledger(epsilon=8.0, delta=1e-5)
    >>> _ = ledger.charge(M.SubsampledGaussian(noise_multiplier=1.1, sample_rate=0.004))
    >>> ledger.epsilon() < 8.0
    True
"""

from privguard import mechanisms
from privguard._accounting._budget import Budget
from privguard._accounting._deviation import PlanDeviationWarning
from privguard._accounting._journal import ChargeRecord, History, Run
from privguard._accounting._odometer import MIXTURE, PAPER, TIGHT, Odometer
from privguard._accounting._plan import Plan
from privguard._accounting._results import Guarantee, LedgerEvent, Remaining
from privguard._accounting._shares import Concentrated, DeltaShares, Explicit, Uniform, single_order
from privguard._curves._conversion import CLASSIC, IMPROVED
from privguard._curves._orders import DEFAULT_ORDERS
from privguard._errors import (
    BudgetExhausted,
    InvalidArgumentError,
    LedgerStateError,
    PipelineMismatchError,
    PrivguardError,
    SchemaUpgradeWarning,
    UnknownMechanismError,
)
from privguard._ledger._ledger import Ledger
from privguard._mechanisms._curve import RDPCurve
from privguard.integrations._sampling import NonPoissonSamplingError
from privguard.mechanisms import Mechanism, mechanism_from_dict

#: Names whose module imports Opacus (and torch): loaded on first access only.
_LAZY = {"AccountantWarning": "privguard.integrations.opacus"}


def __getattr__(name: str):
    """``privguard.AccountantWarning``: imported from the Opacus integration on first use."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'privguard' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


# 0.2 writes ledger files of schema 2; files of privguard 0.1 (schema 1) need
# `privguard upgrade`. Read by setuptools for the package's metadata.
__version__ = "0.2.0.dev0"

__all__ = [
    "CLASSIC",
    "DEFAULT_ORDERS",
    "IMPROVED",
    "MIXTURE",
    "PAPER",
    "TIGHT",
    "Budget",
    "BudgetExhausted",
    "ChargeRecord",
    "Concentrated",
    "DeltaShares",
    "Explicit",
    "Guarantee",
    "History",
    "InvalidArgumentError",
    "Ledger",
    "LedgerEvent",
    "LedgerStateError",
    "Mechanism",
    "NonPoissonSamplingError",
    "Odometer",
    "PipelineMismatchError",
    "Plan",
    "PlanDeviationWarning",
    "PrivguardError",
    "RDPCurve",
    "Remaining",
    "Run",
    "SchemaUpgradeWarning",
    "Uniform",
    "UnknownMechanismError",
    "mechanism_from_dict",
    "mechanisms",
    "single_order",
]

# privguard 0.2 pickles name private paths that moved (issue 30)
from privguard import _moved  # noqa: E402

_moved.install()
