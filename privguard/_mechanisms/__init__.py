"""Mechanisms: the protocol and registry, the RDP curve, the concrete mechanisms, the tuners' composite costs.

privguard 0.2 pickles name ``privguard._mechanisms.<class>``; this module
serves those names on first access and imports nothing until then.
Its modules are imported by their own paths, never through it.
"""

from typing import Any

_MOVED = ("Composed", "Gaussian", "Laplace", "PureDP", "SubsampledGaussian", "ZCDP",)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import privguard._mechanisms._mechanisms

        return getattr(privguard._mechanisms._mechanisms, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
