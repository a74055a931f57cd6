"""Code run on each rank by tests/test_ddp.py (DPDDP + DistributedDPOptimizer over gloo)."""

from __future__ import annotations

import datetime
import traceback

N, BATCH, SIGMA, DELTA = 256, 32, 1.0, 1e-5
MAX_STEPS = 400  # a bound on every loop: a bug ends the test, never hangs it


def run(rank: int, world: int, port: int, scenario: str, workdir: str, epsilon: float,
        queue) -> None:
    """Join the process group, run ``scenario`` and put (rank, status, payload) on ``queue``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=30))
        payload = SCENARIOS[scenario](rank, workdir, epsilon)
        queue.put((rank, "ok", payload))
    except BaseException as exc:  # reported to the test, which fails with it
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _setup():
    import warnings

    import torch
    import torch.distributed as dist
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)  # the same data and initial model on every rank
    x = torch.randn(N, 8)
    model = DPDDP(nn.Linear(8, 2))
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=BATCH),
        noise_multiplier=SIGMA, max_grad_norm=1.0)
    torch.manual_seed(1000 + dist.get_rank())  # each rank samples its own batches
    return engine, model, opt, loader


def _batches(loader):
    while True:
        yield from loader


def _one_step(model, opt, batch):
    """One DP-SGD step; returns whether the parameters changed (the update was applied)."""
    import torch
    from torch import nn

    x, y = batch
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _params(model):
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def replicas(rank: int, workdir: str, epsilon: float) -> dict:
    """A ledger per rank (in memory): diverged replicas are refused at attach on every
    rank; equal replicas stay equal, charged once per global step, and stop together."""
    from privguard import Ledger
    from privguard import mechanisms as M
    from privguard.integrations.opacus import RankDisagreementError, attach

    _engine, model, opt, loader = _setup()
    out: dict = {}
    diverged = Ledger(epsilon, DELTA)
    if rank == 1:
        diverged.charge(M.Gaussian(50.0), label="only on rank 1")
    try:
        attach(opt, diverged, data_loader=loader).detach()
        out["diverged"] = "attached"
    except RankDisagreementError:
        out["diverged"] = "refused"
    ledger = Ledger(epsilon, DELTA)
    handle = attach(opt, ledger, data_loader=loader, on_exhausted="stop")
    applied, should_stop = 0, []
    for batch in _batches(loader):
        if applied + len(should_stop) > MAX_STEPS:
            break
        changed = _one_step(model, opt, batch)
        if handle.exhausted:
            out["changed_on_refusal"] = changed
            break
        applied += changed
        should_stop.append(handle.should_stop)
    out.update(applied=applied, charged=handle.steps_charged, journal=len(ledger.history),
               spent=ledger.spent.tolist(), should_stop=should_stop, params=_params(model),
               distributed=handle.distributed)
    return out


def shared_file(rank: int, workdir: str, epsilon: float) -> dict:
    """One SQLite file on every rank: 3 steps before attach are charged once at attach;
    then one charge per global step, refused on every rank at the same step."""
    return _shared(f"{workdir}/shared.db", epsilon)


def shared_server(rank: int, workdir: str, epsilon: float) -> dict:
    """One PostgreSQL ledger, each rank with its own spelling of the URL (``workdir`` holds
    them, separated by spaces): the same behaviour as one shared file."""
    return _shared(workdir.split()[rank], epsilon)


def _shared(path: str, epsilon: float) -> dict:
    from privguard import BudgetExhausted, Ledger
    from privguard.integrations.opacus import attach

    _engine, model, opt, loader = _setup()
    batches = _batches(loader)
    for _ in range(3):
        _one_step(model, opt, next(batches))
    ledger = Ledger(epsilon, DELTA, path=path)
    handle = attach(opt, ledger, data_loader=loader)  # on_exhausted="raise"
    out: dict = {"replayed": handle.steps_replayed}
    applied = 0
    for batch in batches:
        if applied > MAX_STEPS:
            break
        try:
            applied += _one_step(model, opt, batch)
        except BudgetExhausted:
            out["refused_after"] = applied
            break
    out.update(applied=applied, charged=handle.steps_charged, params=_params(model),
               journal=len(ledger.history))
    return out


def checkpoint(rank: int, workdir: str, epsilon: float) -> dict:
    """In-memory replicas through Opacus' checkpoint (saved by rank 0, loaded by every rank,
    Opacus' order); then a load on rank 0 alone meets a step on rank 1: both raise."""
    import torch.distributed as dist

    from privguard import Ledger
    from privguard.integrations.opacus import RankDisagreementError, attach

    engine, model, opt, loader = _setup()
    attach(opt, Ledger(epsilon, DELTA), data_loader=loader, privacy_engine=engine)
    batches = _batches(loader)
    for _ in range(4):
        _one_step(model, opt, next(batches))
    path = f"{workdir}/ddp.pt"
    if rank == 0:
        engine.save_checkpoint(path=path, module=model, optimizer=opt)
    dist.barrier()
    engine, model, opt, loader = _setup()
    ckpt = engine.load_checkpoint(path=path, module=model, optimizer=opt)
    ledger = Ledger(epsilon, DELTA)
    handle = attach(opt, ledger, data_loader=loader, privacy_engine=engine, resume=ckpt)
    out: dict = {"resumed": len(ledger.history), "replayed": handle.steps_replayed}
    batches = _batches(loader)
    for _ in range(2):
        _one_step(model, opt, next(batches))
    out["journal"] = len(ledger.history)
    try:
        if rank == 0:
            engine.load_checkpoint(path=path, module=model, optimizer=opt)
        else:
            _one_step(model, opt, next(batches))
        out["mismatch"] = "not detected"
    except RankDisagreementError:
        out["mismatch"] = "refused"
    out["record"] = [list(r) for r in engine.accountant.history]  # Opacus' (review rlo5)
    return out


