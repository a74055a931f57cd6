"""Issue 27 item 2 under the frameworks' own DDP: random allocation with Lightning's
``strategy="ddp"`` and the Hugging Face Trainer, 2 CPU processes over gloo, launched as
torchrun launches them (tests/_framework_ddp_worker.py).

Each epoch of a DistributedRandomAllocationSampler loader is charged once for all ranks
(once per distinct ledger: one row in a shared file), before its first step, with the same
decision on every rank: the ranks' shares of each step partition the records, the epoch the
ledger refuses is foreseen on every rank alike and none of it runs, the models stay equal.
Where a framework re-deals the batches (Lightning's default ``use_distributed_sampler=True``,
accelerate's ``prepare``) the fit is refused by name before anything is charged.

Slow (two fresh interpreters importing torch, Lightning or transformers, about 30 s a
launch): run with CI=true or PRIVGUARD_SLOW=1, skipped otherwise.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import _framework_ddp_worker as W
import pytest

from privguard import Ledger
from privguard import mechanisms as M

dist = pytest.importorskip("torch.distributed")
pytestmark = [
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                       reason="torch.distributed with gloo is not available"),
    pytest.mark.skipif(os.environ.get("CI") != "true" and os.environ.get("PRIVGUARD_SLOW") != "1",
                       reason="slow (2-process DDP runs of Lightning / transformers): set "
                              "PRIVGUARD_SLOW=1 (always run in CI)"),
]
TIMEOUT = 300.0  # seconds for one 2-rank launch (imports included); a hang fails the test
EPOCH = M.RandomAllocation(W.SIGMA, W.T)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, workdir: str, epsilon: float) -> list[dict]:
    """Run ``scenario`` on 2 ranks with torchrun's environment; each rank's result."""
    port, procs = _free_port(), []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                   RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", GROUP_RANK="0",
                   NODE_RANK="0", TORCHELASTIC_RUN_ID="privguard-test", CUDA_VISIBLE_DEVICES="",
                   PYTHONPATH=os.pathsep.join(sys.path))
        out = os.path.join(workdir, f"rank{rank}.json")
        procs.append((subprocess.Popen(
            [sys.executable, W.__file__, scenario, workdir, repr(epsilon), out], env=env,
            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), out))
    results = []
    try:
        for proc, out in procs:
            try:
                log = proc.communicate(timeout=TIMEOUT)[0].decode(errors="replace")
            except subprocess.TimeoutExpired:
                pytest.fail(f"a DDP rank did not finish within {TIMEOUT:.0f} s (a hang)")
            if not os.path.exists(out):
                pytest.fail(f"a rank died without a result (exit {proc.returncode}):\n{log[-4000:]}")
            with open(out) as fh:
                result = json.load(fh)
            assert "error" not in result, result["error"]
            results.append(result["ok"])
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
    return results


def _two_epochs() -> float:
    """A target ε whose filter admits exactly two epochs."""
    return next(e for e in [0.5 + 0.05 * i for i in range(400)]
                if Ledger(e, W.DELTA).remaining(EPOCH).repeats == 2)


def _check_allocation_run(ranks: list[dict]) -> None:
    """Two epochs ran on both ranks, the third foreseen refused alike; the shares of each
    step partition the records; the models are equal."""
    t = W.T
    for run in ranks:
        assert run["raised"] is None
        assert run["global_step"] == 2 * t and len(run["shares"]) == 2 * t
        assert run["should_stop"]
    assert ranks[0]["params"] == ranks[1]["params"]
    for e in range(2):
        epoch = [v for i in range(t) for r in ranks for v in r["shares"][e * t + i]]
        assert sorted(epoch) == list(range(W.N))  # every record in one step of the epoch
        for i in range(t):
            assert not set(ranks[0]["shares"][e * t + i]) & set(ranks[1]["shares"][e * t + i])


def test_lightning_ddp_charges_each_epoch_once_for_all_ranks_and_refuses_resampling(tmp_path):
    eps = _two_epochs()
    shared = str(tmp_path / "shared.db")
    Ledger(eps, W.DELTA, path=shared).close()  # created before the ranks open it
    ranks = launch("lightning", str(tmp_path), eps)
    _check_allocation_run([r["allocation"] for r in ranks])
    assert len(Ledger.open(shared).history) == 2  # one row per epoch, not one per rank
    assert [r.mechanism for r in Ledger.open(shared).history] == [EPOCH] * 2
    assert ranks[0]["allocation"]["charging_pids"] == 1  # only one rank charged the file
    for r in ranks:
        # Lightning's default would put its DistributedSampler into the loader: refused by
        # name at setup, before Lightning reads a loader, nothing charged
        refused = r["default_sampler"]
        assert (refused["raised"], refused["argument"]) == ("NonPoissonSamplingError",
                                                            "use_distributed_sampler")
        assert "use_distributed_sampler=False" in refused["message"]
        assert "DistributedRandomAllocationSampler" in refused["message"]
        assert refused["journal"] == []
        plain = r["plain"]  # a RandomAllocationSampler per rank: its own allocation each
        assert plain["raised"] == "InvalidArgumentError" and plain["journal"] == []
        assert "each rank would draw its own allocation" in plain["message"]


def test_huggingface_ddp_charges_each_epoch_once_per_replica_and_refuses_accelerate_sharding(
        tmp_path):
    ranks = launch("huggingface", str(tmp_path), _two_epochs())
    _check_allocation_run([r["allocation"] for r in ranks])
    for r in ranks:
        assert r["allocation"]["journal"] == [EPOCH.to_dict()] * 2  # each replica, once each
        prepared = r["prepared"]  # accelerate's BatchSamplerShard re-deals the batches
        assert prepared["raised"] == "NonPoissonSamplingError" and prepared["journal"] == []
        assert "re-batches a DistributedRandomAllocationSampler" in prepared["message"]
        assert "without accelerator.prepare" in prepared["message"]
