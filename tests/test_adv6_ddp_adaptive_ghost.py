"""The DDP refusal of Opacus' adaptive ghost clipping (task adv6 (e); review radv3's check).

Under DDP the refusal of a step whose noise was drawn at ``_adjusted_noise_multiplier``
runs inside the step's collective (``AttachHandle._rank_checks``), so a rank that refuses
stops every rank before any charge: two gloo ranks on CPU (tests/_ddp_worker.py).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("opacus")
dist = pytest.importorskip("torch.distributed")
pytestmark = [
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                       reason="torch.distributed with gloo is not available"),
    pytest.mark.skipif(os.environ.get("CI") != "true" and os.environ.get("PRIVGUARD_SLOW") != "1",
                       reason="a 2-rank launch: run with CI=true or PRIVGUARD_SLOW=1 (always in CI)")]


def test_adaptive_ghost_clipping_under_ddp_is_refused_on_every_rank(tmp_path):
    import test_ddp

    for r in test_ddp.launch("ghost_adaptive", str(tmp_path), 50.0):
        assert r["refused"][0] == "InvalidArgumentError"
        assert r["unchanged"][0] and r["charged"] == r["history"] == 0


def test_an_adjusted_noise_multiplier_on_one_rank_is_refused_on_both(tmp_path):
    import test_ddp

    r0, r1 = test_ddp.launch("ghost_adjusted_rank_1", str(tmp_path), 50.0)
    assert r1["refused"] == [None, "InvalidArgumentError", None]
    assert r0["refused"][1] is not None and r0["refused"][::2] == [None, None]
    for r in (r0, r1):
        assert r["unchanged"] == [False, True, False]
        assert r["charged"] == r["history"] == 2
