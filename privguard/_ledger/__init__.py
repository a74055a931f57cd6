"""The façade: the Ledger (decide-and-apply under one lock), its queries, listeners and state.

privguard 0.2 pickles name ``privguard._ledger.<class>``; this module
serves those names on first access and imports nothing until then.
Its modules are imported by their own paths, never through it.
"""

from typing import Any

_MOVED = ("Ledger",)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import privguard._ledger._ledger

        return getattr(privguard._ledger._ledger, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