def allocation(rank: int, workdir: str, epsilon: float) -> dict:
    """Issue 27: one global random allocation (DistributedRandomAllocationSampler), each rank
    its share of every step's batch; each epoch charged once, before its first step, on a
    ledger per rank; the epoch the filter refuses changes nothing on any rank."""
    from privguard import Ledger
    from privguard.integrations.opacus import attach

    x, model, opt, loader = _allocation_setup()
    ledger = Ledger(epsilon, DELTA)
    handle = attach(opt, ledger, data_loader=loader, on_exhausted="stop")
    shares, changed, should_stop = [], [], []
    for _epoch in range(10):
        for batch in loader:
            shares.append(batch[0][:, 0].tolist())  # x's first column identifies the record
            changed.append(_one_step(model, opt, batch))
            should_stop.append(handle.should_stop)
            if handle.exhausted:
                break
        if handle.exhausted:
            break
    return {"journal": [r.mechanism.to_dict() for r in ledger.history], "shares": shares,
            "changed": changed, "should_stop": should_stop, "exhausted": handle.exhausted,
            "params": _params(model), "records": x[:, 0].tolist()}


ALLOCATION_STEPS = 4


def _allocation_setup(ghost: bool = False):
    """DPDDP over a DistributedRandomAllocationSampler loader: (x, model, opt, loader), and
    with ``ghost`` under ghost clipping: (x, model, opt, criterion, loader)."""
    import torch
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from privguard.integrations import DistributedRandomAllocationSampler, EmptyBatchCollate

    torch.manual_seed(0)
    x = torch.randn(N, 8)
    sampler = DistributedRandomAllocationSampler(
        N, ALLOCATION_STEPS, generator=torch.Generator().manual_seed(7))
    model = DPDDP(nn.Linear(8, 2))
    engine = PrivacyEngine(accountant="rdp")
    data = TensorDataset(x, (x[:, 0] > 0).long())
    ghostly = {"criterion": nn.CrossEntropyLoss(reduction="sum"), "loss_reduction": "sum",
               "grad_sample_mode": "ghost"} if ghost else {}
    made = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_sampler=sampler, collate_fn=EmptyBatchCollate(data)),
        noise_multiplier=SIGMA, max_grad_norm=1.0, poisson_sampling=False, **ghostly)
    return (x, *made)


