"""Letting go of a descriptor inherited through fork without freeing its number."""

from __future__ import annotations

import os


def over(fd: int) -> None:
    """Point ``fd`` at /dev/null (``dup2``, closed at exec): this process lets go of the
    file or socket it held, which another process may share (a forked parent's flock,
    its PostgreSQL session), without a word to it and without freeing the number, so
    nothing that still writes through it (a finaliser) reaches another file (review pgf)."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
