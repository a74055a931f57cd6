"""Review rfp (of task fp): each test fails on fp's head (bc86304) before its fix."""

from __future__ import annotations

import math
import re
import warnings

import pytest


def test_a_count_that_could_not_be_computed_is_not_printed_as_unlimited():
    # whole_count(NaN) read "unlimited": a count left that nobody computed, stated as
    # no limit at all (fails open, in words)
    from privguard._accounting._results import whole_count

    assert whole_count(math.nan) == "an unknown number of"
    assert whole_count(math.inf) == "unlimited"
    assert whole_count(1234567.9) == "1234567"
    assert whole_count(2.0 ** 80) == str(2 ** 80)


def test_the_plan_deviation_warning_states_the_steps_left_in_full_and_delta_b_as_used():
    # ":g" printed 147284878505 steps that fit as 1.47285e+11 (more than fit) and
    # δ_B = 1.0000000000000074e-07 as 1e-07, and the envelope's σ = 1.2345649 as 1.23456
    import privguard.mechanisms as M
    from privguard import Ledger, Plan, PlanDeviationWarning

    step = M.SubsampledGaussian(1.2345649, 1e-5)
    ledger = Ledger(epsilon=40.0, delta=1e-5, plan=Plan(step, 100), filter="hybrid")
    before = ledger.remaining(step).repeats
    assert before >= 1e6 and float(f"{before:g}") > before  # ":g" rounds this one up
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ledger.charge(M.SubsampledGaussian(0.9, 1e-5))  # off the envelope: A closes
    text = next(str(w.message) for w in caught if issubclass(w.category, PlanDeviationWarning))
    counts = re.search(r"that fit: (\S+) before this charge, (\S+) after", text)
    assert counts is not None, text
    assert counts.group(1) == str(before), text
    assert int(counts.group(2)) == ledger.remaining(step).repeats, text
    assert f"δ_B = {ledger._acc.filter.delta_b!r} decides" in text, text
    assert "(σ ≥ 1.2345649 and q ≤ 1e-05)" in text, text


def test_the_plan_deviation_message_says_when_a_count_is_unknown():
    # repeats_or_nan gives NaN where the count after the charge cannot be computed;
    # ":g" printed "nan" (now words, never "unlimited")
    import privguard.mechanisms as M
    from privguard import Ledger, Plan
    from privguard._accounting import _deviation

    step = M.SubsampledGaussian(1.0, 1e-5)
    ledger = Ledger(epsilon=40.0, delta=1e-5, plan=Plan(step, 100), filter="hybrid")
    ledger.charge(step)
    text = _deviation.message(ledger._acc.filter, M.SubsampledGaussian(0.9, 1e-5), None,
                              step, 5.0, math.nan)
    assert "that fit: 5 before this charge, an unknown number of after" in text, text


@pytest.mark.filterwarnings("ignore")
def test_the_audit_runs_a_plain_model_in_a_process_group_of_one_rank(tmp_path):
    # No false refusal: torch.distributed initialised with one rank, the model not wrapped
    # (the refusal is for a data-parallel wrapper or several ranks); the one-process audit
    # runs as without a group
    import torch.distributed as dist
    from test_leftovers_fp import _plain_ddp_build

    from privguard.audit import audit_opacus

    build = _plain_ddp_build(lambda model: model)  # make_private's model, not wrapped

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        result = audit_opacus(build, steps=2, canaries=50, seed=0)
    finally:
        dist.destroy_process_group()
    assert result.steps == 2


# --- parameters stated as charged in the integrations' other messages (docs/reference.md: "the
# integrations' warnings and refusals ... as stored, never rounded"); ":g" printed
# 1.2345649 as 1.23456 and 0.12345649 as 0.123456 ---------------------------------------
def test_the_below_hook_warning_states_the_rates_as_charged():
    from privguard.integrations.opacus import _warn_below_hook

    with pytest.warns(UserWarning) as caught:
        _warn_below_hook(0.1, 0.12345649)
    text = str(caught[0].message)
    assert "sample_rate=0.1 " in text and "(0.12345649); the steps are charged at 0.12345649," \
        in text, text


