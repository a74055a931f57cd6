"""Print each benchmark's mean and its ratio to the Opacus entry of its group.

Usage: python benchmarks/report.py BENCHMARK_JSON
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    data = json.load(open(path))
    groups = defaultdict(list)
    for b in data["benchmarks"]:
        groups[b["group"]].append((b["name"], b["stats"]["mean"]))
    for group, rows in groups.items():
        ref = next((m for n, m in rows if "opacus" in n), None)
        print(f"\n{group}")
        for name, mean in rows:
            ratio = f"{mean / ref:8.3g}x Opacus" if ref else ""
            print(f"  {name:45s} {mean * 1e6:12.2f} us  {ratio}")


if __name__ == "__main__":
    main(sys.argv[1])