def allocation_uneven(rank: int, workdir: str, epsilon: float) -> dict:
    """Task hl: random allocation under DDP, rank 1 accumulating two micro-batches into the
    second step and rank 0 one. Rank 1's refusal (k > 1) is every rank's, before any update:
    before, rank 1 refused alone and rank 0 waited in the gradient all_reduce until the
    process group's timeout."""
    from torch import nn

    from privguard import Ledger, PrivguardError
    from privguard.integrations.opacus import attach

    _x, model, opt, loader = _allocation_setup()
    ledger = Ledger(epsilon, DELTA)
    attach(opt, ledger, data_loader=loader)
    batches = iter(loader)
    out: dict = {"first": _one_step(model, opt, next(batches))}
    before = _params(model)
    opt.zero_grad()
    for _ in range(1 + rank):
        x, y = next(batches)
        nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
    try:
        opt.step()
        out["second"] = "applied"
    except PrivguardError as exc:
        out["second"] = type(exc).__name__
    except RuntimeError as exc:  # gloo's timeout
        out["second"] = f"RuntimeError: {str(exc)[:100]}"
    out.update(unchanged=_params(model) == before, journal=len(ledger.history))
    return out


def allocation_sigma(rank: int, workdir: str, epsilon: float) -> dict:
    """Review rhl: random allocation under DDP with σ = 2·SIGMA on rank 1 (rank 0 adds the
    noise, at SIGMA). Every rank refuses before anything is charged, as a Poisson step with
    different σ is (Coordinator.step); before, rank 1's ledger charged the epoch at its own
    σ, twice the noise that was added: an under-count."""
    from privguard import Ledger, PrivguardError
    from privguard.integrations.opacus import attach

    _x, model, opt, loader = _allocation_setup()
    if rank == 1:
        opt.noise_multiplier = 2 * SIGMA
    ledger = Ledger(epsilon, DELTA)
    attach(opt, ledger, data_loader=loader)
    before = _params(model)
    out: dict = {}
    try:
        _one_step(model, opt, next(iter(loader)))
        out["first"] = "applied"
    except PrivguardError as exc:
        out["first"] = type(exc).__name__
    except RuntimeError as exc:  # gloo's timeout
        out["first"] = f"RuntimeError: {str(exc)[:100]}"
    out.update(unchanged=_params(model) == before,
               charged=[r.mechanism.noise_multiplier for r in ledger.history])
    return out


def witnesses(rank: int, workdir: str, epsilon: float) -> dict:
    """attach(..., witnesses=True) on one shared file: 10 clean steps pass (the δ reserve
    charged once in all); then rank 0 adds no noise (as the other ranks do by design): its
    noise witness refuses the step on both ranks, before any charge or update, and every
    later step too."""
    from privguard import Ledger, PipelineMismatchError
    from privguard.integrations.opacus import attach

    _engine, model, opt, loader = _setup()
    ledger = Ledger(epsilon, DELTA, path=f"{workdir}/witnessed.db", lease=1)  # exact counts
    handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    batches = _batches(loader)
    out: dict = {"active": list(handle.witnesses.active), "applied": 0, "refusals": []}
    for _ in range(10):
        out["applied"] += _one_step(model, opt, next(batches))
    out["clean_journal"] = len(ledger.history)
    if rank == 0:  # the bug: rank 0's noise is gone
        def add_no_noise():
            for p in opt.params:
                p.grad = p.summed_grad.clone().view_as(p)  # σ = 0 in effect

        opt.add_noise = add_no_noise
        # every step is checked: the refusal is at step 11 exactly
    before = _params(model)
    for _ in range(2):
        try:
            _one_step(model, opt, next(batches))
            out["refusals"].append(None)
        except PipelineMismatchError as exc:
            out["refusals"].append((exc.witness, exc.step, str(exc)[:200]))
    out.update(unchanged=_params(model) == before, journal=len(ledger.history),
               should_stop=handle.should_stop, charged=handle.steps_charged)
    return out


