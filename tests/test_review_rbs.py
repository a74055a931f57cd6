"""Review rbs of sweep bs (bad input, fail closed): each test fails on bs's code (5c43a2e)."""

from __future__ import annotations

import os

import pytest

from privguard import Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._accounting import _lease
from privguard._accounting._accounting import Change
from privguard._stores import _sqlite

STEP = M.SubsampledGaussian(1.0, 0.01)


def _write_unused(ledger: Ledger, steps: int, label: str | None) -> None:
    """A lease-unused row written to the file as privguard's writer writes it (what a bug,
    or a forger recomputing the unkeyed chain, produces), without the in-memory checks."""
    body = {"event": _lease.UNUSED, "steps": steps, "mechanism": STEP.to_dict(),
            "label": label, "pid": os.getpid(), "reason": "close", "time": 0.0}
    with ledger._synced(write=True) as txn:
        txn.write(ledger._acc, [Change("event", body=body)])


def _checkpointed(path, monkeypatch) -> None:
    """A file ledger of 10 charges in 10 runs with checkpoints, the last one near its end."""
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 4)
    ledger = Ledger(8.0, 1e-5, path=path, lease=1)
    for i in range(10):
        ledger.charge(STEP, label=f"l{i % 3}")
    ledger.close()


@pytest.mark.parametrize("read_only", [False, True])
def test_remainders_after_a_checkpoint_beyond_the_charges_are_refused(tmp_path, monkeypatch,
                                                                       read_only):
    # On bs's code a journal resumed from a checkpoint checked each lease-unused row after
    # it alone (steps <= charges): three rows of 10 steps on 10 charges opened, with
    # leased_unused 30 (released steps -20), though bs refuses the same rows inside the
    # checkpoint, and `privguard verify` refuses the file.
    path = tmp_path / "t.db"
    _checkpointed(path, monkeypatch)
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 10**6)  # the rows stay after it
    ledger = Ledger.open(path, lease=1)
    assert ledger._acc.journal.runs_before > 0  # resumed from the checkpoint
    for _ in range(3):
        _write_unused(ledger, 10, "l0")
    ledger.close()
    with pytest.raises(LedgerStateError, match="lease-unused"):
        Ledger.open(path, read_only=read_only)


def test_honest_remainders_after_a_checkpoint_still_open(tmp_path, monkeypatch):
    path = tmp_path / "h.db"
    _checkpointed(path, monkeypatch)
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 10**6)
    for label in ("b", "c", "a"):
        ledger = Ledger.open(path, prefetch=False)
        for _ in range(3):
            ledger.charge(STEP, label=label)
        ledger.close()  # a lease-unused row after the checkpoint
    ledger = Ledger.open(path)
    assert ledger._acc.journal.runs_before > 0
    assert 0 < ledger.leased_unused <= len(ledger.history)
    ledger.close()


def _held_cases():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    return {"numpy": [(np.float64(1.0), np.float32(0.25), np.int64(1))],
            "numpy 0-d": [(np.array(1.0), np.array(0.25), np.array(1))],
            "torch": [(torch.tensor(1.0), torch.tensor(0.25), torch.tensor(1))],
            "integer σ": [(1, 0.25, 1)], "tuple": ((1.0, 0.25, 1),), "empty": []}


@pytest.mark.parametrize("case", ["numpy", "numpy 0-d", "torch", "integer σ", "tuple",
                                  "empty"])
def test_an_accountant_history_of_numpy_or_torch_numbers_still_resumes(case):
    # On bs's code a checkpoint entry's accountant_history had to hold Python floats and
    # ints exactly: numpy or torch numbers, which the resume read (and main accepted),
    # were refused as a malformed entry.
    from _tiny_opacus import private_linear

    _, opt, _ = private_linear("rdp")  # (skips without torch or Opacus)
    from privguard.integrations._checkpoint import ledger_entry
    from privguard.integrations.opacus import attach

    saved = Ledger(100.0, 1e-5)
    saved.charge(M.SubsampledGaussian(1.0, 0.25), label="step")
    entry = ledger_entry(saved, [])
    entry["accountant_history"] = _held_cases()[case]
    ledger = Ledger(100.0, 1e-5)
    attach(opt, ledger, resume=entry, check_poisson=False)
    assert len(ledger.history) == 1


