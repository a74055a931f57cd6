"""benchmarks/lease_commit_cost.py counts the SQL statements each lease commit runs (task
lo6): its column printed 6.03 where a commit runs 5 (docs/performance.md, "The schema
cookie in the one read"): it counted the nested ``-- PRAGMA schema_version`` line of the
one read, and the refused charge's and the close's statements after the budget ran out."""

from __future__ import annotations

import importlib
import statistics
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_script_counts_each_commits_own_statements(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    script = importlib.import_module("lease_commit_cost")
    commits, steps, statements = script.run(str(tmp_path / "c.db"), "OFF")
    assert len(statements) == len(commits) > 2 and steps
    assert statistics.median(statements) == 5  # BEGIN, the read, two UPDATEs, COMMIT
    # the first commit writes the mechanism's row; the one where σ changes, the old
    # lease's lease-unused event and the new mechanism's row
    assert statements[0] == 8
    assert sorted(statements)[-2:] == [8, 9] and statements.count(5) == len(statements) - 2
