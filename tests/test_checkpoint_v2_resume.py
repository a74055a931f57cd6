"""A checkpoint of curve version 2 or 3 is resumed from where no row before it describes a
mechanism whose curve changed since (task ckr; docs/theory.md §7, "Resuming from an older
checkpoint").

Raising ``CHECKPOINT_CURVES`` (review rpo) made every file and server ledger written before
replay its whole journal from the genesis in every process that opened it. Now such a
checkpoint is resumed from unless a row before it holds Poisson random-K tuning or a σ whose
2σ² overflows (the curves that changed), decided from the stored descriptions. The files
are written with today's code and checkpoints that say version 2 or 3 (``checkpoint_body``
reads ``CHECKPOINT_CURVES`` when it writes); whether a file was resumed from is seen in the
number of rows replayed on opening.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from test_sqlite import cli_verify

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._mechanisms import _base
from privguard._mechanisms import _repeat_select as R
from privguard._stores import _rows, _sqlite, open_store
from privguard._stores._rows import Cursor
from privguard.tuning import Geometric, Poisson

EVERY = _sqlite.CHECKPOINT_EVERY
RESUMED = 10  # at most: the checkpoint's last row, then the (at most 9) rows after it
DPSGD = [M.SubsampledGaussian(1.0 + i / 8, 0.01) for i in range(2)]
# task sg (curve version 6) changed the subsampled Gaussian for every older version: the
# rows that fill a file resumed from are Gaussian steps, the same floats since version 2
STEPS = [M.Gaussian(1.0 + i / 8) for i in range(2)]
TUNER = M.RepeatAndSelect(M.Gaussian(2.0), Poisson(0.5))
NESTED = M.Composed([M.Gaussian(3.0), TUNER])
HUGE_SIGMA = M.Gaussian(1e155)
# review lo3 changed SubsetTuning's value at an order a rounding error above an integer
SUBSET = M.SubsetTuning(M.RepeatAndSelect(M.Gaussian(2.0), Geometric(mean=3.0)),
                        M.Gaussian(3.0), 0.1)


def _charges(first=(), after=(), steps=STEPS):
    """Charges that write EVERY + 8 rows: ``first`` before the checkpoint at row EVERY,
    alternating rows of ``steps``, ``after`` after it."""
    out = [(m, "x") for m in first]
    out += [(steps[i % 2], "ab"[i % 2]) for i in range(EVERY + 4 - len(out))]
    out += [(m, "y") for m in after]
    out += [(steps[i % 2], "ab"[i % 2]) for i in range(EVERY + 8 - len(out))]
    return out


def _charge(ledger, charges):
    for mechanism, label in charges:
        ledger.charge(mechanism, label=label)


@contextlib.contextmanager
def _curve_version(version):
    saved = _rows.CHECKPOINT_CURVES
    _rows.CHECKPOINT_CURVES = version  # what checkpoint_body writes
    try:
        yield
    finally:
        _rows.CHECKPOINT_CURVES = saved


CONFIG = {"epsilon": 1e6, "delta": 1e-5}
HYBRID = {"epsilon": 10.0, "delta": 1e-5, "filter": "hybrid",
          "plan": M.SubsampledGaussian(1.0, 0.01, steps=1000)}


def _write(path, charges, version=2, config=CONFIG):
    with _curve_version(version):
        ledger = Ledger(**config, path=path)
        _charge(ledger, charges)
        ledger.close()


def _todays(charges, config=CONFIG):
    ledger = Ledger(**config)
    _charge(ledger, charges)
    return ledger.spent


@pytest.fixture
def replayed(monkeypatch):
    """The number of journal rows replayed since the test began (``_rows.replay_row``)."""
    calls = [0]
    real = _rows.replay_row

    def counting(*args, **kw):
        calls[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(_rows, "replay_row", counting)
    return calls


def _open(path, replayed, read_only):
    replayed[0] = 0
    ledger = Ledger.open(path, read_only=read_only)
    return ledger, replayed[0]


def _checkpoint_version(path):
    conn = sqlite3.connect(path)
    try:
        (snapshot,) = conn.execute("SELECT snapshot FROM checkpoints").fetchone()
    finally:
        conn.close()
    return json.loads(snapshot)["curves"]


@pytest.mark.parametrize("config", [CONFIG, HYBRID], ids=["rdp", "hybrid"])
@pytest.mark.parametrize("read_only", [True, False])
def test_a_version_2_file_of_unchanged_steps_is_resumed_from_its_checkpoint(
        tmp_path, replayed, read_only, config):
    """Gaussian steps are resumed from; a hybrid ledger's DP-SGD plan (and steps) changed in
    curve version 6 (task sg), so that file is replayed from the genesis instead."""
    path = str(tmp_path / "v2.db")
    charges = _charges() if config is CONFIG else _charges(steps=DPSGD)
    _write(path, charges, config=config)
    assert _checkpoint_version(path) == 2
    ledger, rows = _open(path, replayed, read_only)
    # task sr (curve version 7): no checkpoint of an older version is resumed from, its
    # spent totals summed to nearest (docs/theory.md §6); before, the Gaussian file was
    assert rows > EVERY
    assert np.array_equal(ledger.spent, _todays(charges, config))  # bit for bit a full replay
    # its snapshot within the revision up of the replay; a writable open writes a fresh
    # checkpoint after replaying (task ckw)
    fresh = not read_only
    assert cli_verify(path)["checkpoints"] == 1 + fresh
    if not read_only:
        ledger.charge(DPSGD[0], label="a")  # and it goes on charging
    ledger.close()


@pytest.mark.parametrize("first", [[TUNER], [NESTED], [HUGE_SIGMA], [SUBSET]],
                         ids=["poisson", "poisson-nested", "sigma-1e155", "subset"])
def test_a_version_2_file_whose_curves_changed_before_the_checkpoint_is_replayed(
        tmp_path, replayed, first):
    path = str(tmp_path / "v2.db")
    charges = _charges(first=first)
    _write(path, charges)
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY  # from the genesis
    assert np.array_equal(ledger.spent, _todays(charges))
    ledger.close()


@pytest.mark.parametrize("after", [[TUNER], [NESTED], [HUGE_SIGMA]],
                         ids=["poisson", "poisson-nested", "sigma-1e155"])
def test_a_changed_curve_only_after_the_checkpoint_is_replayed_with_todays_curve(
        tmp_path, replayed, after):
    """The rows after a checkpoint are replayed with today's curves, whatever its version:
    written with the old Poisson curve (main 4d526ef's, as tests/test_review_rpo.py stands
    it in), the file opens with today's."""
    path = str(tmp_path / "v2.db")
    charges = _charges(after=after)
    saved = R._poisson_bound, R._poisson_convex_bound
    R._poisson_bound = lambda orders, base, mean, dh: base + mean * dh + math.log(mean) / (orders - 1)
    R._poisson_convex_bound = lambda orders, base, mean: np.full_like(base, np.inf)
    _base._cached_curve.cache_clear()
    try:
        _write(path, charges)
    finally:
        R._poisson_bound, R._poisson_convex_bound = saved
        _base._cached_curve.cache_clear()
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY  # task sr (curve version 7): an older checkpoint is not resumed from
    assert np.array_equal(ledger.spent, _todays(charges))
    ledger.close()