def test_the_lightning_rate_refusal_states_the_charged_q():
    from privguard import InvalidArgumentError
    from privguard.integrations import lightning

    class Loader:  # Poisson at 0.2, above the charged 0.12345649
        batch_sampler = type("UniformWithReplacementSampler", (), {"sample_rate": 0.2})()

    with pytest.raises(InvalidArgumentError) as caught:
        lightning._check_rates([Loader()], 0.12345649)
    assert "charged at q = 0.12345649 (sample_rate)" in str(caught.value), str(caught.value)


def test_the_sampling_refusal_states_the_loaders_rate_as_is():
    from privguard import NonPoissonSamplingError
    from privguard.integrations._sampling import check_poisson

    class Loader:  # Opacus' sampler over 10 indices, a dataset of 20 records
        batch_sampler = type("UniformWithReplacementSampler", (),
                             {"sample_rate": 0.12345649, "num_samples": 10})()
        dataset = range(20)

    with pytest.raises(NonPoissonSamplingError) as caught:
        check_poisson(Loader())
    assert "(q = 0.12345649)" in str(caught.value), str(caught.value)


def test_the_recorded_steps_refusal_states_sigma_and_q_as_recorded():
    from privguard.integrations._recorded import _describe

    assert _describe([(1.2345649, 0.012345649, 3)]) == "3 × (σ=1.2345649, q=0.012345649)"


def test_the_rank_disagreement_names_two_different_sigmas_differently():
    # ":g" printed σ = 1.2345649 and σ = 1.2345648 both as 1.23456: "different steps",
    # shown the same
    import privguard.mechanisms as M
    from privguard.integrations import _distributed as dist
    from privguard.integrations._distributed import RankDisagreementError

    coordinator = object.__new__(dist.Coordinator)
    coordinator._gather = lambda op, row: [[dist.NOT_CHARGER, 1.2345649, 0.01, 1.0],
                                           [dist.NOT_CHARGER, 1.2345648, 0.01, 1.0]]
    with pytest.raises(RankDisagreementError) as caught:
        coordinator.step(lambda k: M.SubsampledGaussian(1.2345649, 0.01), 1, None)
    text = str(caught.value)
    assert "rank 0 has σ=1.2345649, q=0.01, rank 1 has σ=1.2345648, q=0.01" in text, text


def test_the_provenance_warning_states_the_charged_q_as_charged(monkeypatch):
    from types import SimpleNamespace

    from privguard import Ledger
    from privguard.integrations import _provenance

    monkeypatch.setattr(_provenance, "source_of", lambda loader: SimpleNamespace(
        records=100_000, drawn=None, sampler="WeightedRandomSampler", batches=81_000))
    text = _provenance.warning_text(object(), 1.2345649e-05, 1, 1e-5, 1.0,
                                    Ledger(epsilon=1.0, delta=1e-5))
    assert "at q = 1/len(loader) = 1.2345649e-05 (" in text, text


def test_no_ledgers_delta_b_changed():
    # docs/theory.md §2b (review rfp): a ledger's hybrid filter has δ_A = fl(0.99·δ) >= δ/2,
    # where δ − δ_A is exact (Sterbenz), so fp's exact split gives every ledger the δ_B it
    # had (the float-sum loop's); fp's docs said the default was 0.9·δ and described old fix
    # records that a near-tie could refuse, which no ledger can have
    import random

    from privguard._accounting._hybrid import DEFAULT_SHARE_A, _exact_delta_b

    assert DEFAULT_SHARE_A >= 0.5
    rng = random.Random(7)
    deltas = [5e-324, 1e-320, 2.2250738585072014e-308, 1e-5, 0.5, math.nextafter(1.0, 0.0)]
    deltas += [rng.uniform(0.5, 1.0) * 2.0 ** rng.randint(-1070, -1) for _ in range(20000)]
    for delta in deltas:
        delta_a = DEFAULT_SHARE_A * delta
        if not delta_a < delta:  # the smallest subnormals: no split at all
            continue
        before = delta - delta_a
        while before + delta_a > delta:
            before = math.nextafter(before, 0.0)
        assert _exact_delta_b(delta, delta_a) == before == delta - delta_a
