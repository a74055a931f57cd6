"""Review bx: ``privguard plot`` must never draw over its own ledger, and refuses an
output format it cannot write as a bad argument (exit 2), not as a crash (exit 1).

Before the fix, ``privguard plot budget.png -o budget.png`` replaced the ledger's
SQLite file with the image (the journal and its spent budget lost), and ``-o x.db``
computed everything, then ended in ``privguard: error: ValueError(...)``, exit 1.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from privguard import Ledger
from privguard import mechanisms as M
from privguard._cli._cli import main

pytest.importorskip("matplotlib")


def _ledger(path):
    ledger = Ledger(3.0, 1e-5, path=str(path))
    ledger.charge(M.SubsampledGaussian(1.1, 0.01), times=5)
    spent = ledger.spent.copy()
    ledger.close()
    return spent


@pytest.mark.parametrize("name,output", [
    ("budget.png", "budget.png"),          # a ledger file that has an image's extension
    ("budget.png", "./budget.png"),
    ("budget.pdf", "budget.pdf-wal"),      # its sidecars too (refused, not a format error)
    ("ledger.db", "ledger.db"),
])
def test_plot_refuses_the_ledgers_own_file(tmp_path, capsys, name, output):
    spent = _ledger(tmp_path / name)
    before = (tmp_path / name).read_bytes()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["plot", name, "-o", output, "--no-prv"]) == 2
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert "output=" in err and "the ledger's own file" in err
    assert (tmp_path / name).read_bytes() == before
    assert np.array_equal(Ledger.open(str(tmp_path / name)).spent, spent)


def test_plot_refuses_a_hard_link_to_the_ledger(tmp_path, capsys):
    spent = _ledger(tmp_path / "budget.png")
    os.link(tmp_path / "budget.png", tmp_path / "alias.png")
    assert main(["plot", str(tmp_path / "budget.png"), "-o", str(tmp_path / "alias.png"), "--no-prv"]) == 2
    assert "the ledger's own file" in capsys.readouterr().err
    assert np.array_equal(Ledger.open(str(tmp_path / "budget.png")).spent, spent)


def test_plot_refuses_an_unknown_format_as_a_bad_argument(tmp_path, capsys):
    _ledger(tmp_path / "ledger.db")
    out = tmp_path / "figure.xyz"
    assert main(["plot", str(tmp_path / "ledger.db"), "-o", str(out), "--no-prv"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("privguard: output=") and ".xyz" in err and "png" in err
    assert not out.exists()
    assert main(["plot", str(tmp_path / "ledger.db"), "-o", str(tmp_path / "f.PNG"), "--no-prv"]) == 0
    assert (tmp_path / "f.PNG").read_bytes()[:4] == b"\x89PNG"