def test_a_version_3_checkpoint_with_poisson_tuning_before_it_is_replayed(tmp_path):
    """a05d7b9 rounded the K = 0 bound up by 2⁻⁴⁸ after version 3 (67c2155): a version-3
    checkpoint written between them held the unrounded, lower Poisson totals and was
    resumed from (task ckr). μ = 300: the K = 0 bound is the smaller of the two there."""
    tuner = M.RepeatAndSelect(M.SubsampledGaussian(1.0, 0.01, steps=1000), Poisson(300.0))
    path = str(tmp_path / "v3.db")
    charges = _charges(first=[tuner])
    saved = R._poisson_bound
    R._poisson_bound = lambda orders, base, mean, dh: np.logaddexp(
        -mean, math.log(mean) + (orders - 1) * (base + mean * dh)) / (orders - 1)
    _base._cached_curve.cache_clear()
    try:
        _write(path, charges, version=3)
        old = Ledger(epsilon=1e6, delta=1e-5)
        _charge(old, charges)
        old_spent = old.spent
    finally:
        R._poisson_bound = saved
        _base._cached_curve.cache_clear()
    today = _todays(charges)
    assert (old_spent < today).any()  # what 67c2155 recorded: below today's curve
    ledger = Ledger.open(path, read_only=True)
    assert np.array_equal(ledger.spent, today)
    ledger.close()


def test_a_version_3_file_of_unchanged_steps_is_resumed_from(tmp_path, replayed):
    path = str(tmp_path / "v3.db")
    charges = _charges()
    _write(path, charges, version=3)
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY  # task sr (curve version 7): an older checkpoint is not resumed from
    assert np.array_equal(ledger.spent, _todays(charges))
    ledger.close()


def test_a_checkpoint_without_a_version_is_still_replayed(tmp_path, replayed):
    """Version 1 (no "curves", before e08c1f5; review rw) is never resumed from."""
    path = str(tmp_path / "v1.db")
    charges = _charges()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_rows, "checkpoint_body", lambda acc, last_kind: {
            "accounting": acc.snapshot(), "last_kind": last_kind})
        _write(path, charges)
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY
    ledger.close()


