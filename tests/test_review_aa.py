"""Review aa: the one-run audit's bound and the numbers a user compares with Opacus.

The audit's coverage tests in tests/test_audit.py simulate mechanisms whose ε the one-run
bound reaches only a fraction of (mean 0.12–0.37×, max 0.17–0.56× of the truth), so a
bound 2× too large still passes them (196–200 of 200 covered): they cannot catch an
inversion that is too large by less than that. The exact test below can: for randomized
response (the mechanism Theorem 5.2 is tight for) the law of V is known exactly, so the
probability that the bound exceeds the truth is a finite sum, with no simulation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privguard._audit._audit_scoring import default_guesses
from privguard._audit._one_run import epsilon_lower_bound

M, CONF = 1000, 0.95


def _miscoverage(r: int, epsilon: float, delta: float, confidence: float) -> float:
    """P[ε̂ > ε] exactly, for r guesses at an (ε, δ)-DP randomized response.

    Canary i's output is S_i with probability δ, else S_i flipped with probability
    1/(1 + e^ε): (ε, δ)-DP in S_i. Guessing the output bit for r canaries fixed in
    advance, each guess is right independently with probability δ + (1 − δ)·e^ε/(1 + e^ε),
    so V ~ Binomial(r, that) exactly.
    """
    right = delta + (1.0 - delta) / (1.0 + math.exp(-epsilon))
    pmf = stats.binom.pmf(np.arange(r + 1), r, right)
    return float(sum(p for v, p in enumerate(pmf)
                     if p > 1e-15 and epsilon_lower_bound(M, r, v, delta, confidence) > epsilon))


@pytest.mark.parametrize("epsilon,delta", [(1.0, 0.0), (2.0, 1e-5)])
def test_the_bound_over_the_pre_registered_pairs_covers_randomized_response_exactly(
        epsilon, delta):
    """The union over the default pairs, each at 1 − (1 − c)/n, misses with probability
    ≤ 1 − c (§16.4's Proposition 16.4, computed exactly); and the sum is close to 1 − c
    (≥ 0.3·(1 − c)), so a bound 1.1× too large makes this test fail (checked by hand)."""
    pairs = default_guesses(M)
    level = 1.0 - (1.0 - CONF) / len(pairs)
    total = sum(_miscoverage(k_in + k_out, epsilon, delta, level) for k_in, k_out in pairs)
    assert total <= 1.0 - CONF, total
    assert total >= 0.3 * (1.0 - CONF), total  # tight: the test has room to fail


# ------------------------------------------------------------------ privguard report
def test_report_compares_the_three_numbers_at_one_delta_after_a_retarget(tmp_path, capsys):
    """After a retarget the running ε is stated at the δ fixed before the first output; the
    non-adaptive RDP ε and Opacus' PRV ε beside it were computed at the retargeted δ, with
    no δ printed, so "what validity costs" compared numbers at δs 100× apart."""
    from opacus.accountants import PRVAccountant

    from privguard import Ledger
    from privguard import mechanisms as M
    from privguard._cli._report import print_report, report

    path = str(tmp_path / "l.db")
    ledger = Ledger(3.0, 1e-5, path=path)
    for _ in range(5):
        ledger.charge(M.SubsampledGaussian(1.0, 0.01, steps=100))
    ledger.close()
    ledger = Ledger(3.0, 1e-3, path=path, retarget="a larger δ, after outputs")
    data = report(ledger, compare_prv=True)
    assert data["running_delta"] == 1e-5
    assert data["naive_epsilon_not_a_guarantee"] == ledger.nonadaptive_epsilon(1e-5)
    prv = PRVAccountant()
    prv.history = [(1.0, 0.01, 500)]
    assert data["opacus_prv_epsilon_not_a_guarantee"] == pytest.approx(prv.get_epsilon(1e-5))
    print_report(data)
    lines = capsys.readouterr().out.splitlines()
    for head in ("any-time ε", "Opacus PRV", "naive ε"):
        line = next(s for s in lines if s.startswith(head))
        assert "at δ = 1e-05" in line, line
    ledger.close()


# ------------------------------------------------------------------ the numbers beside Opacus'
@pytest.mark.parametrize("sigma,q,steps", [(1.0, 1 / 16, 60), (1.1, 0.004, 1000),
                                           (5.0, 0.01, 100), (20.0, 0.001, 10)])
def test_nonadaptive_epsilon_is_opacus_rdp_number_unless_its_best_order_is_its_last(
        sigma, q, steps):
    """What README/docstrings say of nonadaptive_epsilon(): Opacus' RDPAccountant number
    (its default 151 orders), rounded up (task ul), when Opacus' best order is inside its grid; when
    it is Opacus' largest, 63, the ledger's orders up to 1024 give a smaller ε (σ = 20,
    q = 0.001, 10 steps: 0.0035 against Opacus' 0.103), and then even the any-time ε is
    below Opacus' RDP number."""
    import warnings

    from opacus.accountants import RDPAccountant

    from privguard import Ledger
    from privguard import mechanisms as M

    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs, order = acc.get_privacy_spent(delta=1e-5)
    ledger = Ledger(delta=1e-5)
    ledger.charge(M.SubsampledGaussian(sigma, q, steps=steps))
    if order < 63:  # rounded up since task ul: a few 1e-15 above, never below
        assert theirs <= ledger.nonadaptive_epsilon() <= theirs * (1 + 1e-13)
    else:
        assert ledger.nonadaptive_epsilon() < theirs
        if sigma == 20.0:
            assert ledger.epsilon() < theirs


# ------------------------------------------------------------------ audit_opacus's input
def test_more_canaries_than_can_be_allocated_are_refused_naming_canaries_and_detached():
    """m > d canaries are random directions, m×d floats: with 10¹¹ canaries on a 10-weight
    model torch's RuntimeError ("can't allocate memory") escaped audit_opacus, and the
    optimizer stayed attached to the audit's private ledger (a second attach raised)."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from privguard import InvalidArgumentError, Ledger
    from privguard.audit import audit_opacus
    from privguard.integrations.opacus import attach

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Linear(4, 2)
    built = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=8),
        noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(InvalidArgumentError) as info:
        audit_opacus(lambda: built, steps=1, canaries=10**11, seed=0)
    assert info.value.argument == "canaries"
    attach(built[1], Ledger(delta=1e-5), data_loader=built[2]).detach()  # was left attached


def test_report_of_a_ledger_retargeted_from_no_delta_says_there_is_no_guarantee(
        tmp_path, capsys):
    """A ledger created without δ and retargeted to one has no guarantee (docs/theory.md
    §4); `privguard report` failed on it (guarantee()'s refusal, "delta=1e-05 is invalid",
    exit 2) instead of showing the journal and saying so."""
    from privguard import Ledger
    from privguard import mechanisms as M
    from privguard._cli._cli import main

    path = str(tmp_path / "l.db")
    ledger = Ledger(path=path)
    for _ in range(5):
        ledger.charge(M.SubsampledGaussian(1.0, 0.01, steps=100))
    ledger.close()
    Ledger(3.0, 1e-5, path=path, retarget="a δ chosen after outputs").close()
    assert main(["report", path]) == 0
    out = capsys.readouterr().out
    assert "no guarantee to state" in out and "any-time ε" not in out


def test_report_does_not_state_a_retargeted_filter_s_target_as_holding(tmp_path):
    """The filter's theorem needs its target fixed before the first charge; after a retarget
    the report's filter line still read "the whole interaction is (3, 0.001)-DP — but the
    target was changed ...": a statement that does not hold, printed as one."""
    from privguard import Ledger
    from privguard import mechanisms as M
    from privguard._cli._report import report

    path = str(tmp_path / "l.db")
    ledger = Ledger(3.0, 1e-5, path=path)
    ledger.charge(M.SubsampledGaussian(1.0, 0.01, steps=100))
    ledger.close()
    ledger = Ledger(3.0, 1e-3, path=path, retarget="a larger δ, after outputs")
    text = report(ledger)["target_statement"]
    assert "not fixed in advance" in text and "the whole interaction is (" not in text
    ledger.close()


def test_p_value_is_theorem_5_2_written_out_with_i_over_all_of_1_to_m():
    """SNJ 2023 Thm 5.2 as stated: f(v) + 2mδ·max_{1≤i≤m} (f(v−i) − f(v))/i with
    f(w) = P[Binomial(r, e^ε/(1+e^ε)) ≥ w]; the code's max runs over i ≤ v only (beyond v,
    f(v−i) = 1 and the ratio decreases in i), computed here the long way."""
    from privguard._audit._one_run import p_value

    def f(w, r, q):
        return 1.0 if w <= 0 else float(stats.binom.sf(w - 1, r, q))

    rng = np.random.default_rng(0)
    for _ in range(40):
        m = int(rng.integers(1, 60))
        r = int(rng.integers(0, m + 1))
        v = int(rng.integers(0, r + 1))
        eps, delta = float(rng.uniform(0, 4)), float(rng.choice([0.0, 1e-5, 1e-2]))
        q = math.exp(eps) / (1 + math.exp(eps))
        tail = f(v, r, q)
        extra = max((f(v - i, r, q) - tail) / i for i in range(1, m + 1))
        want = min(1.0, tail + 2 * m * delta * extra) if v > 0 else 1.0
        assert math.isclose(p_value(m, r, v, eps, delta), want, rel_tol=1e-9, abs_tol=1e-15), \
            (m, r, v, eps, delta)


# ------------------------------------------------------------------ bounds printed rounded up
def test_printed_upper_bounds_are_rounded_up_not_to_nearest():
    """guarantee()'s odometer statement, remaining()'s any-time ε and the risk sentence print
    upper bounds; to nearest at 4 (3) digits, about half of them read below the bound they
    state (an ε of 2.50241 printed as "privacy loss ≤ 2.502")."""
    import re

    from privguard import Ledger
    from privguard import mechanisms as M
    from privguard._cli._risk import membership_tpr_bound, risk_sentence

    for k in range(1, 25):
        ledger = Ledger(delta=1e-5)
        ledger.charge(M.SubsampledGaussian(0.8 + 0.037 * k, 0.01, steps=100 * k))
        g = ledger.guarantee()
        stated = float(re.search(r"privacy loss ≤ ([0-9.e+-]+)", g.statement).group(1))
        assert stated >= g.epsilon, (g.statement, g.epsilon)
        remaining = str(ledger.remaining())
        shown = float(re.search(r"any-time ε = ([0-9.e+-]+)", remaining).group(1))
        assert shown >= ledger.epsilon(), (remaining, ledger.epsilon())
        eps = 0.5 + 0.11 * k
        tpr = float(re.search(r"at most ([0-9.]+)%", risk_sentence(eps, 1e-5)).group(1))
        assert tpr >= 100 * membership_tpr_bound(eps, 1e-5), (eps, tpr)