def witness_precision(rank: int, workdir: str, epsilon: float) -> dict:
    """Review rwl: after 3 clean steps rank 0's noise witness finds that the gradients' dtype
    cannot hold the charged noise (the precision guard; simulated by a unit roundoff of 10).
    That refusal is a function of the noisy gradient: the step is charged once, on every rank
    together, then refused everywhere (not applied); later steps are refused uncharged."""
    from privguard import Ledger, PipelineMismatchError
    from privguard.integrations.opacus import attach

    _engine, model, opt, loader = _setup()
    ledger = Ledger(epsilon, DELTA, path=f"{workdir}/precision.db", lease=1)  # exact counts
    handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    batches = _batches(loader)
    out: dict = {"applied": sum(_one_step(model, opt, next(batches)) for _ in range(3)),
                 "refusals": []}
    out["clean_journal"] = len(ledger.history)
    if rank == 0:
        handle.witnesses._buf.unit_max = 10.0  # the layout of the clean steps, kept
    before = _params(model)
    for _ in range(2):
        try:
            _one_step(model, opt, next(batches))
            out["refusals"].append(None)
        except PipelineMismatchError as exc:
            out["refusals"].append((exc.witness, exc.step, getattr(exc, "step_charged", None),
                                    str(exc)[:200]))
        out.setdefault("journals", []).append(len(ledger.history))
    out.update(unchanged=_params(model) == before, should_stop=handle.should_stop)
    return out


def witness_clipping(rank: int, workdir: str, epsilon: float) -> dict:
    """Review rt: rank 1's clipping turned off after 3 clean steps. Its clipping witness
    fires inside Opacus' clip_and_accumulate, before the step's collective: the refusal
    must still be taken on both ranks at the same step (no rank left waiting in the
    collective), nothing charged or applied."""
    from privguard import Ledger, PipelineMismatchError
    from privguard.integrations.opacus import attach

    _engine, model, opt, loader = _setup()
    ledger = Ledger(epsilon, DELTA)
    handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    batches = _batches(loader)
    out: dict = {"applied": 0, "refusals": []}
    for _ in range(3):
        out["applied"] += _one_step(model, opt, next(batches))
    out["clean_charged"] = handle.steps_charged
    if rank == 1:  # the bug: the per-sample gradients are summed unclipped
        def clip_and_accumulate():
            for p in opt.params:
                grad = opt._get_flat_grad_sample(p).sum(0) * 1e3
                p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
        handle.witnesses._original = clip_and_accumulate
        handle.witnesses._clip_checked = False  # the exact check runs on the next micro-batch
    before, charged = _params(model), handle.steps_charged
    for _ in range(2):
        try:
            _one_step(model, opt, next(batches))
            out["refusals"].append(None)
        except PipelineMismatchError as exc:
            out["refusals"].append((exc.witness, exc.step, str(exc)[:300]))
    out.update(unchanged=_params(model) == before, nothing_charged=handle.steps_charged == charged,
               should_stop=handle.should_stop)
    return out


def witness_sampling(rank: int, workdir: str, epsilon: float) -> dict:
    """Each rank's sampling witness tests the batch sizes its distributed sampler yields
    (zero-truncated Binomial(n, q) from its shard of n = N/2 records): 5 clean steps pass;
    then rank 1 draws each record of its shard at 2q (its sampler still says q, as a
    sampler the charge does not describe would): its witness refuses the step on both
    ranks, before any charge or update."""
    import torch

    from privguard import Ledger, PipelineMismatchError
    from privguard.integrations.opacus import attach

    _engine, model, opt, loader = _setup()
    ledger = Ledger(epsilon, DELTA)
    handle = attach(opt, ledger, data_loader=loader, witnesses=True)
    batches = _batches(loader)
    out: dict = {"active": list(handle.witnesses.active), "shard": handle.witnesses.dataset_size,
                 "applied": 0, "refusals": []}
    for _ in range(5):
        out["applied"] += _one_step(model, opt, next(batches))
    out["clean_charged"] = handle.steps_charged
    if rank == 1:  # the bug: rank 1's draws take each record at 2q
        rand = torch.rand
        torch.rand = lambda *args, **kwargs: rand(*args, **kwargs) * 0.5
    for _ in range(MAX_STEPS):
        before, charged = _params(model), handle.steps_charged
        try:
            _one_step(model, opt, next(batches))
        except PipelineMismatchError as exc:
            out["refusals"].append((exc.witness, exc.step, str(exc)[:300]))
            out.update(unchanged=_params(model) == before,
                       nothing_charged=handle.steps_charged == charged)
            break
    out.update(charged=handle.steps_charged, should_stop=handle.should_stop)
    return out