def _rewrite_checkpoint(path, edit):
    """The checkpoint's snapshot edited by ``edit`` and MAC'd again (an unkeyed file)."""
    store = open_store(path, read_only=True)
    store.open(None, None, None)
    store.close()
    conn = sqlite3.connect(path)
    try:
        entries, last_count, head, prev, snapshot = conn.execute(
            "SELECT entries, last_count, head, prev, snapshot FROM checkpoints").fetchone()
        snap = json.loads(snapshot)
        edit(snap)
        text = json.dumps(snap)
        mac = store._checkpoint_mac(Cursor(entries, last_count, head, prev, None), text)
        conn.execute("UPDATE checkpoints SET snapshot = ?, mac = ? WHERE entries = ?",
                     (text, mac, entries))
        conn.commit()
    finally:
        conn.close()


def test_verify_holds_a_version_2_checkpoint_to_the_replay_within_the_revision(tmp_path):
    """A version-2 checkpoint is never resumed from since curve version 7 (task sr): verify
    allows its totals below the replay by less than the revision tolerance, never above."""
    path = str(tmp_path / "v2.db")
    _write(path, _charges())
    assert cli_verify(path)["checkpoints"] == 1

    def scale(factor):
        def edit(snap):
            base = snap["accounting"]["journal"]["base"]
            snap["accounting"]["journal"]["base"] = [v * factor for v in base]
        return edit

    _rewrite_checkpoint(path, scale(1 - 1e-9))
    assert cli_verify(path)["checkpoints"] == 1
    _rewrite_checkpoint(path, scale((1 + 1e-6) / (1 - 1e-9)))
    with pytest.raises(LedgerStateError, match="does not match the replayed journal"):
        cli_verify(path)


def test_verify_accepts_a_version_2_checkpoint_of_a_changed_curve(tmp_path):
    path = str(tmp_path / "v2.db")
    _write(path, _charges(first=[HUGE_SIGMA]))
    assert cli_verify(path)["checkpoints"] == 1


def test_an_edited_row_before_a_version_2_checkpoint_is_refused_not_resumed(tmp_path):
    """A mechanism row before the checkpoint rewritten (its own digest made again, as
    anyone can in an unkeyed file) to a type privguard does not know: not resumed from,
    and the replay from the genesis refuses the file."""
    path = str(tmp_path / "v2.db")
    _write(path, _charges())
    store = open_store(path, read_only=True)
    store.open(None, None, None)
    store.close()
    body = json.dumps({"type": "Unknown", "params": {}})
    conn = sqlite3.connect(path)
    conn.execute("UPDATE mechanisms SET body = ?, digest = ? WHERE id = 1",
                 (body, store.integrity.digest("mechanism", body)))
    conn.commit()
    conn.close()
    with pytest.raises(LedgerStateError, match="journal row 1"):
        Ledger.open(path, read_only=True)


def test_a_version_2_checkpoint_whose_fixed_choices_differ_is_replayed(tmp_path, replayed):
    """Fixed choices that today's library does not derive from the fix row (a forged
    checkpoint, or a derivation that changed) are not resumed from: the replay decides."""
    path = str(tmp_path / "v2.db")
    charges = _charges()
    _write(path, charges)

    def forge(snap):
        weights = snap["accounting"]["fixed"]["odometer"]["weights"]
        weights[0] /= 2  # still valid weights (their sum below 1)

    _rewrite_checkpoint(path, forge)
    ledger, rows = _open(path, replayed, True)
    assert rows > EVERY
    ledger.close()


@pytest.mark.parametrize("data", [
    {"type": "Unknown", "params": {}},
    {"type": 3, "params": {}},
    {"type": "Gaussian", "params": {"noise_multiplier": float("inf")}},
    {"type": "Gaussian", "params": {"noise_multiplier": 1e151}},
    {"type": "Gaussian", "params": {"noise_multiplier": 10**400}},
    [{"step": TUNER.to_dict()}],
    {"plan": {"step": NESTED.to_dict(), "steps": None, "every": None}},
    SUBSET.to_dict(),
    # review al: the truncated negative binomial's bound was rounded up in curve version 5
    M.RepeatAndSelect(M.Gaussian(2.0), Geometric(mean=3.0)).to_dict(),
    {"type": "TruncatedNegativeBinomial", "params": {"eta": 1.0, "gamma": 0.1}},
    # task sg: the subsampled Gaussian and what is computed from it (curve version 6)
    M.SubsampledGaussian(1.0, 0.01).to_dict(),
    M.AccumulatedSubsampledGaussian(1.0, 0.01, 4).to_dict(),
    M.RepeatAndSelect(M.SubsampledGaussian(1.0, 0.01), Poisson(0.5)).to_dict(),
    M.Composed((M.Gaussian(2.0), M.SubsampledGaussian(1.0, 0.01))).to_dict(),
    # review radv8 (curve version 8): the Gaussian's α/(2σ²) and zCDP's ρα rounded up
    M.RandomAllocation(1.0, 100).to_dict(),
    M.Gaussian(1e149).to_dict(),
    M.Composed((M.Laplace(1.0), M.PureDP(0.5), M.ZCDP(0.1))).to_dict(),
])
def test_changed_fails_closed(data):
    from privguard._stores._resumable import changed

    assert changed(data)


