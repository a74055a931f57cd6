"""Adversarial review of the command line (review cli)."""

from __future__ import annotations

import pytest

from privguard import Ledger
from privguard import mechanisms as M
from privguard._accounting._budget import Budget
from privguard._accounting._results import lower, upper
from privguard._cli._cli import main
from privguard._cli._report import print_report
from privguard._stores._pgschema import SCHEMA_VERSION


def test_budget_line_rounds_spent_up_and_left_down():
    # 1.60241 spent of 4: 59.93975% left. Rounded to nearest it read "1.602 spent, 59.9%";
    # at 2.39801 spent, 40.04975% left read "40% left" and "2.398 spent": both understate
    b = Budget(4.0, 1e-5, 2.398_01, "RDP filter")
    text = str(b)
    spent = float(text.split()[1])
    left = float(text.split("— ")[1].split("%")[0])
    assert spent >= b.spent and left <= 100 * b.left, text


def test_report_budget_line_rounds_spent_up_and_left_down(capsys):
    data = {"budget": {"spent": 2.398_01, "epsilon": 4.0, "left": 1 - 2.398_01 / 4.0,
                       "part": "RDP filter"}}
    with pytest.raises(KeyError):  # only the first line is of interest here
        print_report({**data, "target_epsilon": 4.0, "delta": 1e-5})
    line = capsys.readouterr().out.splitlines()[0]
    spent = float(line.split()[1])
    left = float(line.split("— ")[1].split("%")[0])
    assert spent >= 2.398_01 and left <= 100 * (1 - 2.398_01 / 4.0), line


@pytest.mark.parametrize("x", [59.95, 0.000_384_9, 99.99, 3.0, 0.0, 2.502_41])
def test_lower_is_at_most_and_upper_at_least(x):
    for spec in (".3g", ".4g", ".3f"):
        assert float(lower(x, spec)) <= x <= float(upper(x, spec))