def aligned(rank: int, workdir: str, epsilon: float) -> dict:
    """Issue a27: the aligned opt-in's dropout re-check under DDP, inside the step's own
    collective. Dropout switched on on every rank: refused on every rank by name, nothing
    charged or updated. On rank 1 only: refused on both ranks (rank 0 as a rank
    disagreement), nothing charged or updated (review rgc: the ranks agree on the step
    before any charge; rank 0 had charged its replica before)."""
    import torch
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from privguard import InvalidArgumentError, Ledger
    from privguard.integrations.opacus import RankDisagreementError, attach

    torch.manual_seed(0)
    x = torch.randn(N, 8)
    dropout = nn.Dropout(0.5)
    model = DPDDP(nn.Sequential(nn.Linear(8, 8), dropout, nn.Linear(8, 2)))
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=BATCH),
        noise_multiplier=SIGMA, max_grad_norm=1.0)
    torch.manual_seed(1000 + rank)
    dropout.eval()
    ledger = Ledger(epsilon, DELTA)
    attach(opt, ledger, data_loader=loader, aligned_micro_batches=True, model=model)
    batches = _batches(loader)
    out: dict = {"applied": sum(_one_step(model, opt, next(batches)) for _ in range(2))}
    for ranks in ((0, 1), (1,)):
        dropout.train(rank in ranks)
        before = _params(model)
        try:
            _one_step(model, opt, next(batches))
            refused = None
        except (InvalidArgumentError, RankDisagreementError) as exc:
            refused = (type(exc).__name__, str(exc)[:300])
        out[ranks] = dict(refused=refused, unchanged=_params(model) == before,
                          journal=len(ledger.history))
    return out


def _accumulated_step(model, opt, batches, micro_batches: int) -> None:
    """One real step over ``micro_batches`` Poisson batches (backward() each, one step())."""
    from torch import nn

    opt.zero_grad()
    for _ in range(micro_batches):
        x, y = next(batches)
        nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def uneven(rank: int, workdir: str, epsilon: float) -> dict:
    """Review rgc: ranks accumulating different numbers of micro-batches into one global
    step. On one shared file (rank 0 charges it) rank 1 accumulates 2 batches per step and
    rank 0 one: each global step holds the draws of every rank and is charged with the
    largest k of any rank (rank 0 charged its own k = 1). A ledger attached then to the same
    engine would replay the steps each rank's Opacus accountant recorded, which differ
    (q on rank 0, 2q on rank 1): refused on every rank, nothing charged. On a fresh engine,
    an in-memory ledger per rank, rank 0 accumulating 3 and rank 1 one: k = 3 on both."""
    from privguard import Ledger
    from privguard.integrations.opacus import RankDisagreementError, attach

    _engine, model, opt, loader = _setup()
    model.allow_grad_accumulation()  # make_private's Poisson loader forbids it otherwise
    batches = _batches(loader)
    shared = Ledger(epsilon, DELTA, path=f"{workdir}/uneven.db", lease=1)  # exact counts
    handle = attach(opt, shared, data_loader=loader)
    for _ in range(3):
        _accumulated_step(model, opt, batches, 2 if rank == 1 else 1)
    out: dict = {"shared": [r.mechanism.to_dict() for r in shared.history],
                 "shared_next": handle.next_mechanism().to_dict()}
    handle.detach()
    late = Ledger(epsilon, DELTA)
    try:
        attach(opt, late, data_loader=loader)
        out["replayed"] = "attached"
    except RankDisagreementError as exc:
        out["replayed"] = str(exc)[:300]
    out["late"] = len(late.history)
    _engine, model, opt, loader = _setup()
    model.allow_grad_accumulation()
    batches = _batches(loader)
    replica = Ledger(epsilon, DELTA)
    handle = attach(opt, replica, data_loader=loader)
    for _ in range(2):
        _accumulated_step(model, opt, batches, 3 if rank == 0 else 1)
    out.update(replica=[r.mechanism.to_dict() for r in replica.history],
               spent=replica.spent.tolist(), params=_params(model),
               charged=handle.steps_charged)
    return out

