"""Progress display: a tqdm bar on a terminal, plain lines anywhere else.

A tqdm bar redraws itself with carriage returns; written into a log file or a
pipe those become one long line of overwritten frames (task rd). On a stream
that is not a terminal this module writes whole lines instead: one per
``update`` when ``per_update`` is set (the demo's epochs), otherwise one when
the display closes. What a line shows is what the bar would have shown (its
description and postfix), so the callers' rules about what may be shown (never
a non-selected candidate, never a count of tuning runs) hold for both.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is an interactive terminal (False when it cannot say)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed or detached stream
        return False


class Lines:
    """The subset of tqdm's interface the callers use, written as whole lines."""

    def __init__(self, desc: str, total: int | None, unit: str, per_update: bool,
                 elapsed_only: bool, stream: TextIO) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.per_update, self.elapsed_only, self.stream = per_update, elapsed_only, stream
        self.n, self.postfix, self._start, self._closed = 0, "", time.monotonic(), False

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc and exc[0] is not None:  # what it would show did not run to its end
            self.discard()
        else:
            self.close()

    def set_description_str(self, desc: str) -> None:
        self.desc = desc

    def set_postfix_str(self, postfix: str) -> None:
        self.postfix = postfix

    def refresh(self) -> None:
        """Nothing: a line is written per update or at the close, never on a timer."""

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.per_update:
            self._write()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.per_update:
            self._write()

    def discard(self) -> None:
        """Close without writing: what was displayed did not run (a refused charge)."""
        self._closed = True

    def _write(self) -> None:
        from tqdm import tqdm

        if self.elapsed_only:  # the tuners' display: the elapsed time and nothing else
            text = f"{self.desc}: ran for {tqdm.format_interval(time.monotonic() - self._start)}"
        else:
            count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
            text = f"{self.desc}: {count} {self.unit}s" + (f", {self.postfix}" if self.postfix else "")
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader left: dropped, as tqdm does
            pass


def progress(desc: str, *, unit: str = "it", total: int | None = None, shown: bool = True,
             per_update: bool = False, elapsed_only: bool = False, **tqdm_kw: Any) -> Any:
    """A tqdm bar on a terminal (standard error) or in a notebook, :class:`Lines` elsewhere.

    ``shown=False`` gives a bar that shows nothing (tqdm's ``disable=True``).
    """
    from tqdm.auto import tqdm

    stream = sys.stderr
    if stream is None:  # no standard error at all (pythonw, a detached service): show nothing
        shown = False
    # inside Jupyter tqdm.auto is the notebook widget, which writes no carriage returns
    notebook = any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)
    if not shown or notebook or is_terminal(stream):
        return tqdm(desc=desc, total=total, unit=unit, disable=not shown, **tqdm_kw)
    return Lines(desc, total, unit, per_update, elapsed_only, stream)