def test_tuning_bound_is_printed_rounded_up():
    import numpy as np

    from privguard.tuning import TuningPlan

    plan = TuningPlan(M.Gaussian(1.0), np.array([2.0]), np.array([1.0]), 2.502_41, 1e-5,
                      3.0, 2.0)
    shown = float(str(plan).split("ε = ")[1].split()[0])
    assert shown >= plan.epsilon, str(plan)


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    path = tmp_path / "b.db"
    ledger = Ledger(4.0, 1e-5, path=path)
    ledger.charge(M.Gaussian(5.0))
    ledger.close()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("privguard._cli._report.report", interrupted)
    assert main(["report", str(path)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "privguard: interrupted"
    reopened = Ledger.open(path, read_only=True)
    assert len(reopened.history) == 1  # nothing charged, nothing undone
    reopened.close()


def test_server_init_prints_the_stored_target_exactly(monkeypatch, capsys):
    # --epsilon 1.23456789 was printed as Ledger(1.23457, ...): a job running that line is
    # refused (another configuration). The line must name the stored target.
    def fake(url, ledger, epsilon, delta, *, charger, owner):
        return {"ledger": ledger, "target": [epsilon, delta], "charges": 0,
                "schema_owner": owner, "schema_version": SCHEMA_VERSION, "charger": charger,
                "charger_url": f"postgresql://{charger}@h/db?ledger={ledger}"}

    monkeypatch.setattr("privguard._stores._pgadmin.server_init", fake)
    assert main(["server-init", "postgresql://admin@h/db", "--ledger", "team",
                 "--epsilon", "1.23456789", "--delta", "1.234567e-5"]) == 0
    out = capsys.readouterr().out
    args = out.split("Ledger(")[1].split(", path=")[0]
    eps, delta = (float(part) for part in args.split(", "))
    assert (eps, delta) == (1.23456789, 1.234567e-5), out
    assert "ε = 1.23456789" in out


def test_the_filter_statement_never_states_a_smaller_target(tmp_path, capsys):
    # ε = 1.2345649 was stated as "(ε = 1.23456, δ = ...)-DP": a smaller ε than the
    # filter's, in the guarantee, the report's "report" and "filter" lines
    import re

    path = tmp_path / "b.db"
    ledger = Ledger(1.234_564_9, 1.000_004_9e-5, path=path)
    ledger.charge(M.Gaussian(5.0))
    claim = str(ledger.guarantee())
    ledger.close()
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    for text in (claim, out):
        stated = re.findall(r"\(ε = ([0-9.e+-]+), δ = ([0-9.e+-]+)\)", text)
        assert stated, text
        for eps, delta in stated:
            assert float(eps) >= 1.234_564_9 and float(delta) >= 1.000_004_9e-5, text
    assert "the whole interaction is (1.2345649, 1.0000049e-05)-DP" in out


def test_remaining_prints_the_count_of_repeats_in_full():
    # 1234567 repeats were printed as "1.23457e+06 more ... fit": 3 more than fit
    from privguard._accounting._results import Remaining

    text = str(Remaining(None, None, None, None, 1_234_567.0))
    assert text.startswith("1234567 more"), text
    assert str(Remaining(None, None, None, None, float("inf"))).startswith("unlimited"), text


def test_an_output_that_cannot_be_written_is_one_line_not_a_builtin_repr(tmp_path, monkeypatch,
                                                                         capsys):
    # `privguard report b.db > /dev/full` printed "privguard: error: OSError(28, 'No space
    # left on device')"
    import errno

    path = tmp_path / "b.db"
    Ledger(4.0, 1e-5, path=path).close()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("privguard._cli._report.print_report", full)
    assert main(["report", str(path)]) != 0
    err = capsys.readouterr().err
    assert err == "privguard: No space left on device\n", err


def test_plot_interrupted_while_writing_leaves_no_half_written_image(tmp_path, monkeypatch,
                                                                     capsys):
    # savefig wrote straight to -o: a full disk or Ctrl-C in the middle left a truncated PNG
    import matplotlib.figure

    path = tmp_path / "b.db"
    ledger = Ledger(4.0, 1e-5, path=path)
    ledger.charge(M.Gaussian(5.0))
    ledger.close()
    out = tmp_path / "eps.png"

    def half(self, fname, *args, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\\x89PNG\\r\\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half)
    assert main(["plot", str(path), "-o", str(out)]) == 130
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.db"]  # nothing left beside it


def test_plot_still_writes_the_named_file(tmp_path, capsys):
    path = tmp_path / "b.db"
    ledger = Ledger(4.0, 1e-5, path=path)
    ledger.charge(M.Gaussian(5.0))
    ledger.close()
    for name in ("eps.png", "eps.svg", "eps"):
        assert main(["plot", str(path), "-o", str(tmp_path / name)]) == 0
    assert (tmp_path / "eps.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (tmp_path / "eps.svg").read_bytes()[:500]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


# ---- task lo2

def test_an_unexpected_error_is_one_line_with_its_message_not_its_repr(tmp_path, monkeypatch,
                                                                        capsys):
    path = tmp_path / "b.db"
    Ledger(4.0, 1e-5, path=path).close()

    def broken(*args, **kwargs):
        raise ValueError("bad 'value'")

    monkeypatch.setattr("privguard._cli._report.report", broken)
    assert main(["report", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == "privguard: error: ValueError: bad 'value'\n", err


def test_the_prv_and_naive_comparisons_are_printed_rounded_up_and_labelled(tmp_path,
                                                                           monkeypatch, capsys):
    # printed to nearest, a PRV or naive ε of 1.00001 read 1.0000, below the number
    import privguard._cli._report as rep

    path = tmp_path / "b.db"
    ledger = Ledger(40.0, 1e-5, path=path)
    ledger.charge(M.Gaussian(5.0))
    ledger.close()
    real = rep.report

    def compared(*args, **kwargs):
        data = real(*args, **kwargs)
        return {**data, "opacus_prv_epsilon_not_a_guarantee": 1.000_01,
                "naive_epsilon_not_a_guarantee": 2.000_01}

    monkeypatch.setattr(rep, "report", compared)
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    prv = next(line for line in out.splitlines() if line.startswith("Opacus PRV"))
    naive = next(line for line in out.splitlines() if line.startswith("naive ε"))
    assert float(prv.split()[2]) >= 1.000_01 and "a comparison, rounded up" in prv, prv
    assert float(naive.split()[2]) >= 2.000_01 and "a comparison, rounded up" in naive, naive


def test_repr_and_describe_never_state_a_rounded_target_or_parameter():
    from privguard._accounting._results import describe

    text = repr(Ledger(1.234_564_9, 1.000_004_9e-5))
    assert "ε=1.2345649, δ=1.0000049e-05" in text, text
    shown = describe(M.SubsampledGaussian(1.0, 0.123_456_4).to_dict())
    assert "sample_rate=0.1234564" in shown, shown


def test_the_audits_lower_bound_is_printed_rounded_down(monkeypatch, capsys):
    # epsilon_lower = 0.1239 was printed "0.124", more than the audit showed
    from types import SimpleNamespace

    res = SimpleNamespace(steps=10, canaries=100, correct=9, guesses=10, guess_sets=1,
                          epsilon_lower=0.123_9, delta=1e-5, confidence=0.95,
                          epsilon_charged=2.000_1, ratio=0.06)
    monkeypatch.setattr("privguard.audit.demo_audit", lambda **kwargs: res)
    assert main(["audit", "--quick"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "epsilon_lower" in line)
    charged = next(line for line in out.splitlines() if "epsilon_charged" in line)
    assert float(line.split("=")[1].split()[0]) <= 0.123_9, line
    assert float(charged.split("=")[1].split()[0]) >= 2.000_1, charged


# ---- review rlo2

@pytest.mark.parametrize("message,shown", [
    ("first line\n  second line", "privguard: error: ValueError: first line second line\n"),
    ("", "privguard: error: ValueError\n"),
])
def test_an_unexpected_error_of_several_lines_or_none_prints_one_line(tmp_path, monkeypatch,
                                                                       capsys, message, shown):
    path = tmp_path / "b.db"
    Ledger(4.0, 1e-5, path=path).close()

    def broken(*args, **kwargs):
        raise ValueError(message)

    monkeypatch.setattr("privguard._cli._report.report", broken)
    assert main(["report", str(path)]) == 1
    assert capsys.readouterr().err == shown


def test_the_report_states_delta_and_the_target_unrounded(tmp_path, capsys):
    # "any-time ε ... at δ = 1e-05" for a ledger at δ = 1.0000049e-05 stated the bound at a
    # smaller δ than the one it holds at; "of ε = 1.23456" for the target 1.2345649
    path = tmp_path / "b.db"
    ledger = Ledger(1.234_564_9, 1.000_004_9e-5, path=path)
    ledger.charge(M.Gaussian(5.0))
    ledger.close()
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1e-05" not in out, out
    assert "at δ = 1.0000049e-05" in out and "of ε = 1.2345649 " in out, out
