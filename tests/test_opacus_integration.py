"""The Opacus integration on a tiny real model: counts, numbers, refusals, hooks."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _opacus_number import SGM_RAISE, rounded_up_from
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privguard import BudgetExhausted, InvalidArgumentError, Ledger, LedgerStateError
from privguard import mechanisms as M
from privguard._accounting._results import upper
from privguard.integrations.opacus import (
    REPLAY_LABEL,
    AccountantWarning,
    LedgerAccountant,
    NonPoissonSamplingError,
    PoissonUnverifiedWarning,
    attach,
)

DELTA = 1e-5
warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
warnings.filterwarnings("ignore", message=".*Using a non-full backward hook.*")
warnings.filterwarnings("ignore", message=".*Optimal order is the.*")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def make_private(noise=1.0, batch_size=32, n=512, seed=0, accountant="rdp", poisson=True):
    torch.manual_seed(seed)
    x = torch.randn(n, 10)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    engine = PrivacyEngine(accountant=accountant)
    model, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                             noise_multiplier=noise, max_grad_norm=1.0,
                                             poisson_sampling=poisson)
    return engine, model, opt, loader


def train(model, opt, loader, steps):
    done = 0
    while done < steps:
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            done += 1
            if done == steps:
                return


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_epsilon_equals_opacus_rdp_accountant_for_fixed_sigma():
    engine, model, opt, loader = make_private()
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, data_loader=loader)
    train(model, opt, loader, 40)
    assert handle.steps_charged == 40 == len(ledger.history)
    opacus_eps = engine.accountant.get_epsilon(DELTA, alphas=list(ledger.orders))
    assert rounded_up_from(ledger.nonadaptive_epsilon(), opacus_eps, SGM_RAISE)
    assert ledger.epsilon() > opacus_eps  # the running ε is valid under adaptivity too


def test_sigma_changed_mid_run_equals_hand_composition():
    _engine, model, opt, loader = make_private(noise=1.2)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger)  # sample rate inferred from Opacus' own hook
    train(model, opt, loader, 10)
    opt.noise_multiplier = 0.8
    train(model, opt, loader, 15)
    q = 1 / len(loader)
    by_hand = (M.SubsampledGaussian(1.2, q, 10).rdp(ledger.orders)
               + M.SubsampledGaussian(0.8, q, 15).rdp(ledger.orders))
    np.testing.assert_allclose(ledger.spent, by_hand, rtol=1e-12)
    sigmas = [r.mechanism.noise_multiplier for r in ledger.history]
    assert sigmas == [1.2] * 10 + [0.8] * 15


def test_batch_memory_manager_virtual_steps_are_not_charged():
    engine, model, opt, loader = make_private(batch_size=64)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader)
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=opt) as mem:
        physical = 0
        for x, y in mem:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            physical += 1
    opacus_steps = sum(n for _, _, n in engine.accountant.history)
    assert physical > opacus_steps  # there were virtual steps
    assert len(ledger.history) == opacus_steps


def test_skipped_steps_are_not_charged():
    engine, model, opt, loader = make_private()
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader)
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.signal_skip_step(do_skip=(i % 2 == 0))
        opt.step()
        if i == 9:
            break
    assert len(ledger.history) == sum(n for _, _, n in engine.accountant.history) == 5


def test_refused_step_raises_before_the_update_and_charges_nothing():
    engine, model, opt, loader = make_private(noise=1.0)
    step = M.SubsampledGaussian(1.0, 1 / len(loader))
    ledger = Ledger(3.0, DELTA, plan=step)
    allowed = ledger.remaining(step).repeats
    assert allowed > 10
    attach(opt, ledger, data_loader=loader)
    train(model, opt, loader, allowed)
    before, n_opacus = params(model), len(engine.accountant.history)
    x, y = next(iter(loader))
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(BudgetExhausted):
        opt.step()
    for a, b in zip(before, params(model)):
        assert torch.equal(a, b)  # bit for bit
    assert len(ledger.history) == allowed
    assert len(engine.accountant.history) == n_opacus  # Opacus' hook did not run either
    assert sum(n for _, _, n in engine.accountant.history) == allowed


def test_graceful_stop_mode_stops_the_loop():
    _engine, model, opt, loader = make_private(noise=1.0)
    ledger = Ledger(3.0, DELTA)
    handle = attach(opt, ledger, data_loader=loader, on_exhausted="stop")
    steps = 0
    for _ in range(50):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            before = params(model)
            opt.step()
            if handle.exhausted:
                assert all(torch.equal(a, b) for a, b in zip(before, params(model)))
                break
            steps += 1
        if handle.exhausted:
            break
    assert handle.exhausted and steps == len(ledger.history) > 10
    assert not handle.can_step() and handle.should_stop


def test_existing_hooks_still_run_and_detach_restores():
    _engine, model, opt, loader = make_private()
    calls = []
    opacus_hook = opt.step_hook
    opt.attach_step_hook(lambda o: (calls.append(1), opacus_hook(o)))
    previous = opt.step_hook
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, sample_rate=1 / len(loader))
    train(model, opt, loader, 5)
    assert len(calls) == 5 and len(ledger.history) == 5
    handle.detach()
    assert opt.step_hook is previous and "step" not in vars(opt)
    train(model, opt, loader, 3)
    assert len(calls) == 8 and len(ledger.history) == 5


def test_context_manager_detaches():
    _engine, model, opt, loader = make_private()
    ledger = Ledger(delta=DELTA)
    with attach(opt, ledger, data_loader=loader, on_exhausted="stop"):
        train(model, opt, loader, 3)
    assert "step" not in vars(opt)
    train(model, opt, loader, 2)
    assert len(ledger.history) == 3


def test_privacy_engine_get_epsilon_reports_the_ledger():
    engine, model, opt, loader = make_private()
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    train(model, opt, loader, 10)
    assert engine.get_epsilon(DELTA) == ledger.epsilon()
    handle.detach()
    assert isinstance(engine.accountant, RDPAccountant)


def test_ledger_accountant_in_place_of_opacus():
    torch.manual_seed(0)
    x, y = torch.randn(256, 10), torch.randint(0, 2, (256,))
    model = nn.Linear(10, 2)
    engine = PrivacyEngine()
    ledger = Ledger(delta=DELTA)
    engine.accountant = LedgerAccountant(ledger)
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=32),
        noise_multiplier=1.0, max_grad_norm=1.0)
    train(model, opt, loader, 7)
    assert len(ledger.history) == 7 and engine.get_epsilon(DELTA) == ledger.epsilon()
    state = engine.accountant.state_dict()
    fresh = LedgerAccountant(Ledger(delta=DELTA))
    fresh.load_state_dict(state)
    assert len(fresh) == 7


def test_non_poisson_loader_is_reported():
    _engine, _model, opt, _loader = make_private()
    plain = DataLoader(TensorDataset(torch.randn(64, 10), torch.zeros(64).long()), batch_size=8,
                       shuffle=True)
    with pytest.raises(NonPoissonSamplingError, match="Poisson"):
        attach(opt, Ledger(delta=DELTA), data_loader=plain)
    attach(opt, Ledger(delta=DELTA), data_loader=plain, check_poisson=False).detach()


def test_bad_arguments():
    _engine, model, opt, _loader = make_private()
    with pytest.raises(InvalidArgumentError, match="optimizer"):
        attach(torch.optim.SGD(model.parameters(), lr=0.1), Ledger(delta=DELTA))
    with pytest.raises(InvalidArgumentError, match="on_exhausted"):
        attach(opt, Ledger(delta=DELTA), on_exhausted="ignore")
    with pytest.raises(InvalidArgumentError, match="sample_rate"):
        attach(opt, Ledger(delta=DELTA), sample_rate=1.5)
    opt.step_hook = None
    with pytest.raises(InvalidArgumentError, match="sample_rate"):
        attach(opt, Ledger(delta=DELTA))


def test_detach_restores_a_step_wrapper_set_by_someone_else():
    _engine, model, opt, loader = make_private()
    scheduler = torch.optim.lr_scheduler.StepLR(opt.original_optimizer, step_size=1)
    wrapper = lambda *a, **k: type(opt).step(opt, *a, **k)
    opt.step = wrapper  # what some schedulers and frameworks do
    handle = attach(opt, Ledger(delta=DELTA), data_loader=loader, on_exhausted="stop")
    train(model, opt, loader, 2)
    handle.detach()
    assert vars(opt)["step"] is wrapper and len(handle.ledger.history) == 2
    del scheduler


def test_missing_optional_framework_gives_an_install_hint():
    from privguard.integrations._frameworks import require

    with pytest.raises(ImportError, match=r"pip install 'privguard\[lightning\]'"):
        require("privguard_no_such_framework", "lightning")


def test_optimizer_from_make_private_with_epsilon():
    torch.manual_seed(0)
    x, y = torch.randn(512, 10), torch.randint(0, 2, (512,))
    model = nn.Linear(10, 2)
    engine = PrivacyEngine(accountant="rdp")  # Opacus' default is PRV; compare like with like
    model, opt, loader = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=32),
        target_epsilon=4.0, target_delta=DELTA, epochs=2, max_grad_norm=1.0)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader)
    train(model, opt, loader, 2 * len(loader))
    assert rounded_up_from(ledger.nonadaptive_epsilon(), engine.accountant.get_epsilon(
        DELTA, alphas=list(ledger.orders)))
    assert {r.mechanism.noise_multiplier for r in ledger.history} == {opt.noise_multiplier}


# ---------------------------------------------------------------- issue 13, case 2: sampling
def test_two_line_form_cannot_see_the_loader_and_warns_how_to_fix_it():
    _engine, model, opt, loader = make_private(poisson=False)
    with pytest.warns(PoissonUnverifiedWarning, match="data_loader=") as record:
        handle = attach(opt, Ledger(delta=DELTA))
    assert len([w for w in record if w.category is PoissonUnverifiedWarning]) == 1
    train(model, opt, loader, 3)  # no warning per step
    handle.detach()
    with pytest.raises(NonPoissonSamplingError) as info:
        attach(opt, Ledger(delta=DELTA), data_loader=loader)
    assert info.value.argument == "data_loader" and "DataLoader" in str(info.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoissonUnverifiedWarning)
        attach(opt, Ledger(delta=DELTA), check_poisson=False).detach()  # the documented opt-out


def test_poisson_loader_rate_is_read_from_its_sampler():
    _engine, _model, opt, loader = make_private(batch_size=64)
    handle = attach(opt, Ledger(delta=DELTA), data_loader=loader)
    assert handle.next_mechanism().sample_rate == loader.sample_rate == 64 / 512


# ---------------------------------------------------------------- case 3: attach mid-run
def test_attach_after_training_charges_the_steps_opacus_recorded():
    engine, model, opt, loader = make_private()
    train(model, opt, loader, 10)
    opacus_before = engine.get_epsilon(DELTA)
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    assert handle.steps_replayed == 10 and handle.steps_charged == 0
    assert [r.label for r in ledger.history] == [REPLAY_LABEL] * 10
    assert {(r.mechanism.noise_multiplier, r.mechanism.sample_rate) for r in ledger.history} == {
        (1.0, 1 / len(loader))}
    assert engine.get_epsilon(DELTA) == ledger.epsilon() > opacus_before > 0
    train(model, opt, loader, 5)
    handle.detach()
    assert len(ledger.history) == 15 == sum(n for _, _, n in engine.accountant.history)
    # the same curve as Opacus' RDP accountant over all 15 steps, bit for bit
    assert rounded_up_from(ledger.nonadaptive_epsilon(), engine.accountant.get_epsilon(
        DELTA, alphas=list(ledger.orders)))


def test_attach_mid_run_without_the_engine_finds_opacus_hook_and_keeps_sigma_changes():
    _engine, model, opt, loader = make_private(noise=1.2)
    train(model, opt, loader, 4)
    opt.noise_multiplier = 0.8
    train(model, opt, loader, 3)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader)
    q = 1 / len(loader)
    by_hand = (M.SubsampledGaussian(1.2, q, 4).rdp(ledger.orders)
               + M.SubsampledGaussian(0.8, q, 3).rdp(ledger.orders))
    np.testing.assert_allclose(ledger.spent, by_hand, rtol=1e-12)
    assert [r.mechanism.noise_multiplier for r in ledger.history] == [1.2] * 4 + [0.8] * 3


def test_a_refused_replay_raises_from_attach_and_attaches_nothing():
    engine, model, opt, loader = make_private()
    step = M.SubsampledGaussian(1.0, 1 / len(loader))
    small = Ledger(1.0, DELTA, plan=step)
    fits = small.remaining(step).repeats
    train(model, opt, loader, fits + 1)
    before = (opt.step_hook, vars(opt).get("step"), engine.accountant)
    with pytest.raises(BudgetExhausted, match="nothing was charged and nothing was attached"):
        attach(opt, small, data_loader=loader, privacy_engine=engine, on_exhausted="stop")
    assert len(small.history) == 0  # all or nothing
    assert (opt.step_hook, vars(opt).get("step"), engine.accountant) == before
    big = Ledger(10.0, DELTA)
    attach(opt, big, data_loader=loader).detach()  # nothing was left attached
    assert len(big.history) == fits + 1


# ---------------------------------------------------------------- case 4: attach twice, detach
def test_attaching_twice_raises_and_detach_restores_exactly_what_was_there():
    engine, model, opt, loader = make_private()
    before = (opt.step_hook, vars(opt).get("step"), engine.accountant)
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine, on_exhausted="stop")
    with pytest.raises(InvalidArgumentError, match="already has a ledger attached"):
        attach(opt, ledger, data_loader=loader)
    with pytest.raises(InvalidArgumentError, match="privacy_engine"):
        attach(make_private()[2], Ledger(delta=DELTA), privacy_engine=engine)
    train(model, opt, loader, 3)
    assert len(ledger.history) == 3  # once per step, not twice
    handle.detach()
    assert (opt.step_hook, vars(opt).get("step"), engine.accountant) == before
    assert isinstance(engine.accountant, RDPAccountant)
    train(model, opt, loader, 2)
    assert len(ledger.history) == 3 and sum(n for _, _, n in engine.accountant.history) == 5
    again = attach(opt, ledger, data_loader=loader, privacy_engine=engine)  # allowed after detach
    assert again.steps_replayed == 5 and len(ledger.history) == 8
    # (the two steps taken while detached are charged; the 3 charged ones show why the
    # warning exists: they are counted again, which is safe)


def test_ledger_accountant_and_attach_together_are_refused():
    torch.manual_seed(0)
    model = nn.Linear(10, 2)
    engine = PrivacyEngine()
    engine.accountant = LedgerAccountant(Ledger(delta=DELTA))
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(torch.randn(64, 10), torch.zeros(64).long()),
                               batch_size=8),
        noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(InvalidArgumentError, match="LedgerAccountant"):
        attach(opt, Ledger(delta=DELTA), data_loader=loader)


# ---------------------------------------------------------------- case 5: checkpoints
def _run_and_save(tmp_path, ledger, steps=6, privacy_engine=True, name="ckpt.pt"):
    engine, model, opt, loader = make_private()
    attach(opt, ledger, data_loader=loader, privacy_engine=engine if privacy_engine else None)
    train(model, opt, loader, steps)
    path = tmp_path / name
    engine.save_checkpoint(path=path, module=model, optimizer=opt)
    return path


def _journal(ledger):
    return [(r.label, r.mechanism) for r in ledger.history]


def test_opacus_order_load_checkpoint_then_attach_resumes_an_in_memory_ledger(tmp_path):
    first = Ledger(delta=DELTA)
    first.charge(M.Gaussian(20.0), label="tuning")  # not a step: must travel too
    path = _run_and_save(tmp_path, first)
    engine, model, opt, loader = make_private(seed=1)
    ckpt = engine.load_checkpoint(path=path, module=model, optimizer=opt)  # no ValueError
    assert isinstance(engine.accountant, RDPAccountant)  # Opacus' own state was not dropped
    assert sum(n for _, _, n in engine.accountant.history) == 6
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine, resume=ckpt)
    assert handle.steps_replayed == 0 and _journal(ledger) == _journal(first)
    np.testing.assert_array_equal(ledger.spent, first.spent)
    train(model, opt, loader, 4)
    assert len(ledger.history) == 11 and engine.get_epsilon(DELTA) == ledger.epsilon()
    assert sum(n for _, _, n in handle.recorder.history) == 10


def test_opacus_order_without_resume_still_charges_the_recorded_steps(tmp_path):
    path = _run_and_save(tmp_path, Ledger(delta=DELTA))
    engine, model, opt, loader = make_private(seed=1)
    engine.load_checkpoint(path=path, module=model, optimizer=opt)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    assert [r.label for r in ledger.history] == [REPLAY_LABEL] * 6  # not forgotten


def test_attach_then_load_checkpoint_resumes_too(tmp_path):
    first = Ledger(delta=DELTA)
    path = _run_and_save(tmp_path, first)
    engine, model, opt, loader = make_private(seed=1)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    engine.load_checkpoint(path=path, module=model, optimizer=opt)
    assert _journal(ledger) == _journal(first)
    assert sum(n for _, _, n in engine.accountant.history) == 6  # Opacus' history, via the view
    train(model, opt, loader, 2)
    assert len(ledger.history) == 8


def test_a_file_backed_ledger_resumes_from_its_file(tmp_path):
    db = str(tmp_path / "ledger.db")
    path = _run_and_save(tmp_path, Ledger(4.0, DELTA, path=db, lease=1))  # exact counts
    engine, model, opt, loader = make_private(seed=1)
    ckpt = engine.load_checkpoint(path=path, module=model, optimizer=opt)
    assert ckpt["privacy_accountant_state_dict"]["privguard"]["state"] is None  # a reference
    with pytest.raises(LedgerStateError, match=r"ledger\.db"):  # not the checkpoint's ledger
        attach(opt, Ledger(4.0, DELTA), data_loader=loader, resume=ckpt)
    ledger = Ledger(4.0, DELTA, path=db, lease=1)
    attach(opt, ledger, data_loader=loader, privacy_engine=engine, resume=ckpt)
    assert len(ledger.history) == 6  # resumed from the file, nothing charged twice
    train(model, opt, loader, 2)
    assert len(Ledger.open(db).history) == 8


def test_a_file_backed_resume_without_resume_counts_twice_and_says_so(tmp_path):
    db = str(tmp_path / "ledger.db")
    path = _run_and_save(tmp_path, Ledger(delta=DELTA, path=db, lease=1))  # exact counts
    engine, model, opt, loader = make_private(seed=1)
    engine.load_checkpoint(path=path, module=model, optimizer=opt)
    ledger = Ledger(delta=DELTA, path=db, lease=1)
    with pytest.warns(AccountantWarning, match="counted twice"):
        attach(opt, ledger, data_loader=loader, privacy_engine=engine)
    assert len(ledger.history) == 12  # safe: over-counted, never forgotten


def test_a_resume_never_rewinds_the_ledger(tmp_path):
    live = Ledger(delta=DELTA)
    engine, model, opt, loader = make_private()
    handle = attach(opt, live, data_loader=loader, privacy_engine=engine)
    train(model, opt, loader, 5)
    path = tmp_path / "at5.pt"
    engine.save_checkpoint(path=path, module=model, optimizer=opt)
    train(model, opt, loader, 3)
    engine.load_checkpoint(path=path, module=model, optimizer=opt)  # the model goes back...
    assert len(live.history) == 8  # ...the ledger does not: the 3 later steps stay spent
    handle.detach()
    other = Ledger(delta=DELTA)
    other.charge(M.Gaussian(5.0), label="something else")
    engine2, model2, opt2, loader2 = make_private(seed=1)
    attach(opt2, other, data_loader=loader2, privacy_engine=engine2)
    with pytest.raises(LedgerStateError, match=r"never goes backwards|does not extend"):
        engine2.load_checkpoint(path=path, module=model2, optimizer=opt2)


def test_a_checkpoint_written_without_the_ledger(tmp_path):
    path = _run_and_save(tmp_path, Ledger(delta=DELTA), privacy_engine=False)
    engine, model, opt, loader = make_private(seed=1)
    ckpt = engine.load_checkpoint(path=path, module=model, optimizer=opt)
    with pytest.raises(InvalidArgumentError, match="resume"):
        attach(opt, Ledger(delta=DELTA), data_loader=loader, resume=ckpt)
    ledger = Ledger(delta=DELTA)
    attach(opt, ledger, data_loader=loader)
    assert len(ledger.history) == 6  # the recorded steps are charged: not forgotten


# ---------------------------------------------------------------- case 6: pickling
def test_pickling_what_the_integration_holds():
    import pickle

    _engine, model, opt, loader = make_private()
    ledger = Ledger(delta=DELTA)
    handle = attach(opt, ledger, data_loader=loader)
    train(model, opt, loader, 3)
    with pytest.raises(InvalidArgumentError, match="handle"):
        pickle.dumps(handle)
    acc = LedgerAccountant(ledger, charge=False)
    again = pickle.loads(pickle.dumps(acc))
    assert len(again) == 3 and again.get_epsilon(DELTA) == ledger.epsilon()
    cloudpickle = pytest.importorskip("ray.cloudpickle")  # what Ray ships objects with
    for original in (ledger, Ledger(2.0, DELTA, path=str(Path(tempfile.mkdtemp()) / "l.db"))):
        copy = cloudpickle.loads(cloudpickle.dumps(original))
        assert copy.path == original.path and _journal(copy) == _journal(original)


# ---------------------------------------------------------------- case 7: PRV accountant
def test_a_prv_engine_gets_a_warning_with_the_rdp_cost_of_its_plan():
    torch.manual_seed(0)
    x, y = torch.randn(512, 10), torch.randint(0, 2, (512,))
    model = nn.Linear(10, 2)
    engine = PrivacyEngine()  # Opacus' default: PRV
    epochs, target = 2, 3.0
    model, opt, loader = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=32),
        target_epsilon=target, target_delta=DELTA, epochs=epochs, max_grad_norm=1.0)
    planned = epochs * len(loader)
    ledger = Ledger(target, DELTA)
    with pytest.warns(AccountantWarning, match="PRV.*RDP") as record:
        attach(opt, ledger, data_loader=loader, planned_steps=planned)
    text = str(record[0].message)
    q, sigma = 1 / len(loader), opt.noise_multiplier
    rdp = RDPAccountant()
    rdp.history = [(sigma, q, planned)]
    by_opacus = rdp.get_epsilon(DELTA, alphas=list(ledger.orders))
    # rounded up (review rlo2)
    assert f"ε = {upper(by_opacus, '.4g')} at δ" in text and by_opacus > target
    admits = ledger.remaining(M.SubsampledGaussian(sigma, q)).repeats
    assert f"admits {admits:g} more" in text and admits < planned  # the filter stops early
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccountantWarning)
        attach(make_private(accountant="rdp")[2], Ledger(target, DELTA),
               data_loader=make_private()[3])


def test_bad_arguments_name_the_argument():
    _engine, _model, opt, loader = make_private()
    for kwargs, name in [({"planned_steps": 0}, "planned_steps"), ({"resume": {}}, "resume"),
                         ({"label": 3}, "label"), ({"check_poisson": "yes"}, "check_poisson"),
                         ({"privacy_engine": object()}, "privacy_engine")]:
        with pytest.raises(InvalidArgumentError) as info:
            attach(opt, Ledger(delta=DELTA), data_loader=loader, **kwargs)
        assert info.value.argument == name
    assert opt.step_hook is not None and "step" not in vars(opt)  # nothing was attached


def test_ledger_accountant_refuses_a_distributed_optimizer(monkeypatch):
    import privguard.integrations._accountants as accountants

    ledger = Ledger(delta=DELTA)
    hook = LedgerAccountant(ledger).get_optimizer_hook_fn(sample_rate=0.01)
    _engine, _model, opt, _loader = make_private()
    monkeypatch.setattr(accountants, "is_distributed", lambda optimizer: True)
    with pytest.raises(InvalidArgumentError, match="attach"):
        hook(opt)  # what every rank would run: each raises, before any update
    assert len(ledger.history) == 0
    with pytest.raises(InvalidArgumentError, match="label"):
        LedgerAccountant(ledger, label=7)