SCENARIOS = {"aligned": aligned, "witness_precision": witness_precision, "witness_clipping": witness_clipping, "witness_sampling": witness_sampling, "witnesses": witnesses, "replicas": replicas, "shared_file": shared_file, "shared_server": shared_server,
             "checkpoint": checkpoint, "allocation": allocation, "uneven": uneven,
             "allocation_uneven": allocation_uneven, "allocation_sigma": allocation_sigma}


def _ghost_ddp(rank: int, adaptive: bool = False):
    """make_private with ghost clipping of a DPDDP linear model (the same data on every
    rank; each rank's Poisson draws seeded by its rank); ``adaptive``: by Opacus'
    ``PrivacyEngineAdaptiveClipping`` (task adv6)."""
    import torch
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(N, 8)
    model = DPDDP(nn.Linear(8, 2))
    extra: dict = {}
    engine = PrivacyEngine
    if adaptive:
        from opacus.utils.adaptive_clipping import PrivacyEngineAdaptiveClipping

        engine = PrivacyEngineAdaptiveClipping
        extra = dict(target_unclipped_quantile=0.5, min_clipbound=0.01, max_clipbound=10.0,
                     clipbound_learning_rate=0.2)
    made = engine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=BATCH),
        criterion=nn.CrossEntropyLoss(), noise_multiplier=SIGMA, max_grad_norm=1.0,
        grad_sample_mode="ghost", **extra)
    torch.manual_seed(1000 + rank)
    return made


