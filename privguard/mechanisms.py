"""Mechanisms privguard can charge: frozen value objects with an RDP curve.

Every mechanism has ``rdp(orders) -> numpy.ndarray`` and ``to_dict()``;
:func:`mechanism_from_dict` rebuilds one from its dict.
"""

from privguard._mechanisms._accumulated import AccumulatedSubsampledGaussian
from privguard._mechanisms._allocation import RandomAllocation
from privguard._mechanisms._base import Mechanism, mechanism_from_dict
from privguard._mechanisms._curve import RDPCurve
from privguard._mechanisms._mechanisms import (
    ZCDP,
    Composed,
    Gaussian,
    Laplace,
    PureDP,
    SubsampledGaussian,
)
from privguard._mechanisms._repeat_select import DPHyPO, RepeatAndSelect
from privguard._mechanisms._reserve import DeltaReserve
from privguard._mechanisms._subset import SubsetTuning

__all__ = [
    "ZCDP",
    "AccumulatedSubsampledGaussian",
    "Composed",
    "DPHyPO",
    "DeltaReserve",
    "Gaussian",
    "Laplace",
    "Mechanism",
    "PureDP",
    "RDPCurve",
    "RandomAllocation",
    "RepeatAndSelect",
    "SubsampledGaussian",
    "SubsetTuning",
    "mechanism_from_dict",
]