@pytest.mark.parametrize("held", [[(1.0, 0.25, True)], [("1.0", 0.25, 1)],
                                  [(1.0, 0.25, 1.5)], [(1.0, float("inf"), 1)]], ids=repr)
def test_an_accountant_history_of_other_values_is_still_refused(held):
    from privguard.integrations._checkpoint import ledger_entry, restore

    entry = ledger_entry(Ledger(100.0, 1e-5), [])
    entry["accountant_history"] = held
    with pytest.raises(LedgerStateError, match="accountant_history"):
        restore(Ledger(100.0, 1e-5), entry, where="resume")


def _spent_cases():
    from fractions import Fraction

    np = pytest.importorskip("numpy")
    return {"a string among Fractions": [Fraction(1, 10), "0.1", 0.1],
            "bytes among Fractions": [Fraction(1, 10), b"0.1", 0.1],
            "an object array with a string": np.array([Fraction(1, 10), "0.1", 0.1],
                                                      dtype=object),
            "a bool among floats": [True, 0.2, 0.3],
            "a numpy bool among floats": [np.bool_(True), 0.2, 0.3],
            "a bool row": [[0.1, 0.2, 0.3], [True, False, True]]}


_ONE_CURVE = ["a string among Fractions", "bytes among Fractions",
              "an object array with a string", "a bool among floats",
              "a numpy bool among floats"]


# "a bool row" is two rows: a batch only (as one curve it was refused for its shape before)
@pytest.mark.parametrize(("case", "batch"), [(c, b) for c in _ONE_CURVE for b in (False, True)]
                         + [("a bool row", True)])
def test_odometer_spent_with_a_string_or_bool_among_numbers_is_refused(case, batch):
    # On bs's code an array of strings or bools alone was refused, but numpy read one
    # beside numbers ("0.1" as 0.1, True as 1.0) and the bound was computed.
    from privguard import InvalidArgumentError, Odometer

    odometer = Odometer([2.0, 4.0, 8.0])
    with pytest.raises(InvalidArgumentError, match="spent"):
        (odometer.epsilon_batch if batch else odometer.epsilon)(_spent_cases()[case], 1e-5)


def test_odometer_spent_a_tensor_that_requires_grad_is_refused_not_runtimeerror():
    # On bs's code: RuntimeError ("Can't call numpy() on Tensor that requires grad").
    torch = pytest.importorskip("torch")
    from privguard import InvalidArgumentError, Odometer

    spent = torch.tensor([0.1, 0.2, 0.3], requires_grad=True)
    with pytest.raises(InvalidArgumentError, match="spent"):
        Odometer([2.0, 4.0, 8.0]).epsilon(spent, 1e-5)


def test_odometer_spent_numbers_of_every_kind_are_still_read():
    from decimal import Decimal
    from fractions import Fraction

    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    from privguard import Odometer

    odometer = Odometer([2.0, 4.0, 8.0])
    want = odometer.epsilon([0.25, 0.5, 0.75], 1e-5)
    for spent in ([Fraction(1, 4), Decimal("0.5"), 0.75], torch.tensor([0.25, 0.5, 0.75]),
                  [torch.tensor(0.25), np.float32(0.5), np.float64(0.75)],
                  np.array([0.25, 0.5, 0.75], dtype=object), (0.25, 0.5, 0.75)):
        assert odometer.epsilon(spent, 1e-5) == pytest.approx(want, rel=1e-6)
    assert odometer.epsilon([0, 1, 2], 1e-5) == odometer.epsilon([0.0, 1.0, 2.0], 1e-5)
