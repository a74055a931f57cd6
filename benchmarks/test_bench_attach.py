"""attach's cost on the issue-26 DP-SGD step (20-64-2 MLP, batch 128, one thread), in one run.

Plain Opacus (RDP accountant) against attach with an in-memory ledger, a SQLite file
(``lease=1``: a durable commit per step; the default: leases) and, when PostgreSQL's
server binaries are installed (tests/_pgserver.py), a PostgreSQL ledger (``lease=1``
and leases). Every variant is built once; each timed step of a variant that is not
``lease=1`` is preceded by one untimed step of every other such variant
(pytest-benchmark's ``setup``), so they alternate step by step and a loaded machine
slows them alike (the ``lease=1`` variants, a commit per step, run on their own: their
fsyncs would disturb the steps they precede). Ratios of
medians with benchmarks/report.py; each attach variant is also timed with its hook
inactive on its own model ("off"): the ratio on/off is attach's cost alone. The alternating-rounds table of
docs/performance.md comes from benchmarks/attach_overhead.py (same step).

Run: python -m pytest benchmarks/test_bench_attach.py --benchmark-only \
        --benchmark-json=bench_attach.json
     python benchmarks/report.py bench_attach.json
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]  # pytest's importlib mode
import attach_overhead  # noqa: E402
from attach_overhead import VARIANTS, make_step  # noqa: E402

POSTGRES = ["attach, PostgreSQL, lease=1", "attach, PostgreSQL, leases"]
ROUNDS = 300


def _postgres() -> bool:
    import _pgserver

    if _pgserver.binaries() is None:
        return False
    attach_overhead.PG["db"] = _pgserver.initialised_database()
    return True


@pytest.fixture(scope="module")
def steps():
    """Every variant's step, built once (a PostgreSQL server started if one can be)."""
    variants = list(VARIANTS)
    try:
        pg = _postgres()
    except Exception as exc:  # a server that cannot start: the table without it
        print(f"no PostgreSQL rows: {exc}")
        pg = False
    variants += POSTGRES if pg else []
    with tempfile.TemporaryDirectory() as tmp:
        made = {v: make_step(v, tmp) for v in variants}
        for step, _ in made.values():  # warm-up
            for _ in range(20):
                step()
        yield {v: step for v, (step, _) in made.items()}
        for _, ledger in made.values():
            if ledger is not None:
                ledger.close()
    if pg:
        import _pgserver

        _pgserver.stop()


def _hook_off(step):
    """``step`` on the same model, optimizer and tensors with attach's hook inactive (it
    only calls Opacus' own accountant hook, as plain Opacus does): the baseline that
    differs from ``step`` by attach's charge alone. Two separately built models differ
    in speed by more than what attach adds (their tensors sit elsewhere in memory)."""
    from privguard.integrations.opacus import _ATTACHED

    handle = _ATTACHED[step.optimizer]

    def off():
        handle._active = False
        try:
            step()
        finally:
            handle._active = True

    return off


@pytest.mark.parametrize("hook", ["on", "off"])
@pytest.mark.parametrize("variant", VARIANTS + POSTGRES)
def test_dp_sgd_step(benchmark, steps, variant, hook):
    if variant not in steps:
        pytest.skip("no PostgreSQL server binaries (tests/_pgserver.py)")
    if hook == "off" and variant == "plain Opacus":
        pytest.skip("plain Opacus has no hook")
    benchmark.group = "DP-SGD step, 20-64-2 MLP, batch 128, 1 thread (CPU)"
    others = [] if "lease=1" in variant else [
        s for v, s in steps.items() if v != variant and "lease=1" not in v]

    def interleave() -> None:  # one untimed step of every other variant before each timed one
        for other in others:
            other()

    step = steps[variant] if hook == "on" else _hook_off(steps[variant])
    benchmark.pedantic(step, setup=interleave, rounds=ROUNDS, iterations=1, warmup_rounds=5)
