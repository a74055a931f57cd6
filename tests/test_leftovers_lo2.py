"""Leftovers of the last stop that broke a stated promise (task lo2)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from _one_rank import one_rank_group  # noqa: E402, F401 (a fixture)
from _private_mlp import private as _private  # noqa: E402
from _private_mlp import quiet_attach as _attach  # noqa: E402
from _private_mlp import step as _step  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from privguard import InvalidArgumentError, Ledger  # noqa: E402
from privguard.integrations.opacus import AccountantWarning, attach  # noqa: E402

# ---- 1. a hand-set rate without a loader, against Opacus' own hook's rate

def test_a_fixed_rate_below_opacus_hook_is_charged_at_the_hooks_rate_with_a_warning():
    # make_private's hook records q each step; sample_rate=q/100 without data_loader= was
    # charged q/100 (the ledger reported less than Opacus' own accountant)
    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    with pytest.warns(AccountantWarning, match="accountant hook"):
        attach(opt, ledger, sample_rate=q / 100)
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [q]


def test_a_callable_rate_below_opacus_hook_is_charged_at_the_hooks_rate_each_step():
    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    given = [q / 100]
    _attach(opt, ledger, sample_rate=lambda: given[0])
    _step(model, opt, loader)
    given[0] = 2 * q  # above the hook's: charged as given
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [q, 2 * q]


def test_a_fixed_rate_above_opacus_hook_is_charged_as_given_without_a_warning():
    model, opt, loader = _private()
    q = loader.batch_sampler.sample_rate
    ledger = Ledger(delta=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AccountantWarning)
        attach(opt, ledger, sample_rate=2 * q)
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [2 * q]


# ---- 1b. a hand-set rate within float32 rounding of the loader's

def test_a_float32_hand_rate_is_accepted_and_the_larger_is_charged():
    # q = 0.1 is not a float32: np.float32(0.1) = 0.10000000149... was refused as a
    # different rate; it is accepted, and the charge is the larger of the two
    np = pytest.importorskip("numpy")
    model, opt, loader = _private(rows=100, batch_size=10)
    q = loader.batch_sampler.sample_rate
    assert q == 0.1
    rounded = float(np.float32(q))
    assert rounded > q
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader, sample_rate=np.float32(q))
    _step(model, opt, loader)
    loader.batch_sampler.sample_rate = rounded  # the loader now draws at the larger one
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [rounded, rounded]


def test_a_hand_rate_below_a_float32_loader_rate_is_charged_at_the_loaders():
    np = pytest.importorskip("numpy")
    model, opt, loader = _private(rows=100, batch_size=10)
    rounded = float(np.float32(0.1))
    loader.batch_sampler.sample_rate = rounded
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, data_loader=loader, sample_rate=0.1)
    _step(model, opt, loader)
    assert [r.mechanism.sample_rate for r in ledger.history] == [rounded]


def test_a_hand_rate_beyond_float32_rounding_is_still_refused():
    _model, opt, loader = _private(rows=100, batch_size=10)
    with pytest.raises(InvalidArgumentError) as info:
        _attach(opt, Ledger(delta=1e-5), data_loader=loader, sample_rate=0.1 * (1 + 1e-6))
    assert info.value.argument == "sample_rate"


# ---- 2. Lightning with several training loaders: a callable rate is checked at every step

def _two_loader_fit(sample_rate, steps: int):
    """A Lightning fit of ``steps`` steps on two Poisson loaders at q = 1/4 each, attached
    with ``sample_rate``; (ledger, the fit's exception or None)."""
    pl = pytest.importorskip("lightning.pytorch")
    from opacus import GradSampleModule
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizer

    from privguard.integrations.lightning import LedgerCallback

    data = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)),
                         torch.zeros(64, dtype=torch.long))

    class _Two(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = GradSampleModule(nn.Linear(4, 2))

        def training_step(self, batch, batch_idx):
            return sum(nn.functional.cross_entropy(self.net(x), y) for x, y in batch)

        def configure_optimizers(self):
            return DPOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1),
                               noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=16)

        def train_dataloader(self):
            return [DPDataLoader.from_data_loader(
                DataLoader(data, batch_size=16), generator=torch.Generator().manual_seed(s))
                for s in (0, 1)]

    ledger = Ledger(delta=1e-5)
    trainer = pl.Trainer(callbacks=[LedgerCallback(ledger, sample_rate=sample_rate)],
                         accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         max_steps=steps)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(_Two())
    except InvalidArgumentError as exc:
        return ledger, exc
    return ledger, None