def interplay(rank: int, workdir: str, epsilon: float) -> dict:
    """Review ir: the merged branches together under DDP. Ghost clipping (gc: backward
    passes counted at the optimizer), an iterator made before attach (only that count sees
    k), rank 1 accumulating two backward() a step and rank 0 one (rgc: the largest k), one
    shared SQLite file with the default leases and prefetch (on under attach; pl: the
    prefetch thread holds _txn across its commit), a DataLoader worker forked between
    steps (the at-fork hook waits for a prefetch in flight), then a step() on rank 1 after
    a skipped one with no backward between (rgc: refused on every rank, nothing charged),
    then training on."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from privguard import Ledger, PrivguardError
    from privguard.integrations.opacus import attach

    model, opt, criterion, loader = _ghost_ddp(rank)
    batches = _batches(loader)
    next(batches)  # the iterator is made before attach: the loader counter never sees it
    ledger = Ledger(epsilon, DELTA, path=f"{workdir}/interplay.db")  # default leases
    handle = attach(opt, ledger, data_loader=loader)
    side = DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2, num_workers=1,
                      multiprocessing_context="fork")

    def backward(times):
        for _ in range(times):
            xb, yb = next(batches)
            criterion(model(xb), yb).backward()

    def step(times):
        before = _params(model)
        opt.zero_grad()
        backward(times)
        opt.step()
        return _params(model) != before

    out: dict = {"applied": 0, "forks": 0}
    for i in range(40):
        out["applied"] += step(2 if rank == 1 else 1)
        if i % 3 == 0:  # a worker forked while the charger's prefetch may hold _txn
            out["forks"] += len(list(side))
    out["charged_before"] = handle.steps_charged
    opt.zero_grad()
    backward(1)
    opt.signal_skip_step(do_skip=True)
    opt.step()  # skipped on every rank
    if rank == 0:
        backward(1)
    before = _params(model)
    try:
        opt.step()  # rank 1: the skipped step's batch would be added again
        out["refused"] = None
    except PrivguardError as exc:
        out["refused"] = type(exc).__name__
    out["unchanged"] = _params(model) == before
    out["charged_after_refusal"] = handle.steps_charged
    for _ in range(5):
        out["applied"] += step(2 if rank == 1 else 1)
    out["charged"] = handle.steps_charged
    out["prefetch"] = ledger._prefetch
    handle.detach()
    ledger.close()
    return out


SCENARIOS["interplay"] = interplay


def ghost_unclipped(rank: int, workdir: str, epsilon: float) -> dict:
    """Task gz: under DDP ghost clipping, rank 1 backpropagates a plain criterion's loss at
    one step (its gradient unclipped): that step is refused on every rank, inside the step's
    first collective, nothing charged nor applied anywhere; then training goes on."""
    from torch import nn

    model, opt, criterion, loader = _ghost_ddp(rank)
    batches = _batches(loader)
    return _unclipped_on_rank_1(rank, epsilon, model, opt, loader, criterion,
                                nn.CrossEntropyLoss(), (next(batches) for _ in range(4)))


def _unclipped_on_rank_1(rank, epsilon, model, opt, loader, criterion, plain, batches) -> dict:
    """Attach a ledger replica and step on ``batches``, rank 1 backpropagating ``plain``'s
    loss (not the wrapped one) at the second step: what each step raised, whether it
    left the parameters unchanged, and the steps charged."""
    def backward(i, xb, yb):
        (plain if i == 1 and rank == 1 else criterion)(model(xb), yb).backward()

    return _watched_steps(epsilon, model, opt, loader, batches, backward)


def _watched_steps(epsilon, model, opt, loader, batches, backward) -> dict:
    """Attach a ledger replica and step on ``batches`` (``backward(i, x, y)``: step i's
    backward): what each step raised, whether it left the parameters unchanged, and the
    steps charged."""
    from privguard import Ledger, PrivguardError
    from privguard.integrations.opacus import attach

    ledger = Ledger(epsilon, DELTA)  # a replica per rank
    handle = attach(opt, ledger, data_loader=loader)
    out: dict = {"refused": [], "unchanged": []}
    for i, (xb, yb) in enumerate(batches):
        opt.zero_grad()
        backward(i, xb, yb)
        before = _params(model)
        try:
            opt.step()
            out["refused"].append(None)
        except PrivguardError as exc:
            out["refused"].append(type(exc).__name__)
        out["unchanged"].append(_params(model) == before)
    out["charged"] = handle.steps_charged
    out["history"] = len(ledger.history)
    handle.detach()
    return out


SCENARIOS["ghost_unclipped"] = ghost_unclipped


def allocation_ghost_unclipped(rank: int, workdir: str, epsilon: float) -> dict:
    """Review ir2: random allocation under DDP ghost clipping, rank 1 backpropagating a plain
    criterion's loss (its gradient unclipped) at the second step. That step is refused on
    every rank before anything is charged or applied, as a Poisson step's is
    (ghost_unclipped); before, the allocation path never ran the ghost check under DDP, and
    the unclipped step was applied (the epoch charged as if clipped)."""
    from torch import nn

    _x, model, opt, criterion, loader = _allocation_setup(ghost=True)
    return _unclipped_on_rank_1(rank, epsilon, model, opt, loader, criterion,
                                nn.CrossEntropyLoss(reduction="sum"), iter(loader))


SCENARIOS["allocation_ghost_unclipped"] = allocation_ghost_unclipped


def agree_unserialisable(rank: int, workdir: str, epsilon: float) -> dict:
    """Task lo: ``Coordinator.agree`` with descriptions that are not JSON (a numpy scalar on
    one rank, NaN on both, an object on the other rank): every rank raises a privguard
    error in the same collective (the rank that could not digest its list had raised
    TypeError before the all-gather, the other waited there), then the ranks still agree."""
    import numpy as np

    from privguard import Ledger, PrivguardError
    from privguard.integrations._distributed import Coordinator

    coordinator = Coordinator(Ledger(epsilon, DELTA))
    cases = {"numpy scalar on rank 1": [np.float32(1.0)] if rank == 1 else [1.0],
             "nan on every rank": [float("nan")],
             "object on rank 0": [object()] if rank == 0 else [1]}
    raised = {}
    for case, charges in cases.items():
        try:
            coordinator.agree(charges, f"in case {case}")
            raised[case] = None
        except Exception as exc:
            raised[case] = (type(exc).__name__, isinstance(exc, PrivguardError), str(exc))
    coordinator.agree([[STEP_DICT, 2]], "after the refusals")  # still in step
    return {"raised": raised}


STEP_DICT = {"type": "subsampled_gaussian", "params": {"noise_multiplier": SIGMA}}
SCENARIOS["agree_unserialisable"] = agree_unserialisable


def replaced_hook(rank: int, workdir: str, epsilon: float) -> dict:
    """Review rsmp: a step hook set after attach (``optimizer.attach_step_hook``) that does
    not call privguard's, first on rank 1 only, then on both ranks. Before, rank 1 was
    handed its steps uncharged and entered the gradient all_reduce while rank 0 waited in
    the charge's collective (a hang), and with the hook replaced on every rank each step
    was handed to it and refused uncharged. Now every rank charges each step together,
    before the replacing hook sees it, and the replicas stay equal."""
    from privguard import Ledger
    from privguard.integrations.opacus import attach

    _engine, model, opt, loader = _setup()
    batches = _batches(loader)
    ledger = Ledger(epsilon, DELTA)
    handle = attach(opt, ledger, data_loader=loader)
    seen: list[int] = []

    def logging_hook(optimizer) -> None:
        seen.append(len(ledger.history))

    applied = []
    for step in range(4):
        if step == (0 if rank == 1 else 2):
            opt.attach_step_hook(logging_hook)
        applied.append(_one_step(model, opt, next(batches)))
    out = {"seen": seen, "applied": applied, "charged": handle.steps_charged,
           "history": len(ledger.history), "params": _params(model)}
    handle.detach()
    return out


SCENARIOS["replaced_hook"] = replaced_hook


def ghost_adaptive(rank: int, workdir: str, epsilon: float) -> dict:
    """Task adv6 (e): Opacus' adaptive ghost clipping under DDP, attached without the engine:
    the first step is refused on every rank inside the step's collective (the criterion's
    backward set ``_adjusted_noise_multiplier``), nothing charged or applied, no hang."""
    model, opt, criterion, loader = _ghost_ddp(rank, adaptive=True)
    batches = _batches(loader)
    return _adjusted_steps(model, opt, loader, criterion, [next(batches) for _ in range(2)],
                           lambda i: False)


def ghost_adjusted_rank_1(rank: int, workdir: str, epsilon: float) -> dict:
    """Task adv6 (e): plain ghost clipping under DDP, rank 1 alone sets
    ``_adjusted_noise_multiplier`` below σ at the second step: refused on both ranks."""
    model, opt, criterion, loader = _ghost_ddp(rank)
    batches = _batches(loader)
    return _adjusted_steps(model, opt, loader, criterion, [next(batches) for _ in range(3)],
                           lambda i: i == 1 and rank == 1)


def _adjusted_steps(model, opt, loader, criterion, batches, adjust) -> dict:
    """:func:`_watched_steps` with the wrapped loss, the optimizer's
    ``_adjusted_noise_multiplier`` set to 0.5 for step i's backward and step where
    ``adjust(i)``."""
    def backward(i, xb, yb):
        if adjust(i):
            opt._adjusted_noise_multiplier = 0.5
        elif "_adjusted_noise_multiplier" in vars(opt) and not adjust(i - 1):
            pass  # set by Opacus' adaptive criterion itself: left as it is
        elif "_adjusted_noise_multiplier" in vars(opt):
            del opt._adjusted_noise_multiplier  # set by hand for the step before
        criterion(model(xb), yb).backward()

    return _watched_steps(50.0, model, opt, loader, batches, backward)


SCENARIOS["ghost_adaptive"] = ghost_adaptive
SCENARIOS["ghost_adjusted_rank_1"] = ghost_adjusted_rank_1
