"""Print each benchmark's median and mean, and the ratio of its median to its group's
reference entry, all from one pytest-benchmark run; for a ``-on``/``-off`` pair (attach's
hook on and off on the same model: benchmarks/test_bench_attach.py), their ratio.

The reference of a group is its plain Opacus entry (a name containing "opacus", any
case, and no "privguard" or "attach"), else its "in memory" entry. Medians: on a shared
machine the median of a step's times is what a load spike moves least.

Usage: python benchmarks/report.py BENCHMARK_JSON
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def _reference(rows: list[tuple[str, float, float]]) -> float | None:
    for test in (lambda n: "opacus" in n and "privguard" not in n and "attach" not in n,
                 lambda n: "in memory" in n):
        found = [med for name, med, _ in rows if test(name.lower())]
        if found:
            return found[0]
    return None


def main(path: str) -> None:
    data = json.load(open(path))
    machine = data.get("machine_info", {})
    print(f"{machine.get('cpu', {}).get('brand_raw', '?')}, "
          f"{machine.get('cpu', {}).get('count', '?')} cores; {data.get('datetime', '')}")
    groups = defaultdict(list)
    for b in data["benchmarks"]:
        groups[b["group"]].append((b["name"], b["stats"]["median"], b["stats"]["mean"]))
    for group, rows in groups.items():
        ref = _reference(rows)
        print(f"\n{group}")
        print(f"  {'':55s} {'median':>12s} {'mean':>12s}  ratio of medians")
        off = {name.replace("-off]", "]"): med for name, med, _ in rows if name.endswith("-off]")}
        for name, med, mean in rows:
            ratio = f"{med / ref:7.3f}x" if ref else ""
            base = off.get(name.replace("-on]", "]"))
            if base is not None and name.endswith("-on]"):  # the same model, hook off
                ratio += f"   on/off {med / base:7.3f}x (mean {mean / _mean(rows, name):7.3f}x)"
            print(f"  {name:55s} {med * 1e6:9.1f} us {mean * 1e6:9.1f} us  {ratio}")


def _mean(rows: list[tuple[str, float, float]], name: str) -> float:
    """The mean of ``name``'s hook-off twin."""
    twin = name.replace("-on]", "-off]")
    return next(mean for n, _, mean in rows if n == twin)


if __name__ == "__main__":
    main(sys.argv[1])