def test_several_lightning_loaders_check_a_callable_rate_at_every_step():
    # the callable gave the loaders' q = 1/4 at the start (checked then) and q/100 from the
    # third call on: on main the later steps were charged q/100 for draws at q
    calls = []

    def rate() -> float:
        calls.append(None)
        return 0.25 if len(calls) <= 2 else 0.0025

    ledger, exc = _two_loader_fit(rate, steps=4)
    assert exc is not None and exc.argument == "train_dataloader"
    assert all(r.mechanism.sample_rate >= 0.25 for r in ledger.history)


def test_several_lightning_loaders_with_a_callable_rate_that_covers_them_run():
    ledger, exc = _two_loader_fit(lambda: 0.25, steps=3)
    assert exc is None and len(ledger.history) == 3


# ---- 3. DistributedPerLayerOptimizer: the bounds its backward hooks clip with

def _per_layer_step(layers_after_build: list[float]):
    """One step of a DistributedPerLayerOptimizer built with per-layer bounds (1, 1), whose
    ``max_grad_norms`` (and noise bound ``max_grad_norm``, their norm) are then set to
    ``layers_after_build``; (the charged σ, the noise bound σ·C was drawn with)."""
    def rebound(opt):
        opt.max_grad_norms = list(layers_after_build)
        opt.max_grad_norm = float(torch.norm(torch.Tensor(layers_after_build), p=2).item())

    charged, _drawn = _per_layer_noise_changed(lambda opt: None, before=rebound)
    return charged, float(torch.norm(torch.Tensor(layers_after_build), p=2).item())


@pytest.mark.usefixtures("one_rank_group")
def test_per_layer_ddp_bounds_lowered_after_build_charge_the_bounds_the_hooks_clip_at():
    # the hooks clip at the bounds of the build, ‖(1, 1)‖ = √2, whatever the list says later;
    # the noise follows max_grad_norm = ‖(0.01, 0.01)‖: σ·C/C′ = 0.01 (main charged σ = 1)
    sigma, noise_bound = _per_layer_step([0.01, 0.01])
    assert sigma == pytest.approx(1.0 * noise_bound / 2**0.5, rel=1e-6)


@pytest.mark.usefixtures("one_rank_group")
def test_per_layer_ddp_bounds_raised_after_build_over_count_never_under_count():
    # the hooks still clip at √2 (they do not follow the list); C′ is read as the larger
    # ‖(10, 10)‖ = √200, so σ·C/C′ is below the true noise multiplier σ·C/√2: an over-count
    sigma, noise_bound = _per_layer_step([10.0, 10.0])
    assert sigma == pytest.approx(1.0 * noise_bound / 200**0.5, rel=1e-6)
    assert sigma <= 1.0 * noise_bound / 2**0.5


def _per_layer_noise_changed(between, before=None) -> tuple[float, float]:
    """One step of a DistributedPerLayerOptimizer (bounds (1, 1), σ = 1) with ``before(opt)``
    called before the backward (which draws the noise) and ``between(opt)`` between it and
    step(); (the charged σ, the noise multiplier of the noise drawn, relative to the clipping
    norm ‖(1, 1)‖ = √2)."""
    from opacus import GradSampleModule
    from opacus.optimizers.ddp_perlayeroptimizer import DistributedPerLayerOptimizer

    torch.manual_seed(0)
    model = GradSampleModule(nn.Linear(4, 2))
    opt = DistributedPerLayerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       noise_multiplier=1.0, max_grad_norm=[1.0, 1.0],
                                       expected_batch_size=8)
    ledger = Ledger(delta=1e-5)
    _attach(opt, ledger, sample_rate=0.125)
    if before is not None:
        before(opt)
    opt.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(8, 4) * 100),
                                torch.zeros(8, dtype=torch.long)).backward()
    drawn = float(opt.noise_multiplier) * float(opt.max_grad_norm) / 2**0.5
    between(opt)
    opt.step()
    (record,) = ledger.history
    return record.mechanism.noise_multiplier, drawn