@pytest.mark.parametrize("data", [
    M.Laplace(1e149).to_dict(),
    {"shares": {"type": "Concentrated", "params": {"share": 0.9, "order": None}},
     "base": [1e300, float("inf")]},
    M.Composed((M.Laplace(1.0), M.PureDP(0.5))).to_dict(),
])
def test_changed_passes_what_did_not_change(data):
    from privguard._stores._resumable import changed

    assert not changed(data)


def test_a_version_2_server_ledger_of_unchanged_steps_is_resumed_from(pg, replayed):
    import _pgserver

    server, db, name = pg
    url = server.url(_pgserver.OWNER, db, name)
    charges = _charges()
    _write(url, charges)
    ledger, rows = _open(url, replayed, False)
    assert rows > EVERY  # task sr (curve version 7): an older checkpoint is not resumed from
    assert np.array_equal(ledger.spent, _todays(charges))
    ledger.close()
    with_poisson = server.url(_pgserver.OWNER, db, name + "p")
    charges = _charges(first=[TUNER])
    _write(with_poisson, charges)
    ledger, rows = _open(with_poisson, replayed, False)
    assert rows > EVERY
    ledger.close()


OLD_FILE = Path(__file__).parent / "data" / "ledger-curves2-4d526ef.db"
"""Written by privguard 4d526ef (checkpoints of curve version 2) itself, not by today's code
told to say version 2 (review rckr): 530 charges with leases of 8 (``Ledger(epsilon=1e4,
delta=1e-5, lease=8)``), DP-SGD at five σ on labels r0-r2 and, every 23rd charge, one of
Laplace, PureDP, ZCDP, RepeatAndSelect(Gaussian, Geometric), Composed, an accumulated and
an allocated Gaussian and Gaussian(1e140); one checkpoint, at row 512 of 531."""


def _resumed_and_replayed(path, replayed, monkeypatch):
    ledger, rows = _open(path, replayed, True)
    resumed = (rows, ledger.state_dict(), ledger.spent_curve.epsilons, ledger.epsilon())
    ledger.close()
    with monkeypatch.context() as patch:
        patch.setattr(_rows, "_older_resumable", lambda *args: False)
        ledger, rows = _open(path, replayed, True)
    assert rows == 531  # replayed from the genesis
    replay = (ledger.state_dict(), ledger.spent_curve.epsilons, ledger.epsilon())
    ledger.close()
    return resumed, replay


def test_a_version_2_file_written_by_the_old_code_is_resumed_from_as_a_replay(tmp_path,
                                                                             replayed,
                                                                             monkeypatch):
    """The proof of docs/theory.md §7 ("Resuming from an older checkpoint") says the old
    code's snapshot equals today's replay of the same rows where no changed curve entered
    it; here it is checked on a file that code wrote. Its geometric tuner's curve was
    rounded up since (curve version 5, review al), and its DP-SGD rows' values raised
    (version 6, task sg), so counted as unchanged the file is resumed from, and the
    ledger's whole state and ε are those of a replay from the genesis save the tuner's and
    the DP-SGD share (1.4e-10 relative below at most; 1e-13 before task sg); as it is, the
    file is replayed from the genesis."""
    path = str(tmp_path / "old.db")
    shutil.copy(OLD_FILE, path)
    assert _checkpoint_version(path) == 2
    resumed, replay = _resumed_and_replayed(path, replayed, monkeypatch)
    assert resumed[0] == 531  # the geometric tuner before the checkpoint: replayed
    assert resumed[1] == replay[0]
    assert np.array_equal(resumed[2], replay[1]) and resumed[3] == replay[2]
    assert cli_verify(path)["checkpoints"] == 1  # the old snapshot within the revision
    # the premise, with the tuner and DP-SGD counted as unchanged: equal but for their
    # rounding-up (the tuner's) and task sg's raise (DP-SGD's), neither ever down
    monkeypatch.setattr(_rows, "changed", lambda data, version=2: False)
    monkeypatch.setattr(_rows, "RESUMABLE", frozenset({2}))  # none since version 7 (task sr)
    forced, replay = _resumed_and_replayed(path, replayed, monkeypatch)
    assert forced[0] <= 531 - 512 + 1  # the checkpoint's last row, then those after it
    old, new = np.asarray(forced[2]), np.asarray(replay[1])
    assert np.all(old <= new) and np.all(old >= new * (1 - 1e-9))
    assert forced[3] <= replay[2] <= forced[3] * (1 + 1e-9)
