"""The first open of a file whose checkpoints are of an older curve version (task ckr).

    python benchmarks/old_checkpoint_open.py [--rows 1100]

Writes a file of ``--rows`` charges of ``SubsampledGaussian(1.0 + i·10⁻⁴, 0.001)`` (every
row a new σ, so every row replayed computes a new curve) with today's code and
checkpoints that say curve version 2 (``_rows.CHECKPOINT_CURVES`` set to 2 while it is
written, as tests/test_checkpoint_v2_resume.py does: ``checkpoint_body`` reads it). A second
file of the same charges gets checkpoints without ``"curves"`` (version 1, before
docs/theory.md §1.1's revision: never resumed from; ``checkpoint_body`` wrapped while it is
written). Each file is then
opened read-only in a fresh process (no curve cached), ``Ledger.open`` then ``epsilon()``
timed, and the journal rows replayed on opening counted (``_rows.replay_row``): the
version-2 file is resumed from its newest checkpoint (docs/theory.md §7, "Resuming from an
older checkpoint"), the version-1 file replays every row. Both must give the same ε.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile

from privguard import Ledger
from privguard import mechanisms as M
from privguard._stores import _rows

OPEN = """
import sys, time
from privguard import Ledger
from privguard._stores import _rows
replayed = [0]
replay_row = _rows.replay_row
def counting(*args, **kwargs):
    replayed[0] += 1
    return replay_row(*args, **kwargs)
_rows.replay_row = counting
t = time.perf_counter()
ledger = Ledger.open(sys.argv[1], read_only=True)
eps = ledger.epsilon()
seconds = time.perf_counter() - t
ledger.close()
print(repr(seconds), replayed[0], repr(eps))
"""


def write(path: str, rows: int, curves: bool) -> None:
    """The file, its checkpoints of curve version 2, or without ``"curves"`` (version 1)."""
    saved, body = _rows.CHECKPOINT_CURVES, _rows.checkpoint_body
    _rows.CHECKPOINT_CURVES = 2  # what checkpoint_body writes

    def without_curves(acc, last_kind):
        out = body(acc, last_kind)
        del out["curves"]
        return out

    if not curves:
        _rows.checkpoint_body = without_curves
    try:
        ledger = Ledger(delta=1e-5, path=path)
        for i in range(rows):
            ledger.charge(M.SubsampledGaussian(1.0 + i * 1e-4, 0.001), label=f"r{i % 7}")
        ledger.close()
    finally:
        _rows.CHECKPOINT_CURVES, _rows.checkpoint_body = saved, body


def checkpoints(path: str) -> list:
    conn = sqlite3.connect(path)
    try:
        return [json.loads(s).get("curves") for (s,) in conn.execute(
            "SELECT snapshot FROM checkpoints ORDER BY entries")]
    finally:
        conn.close()


def first_open(path: str) -> tuple[float, int, float]:
    out = subprocess.run([sys.executable, "-c", OPEN, path], check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]), int(out[1]), float(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        v2, v1 = os.path.join(tmp, "v2.db"), os.path.join(tmp, "v1.db")
        write(v2, args.rows, True)
        write(v1, args.rows, False)  # the same charges (their curves cached by now)
        assert checkpoints(v1) == [None] * len(checkpoints(v2)) and set(checkpoints(v2)) == {2}
        print(f"{args.rows} distinct-σ charges ({args.rows + 1} rows, the fix row first), "
              f"{len(checkpoints(v2))} checkpoints; first open in a fresh process (load average "
              f"{os.getloadavg()[0]:.1f})")
        results = {}
        for name, path in (("version 2 (resumed from its newest checkpoint)", v2),
                           ("version 1 (never resumed from: replayed)", v1)):
            seconds, replayed, eps = results[name] = first_open(path)
            print(f"  {name}: {seconds:.2f} s, {replayed} rows replayed, ε = {eps!r}")
        epsilons = {eps for _, _, eps in results.values()}
        assert len(epsilons) == 1, f"the two opens disagree: {epsilons}"


if __name__ == "__main__":
    main()