@pytest.mark.usefixtures("one_rank_group")
def test_per_layer_ddp_sigma_raised_between_backward_and_step_charges_the_noise_drawn():
    # its hooks draw the noise at backward with σ = 1; a schedule that raised σ to 10 before
    # step() was charged σ = 10 (an under-count): the step is charged at the noise's σ
    def raise_sigma(opt):
        opt.noise_multiplier = 10.0

    charged, drawn = _per_layer_noise_changed(raise_sigma)
    assert charged == pytest.approx(drawn, rel=1e-6) and drawn == pytest.approx(1.0)


@pytest.mark.usefixtures("one_rank_group")
def test_per_layer_ddp_noise_bound_lowered_at_backward_charges_the_noise_drawn():
    # max_grad_norm 0.1 at the backward (noise σ·0.1 on records clipped at √2), set back to
    # √2 before step(): charged σ = 1 on main, for a noise multiplier of 0.1/√2
    def lower(opt):
        opt.max_grad_norm = 0.1

    def restore(opt):
        opt.max_grad_norm = 2**0.5

    charged, drawn = _per_layer_noise_changed(restore, before=lower)
    assert drawn == pytest.approx(0.1 / 2**0.5, rel=1e-6)
    assert charged == pytest.approx(drawn, rel=1e-6)


# ---- 5. σ read once per step

def test_sigma_is_read_once_per_step_for_the_witnesses_and_the_charge():
    # with witnesses on a random-allocation loader, σ was read for the witnesses' check and
    # again for the charge; one read gives both the same value
    from opacus import PrivacyEngine

    from privguard.integrations import RandomAllocationSampler

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    sampler = RandomAllocationSampler(64, 4, generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(4, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_sampler=sampler), noise_multiplier=1.0,
            max_grad_norm=1.0, poisson_sampling=False)
    handle = _attach(opt, Ledger(epsilon=50.0, delta=1e-5), data_loader=loader,
                     witnesses=True)
    reads = []
    read = handle._sigma_and_bound  # what _sigma reads too: σ with the bound charged at
    handle._sigma_and_bound = lambda: reads.append(None) or read()
    _step(model, opt, loader)
    assert len(reads) == 1
    handle.detach()


# ---- 9. Hugging Face auto_find_batch_size with make_private's accountant: an over-count

def test_auto_find_batch_size_retry_replays_the_failed_attempts_steps_an_over_count(tmp_path):
    # A retry of accelerate's find_executable_batch_size runs the training loop again: the
    # callback attaches again and charges the steps Opacus' accountant recorded in the failed
    # attempt ("before attach"), which the first attach had already charged. Documented in
    # docs/reference.md's "Framework callbacks" (README summarises it); pinned here (counted twice, never less).
    transformers = pytest.importorskip("transformers")
    from opacus import GradSampleModule
    from opacus.accountants import RDPAccountant
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizer

    from privguard.integrations.huggingface import LedgerTrainerCallback
    from privguard.integrations.opacus import REPLAY_LABEL

    rows, batch = 64, 16

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return rows

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"x": torch.randn(4, generator=g), "labels": torch.tensor(i % 2)}

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)
            self.calls = 0

        def forward(self, x, labels=None, **unused):
            self.calls += 1
            if self.calls == 3:  # the third batch "runs out of memory", once
                raise RuntimeError("CUDA out of memory.")
            logits = self.lin(x)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    class PoissonTrainer(transformers.Trainer):
        def get_train_dataloader(self):
            return DPDataLoader.from_data_loader(DataLoader(
                self.train_dataset, batch_size=batch,
                collate_fn=transformers.default_data_collator))

    torch.manual_seed(0)
    model = GradSampleModule(Tiny())
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                      max_grad_norm=1.0, expected_batch_size=batch)
    accountant = RDPAccountant()  # what make_private hooks onto the optimizer
    opt.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=batch / rows))
    ledger = Ledger(delta=1e-5)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=batch, max_steps=3,
        auto_find_batch_size=True, report_to=[], use_cpu=True, remove_unused_columns=False,
        disable_tqdm=True, save_strategy="no")
    trainer = PoissonTrainer(model=model, args=args, train_dataset=Pairs(),
                             optimizers=(opt, None), callbacks=[LedgerTrainerCallback(ledger)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    labels = [r.label for r in ledger.history]
    assert model._module.calls > 3  # the loop ran again after the failed batch
    replayed = labels.count(REPLAY_LABEL)
    assert replayed == 2  # the failed attempt's 2 steps, charged again at the retry
    assert len(labels) == 2 + replayed + 3  # the first attempt, its replay, the retry
