"""Several Poisson batches through one ``backward()``: their rows are paired (private).

Opacus' hooks (``GradSampleModule``) compute the per-sample gradients of one
``backward()`` by adding, row by row, the rows of every forward pass that
backward ran through (``create_or_accumulate_grad_sample`` in
``opacus/grad_sample/grad_sample_module.py``: ``_current_grad_sample[:n] +=
grad_sample``, promoted to one ``grad_sample`` entry when the module's forward
counter reaches 0). That is what makes weight tying, an RNN's time steps and two
forwards of the *same* records (augmentations, consistency regularisation)
right: row i stays record i's. Two *different* batches x¹, x² through one
``backward()`` (``crit(model(x1), y1) + crit(model(x2), y2)``) give rows
g(x¹ᵢ) + g(x²ᵢ), each clipped once: one record added to x¹ moves every later row
of x¹ against x², so the clipped sum moves by up to 2C per row, not by C
(docs/theory.md §14.9). Such a step is neither ``SubsampledGaussian(σ, q)`` nor
``AccumulatedSubsampledGaussian(σ, q, 2)``.

Neither the rows nor the loader alone tell it from a sound loop (a batch split
by hand over skipped steps, a batch drawn ahead, two iterators of one loader
hold fewer rows than the records delivered at a clip; the same batch twice runs
two forwards through one backward). :class:`PairingCheck` takes both: Opacus'
accumulation into ``_current_grad_sample`` is wrapped once per process
(:func:`watch_opacus`; a flag on the parameter, nothing else changes) to mark a
parameter that a backward reached through several forward passes, and at each
clip (Opacus' ``clip_and_accumulate``, real or skipped step), where *every*
parameter holding per-sample gradients is so marked (several forwards of the
whole model: weight tying and an RNN mark only their own layers) and the rows
the optimizer holds (the leading dimensions of a parameter's ``grad_sample``
entries) are fewer than the records of the batches the training loader handed
to the loop since the last clip (``MicroBatchCounter.sizes``), the clip is
marked and the real step refused before its charge (:meth:`PairingCheck.check`).
A loop known to fetch ``ahead`` batches before training on them (Lightning's
fetcher) may hold that many of the window's last batches for the next clip.
The sound cases keep a row per record and are charged as before.

Review radv6: (1) one batch through several ``backward()`` calls (two views of a
batch, each backpropagated on its own) holds an entry per pass: a record at
weight 2 in one Poisson draw, its sum moved by 2C with probability q, which
``AccumulatedSubsampledGaussian(σ, q, k)`` (k *independent* draws, a record in
each with probability q) does not cover (σ = 1, q = 1/8, 8 steps: ε ≈ 11.6 charged,
20.3 for the ``SubsampledGaussian(σ/2, q)`` it is, δ = 1e-5); a clip holding more
passes than batches and more rows than records is refused. (2) The batches an
unmarked clip leaves (drawn ahead) stay held for the next clip (adv6 dropped
them, so a later marked clip compared its rows with the wrong batch). (3) The
wrapper carries a tag: it is made once even across an ``importlib.reload``, and
a clip that finds Opacus' function unwrapped (a reload) or missing (renamed) is
treated as marked (fail closed) and wraps it again. No process-wide counter:
only the parameters' own flags, so threads training other models do not meet.
The wrap cannot move to public hooks: ``attach`` is given the optimizer, not the
module whose forwards would be watched.

Not seen: a second batch that is not from the counted loader (another
loader), a model with no parameter outside tied or recurrent layers run on the
same batch twice while the loop holds a batch drawn ahead (refused: fail
closed), any marked clip (the same batch twice in one backward) of a loop that
draws a batch ahead without Lightning (refused: fail closed), one batch through
several backward() calls while the loop holds a batch drawn ahead or across
skipped steps, and one batch concatenated with its own augmentation in one
forward (rows 2n, one pass): charged as on main, under-counts left open, a clip
accumulating a batch of another loader without a skipped step (refused: fail
closed), anything under ``BatchMemoryManager`` (its physical batches come
from a loader of its own, which is not counted: review radv6), a Lightning step
over a loader without ``len()`` (fetched one ahead) that pairs its batch with one
drawn by hand at least as large as it and the batch drawn ahead together (held as
drawn ahead: refused a step later, after that step's charge), Opacus' ``grad_sample_mode="ew"`` (no accumulation to watch), ghost clipping (no ``grad_sample``; its wrapped loss
checks its own backward passes, ``integrations/_ghost.py``), Opacus'
``DistributedPerLayerOptimizer`` (it clips inside ``backward()``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from privguard._errors import InvalidArgumentError
from privguard.integrations._describe import MicroBatchCounter, first_grad_sample

_MARK = "_privguard_forwards"  # set on a parameter one backward reached through 2+ forwards
# review radv6: the wrapper carries this attribute (so an ``importlib.reload`` of either
# module neither wraps twice nor loses the wrap unseen: :func:`watched` reads it at each clip)
_TAG = "_privguard_watch"


@functools.lru_cache(maxsize=1)
def _module() -> Any:
    """Opacus' ``grad_sample_module`` (a reload keeps the module object)."""
    try:
        from opacus.grad_sample import grad_sample_module as gsm
    except ImportError:  # pragma: no cover - opacus is a dependency of the integration
        return None
    return gsm


def watched() -> bool:
    """Whether Opacus' ``create_or_accumulate_grad_sample`` is (still) wrapped."""
    gsm = _module()
    return getattr(getattr(gsm, "create_or_accumulate_grad_sample", None), _TAG, False) is True


def watch_opacus() -> bool:
    """Wrap Opacus' ``create_or_accumulate_grad_sample`` (once: a wrapped one is left as it
    is): a second accumulation into a parameter's ``_current_grad_sample`` within one
    backward marks it. False where Opacus has no such function (nothing is watched: the
    check then treats every clip as marked, review radv6)."""
    gsm = _module()
    original = getattr(gsm, "create_or_accumulate_grad_sample", None)
    if original is None:
        return False
    if getattr(original, _TAG, False) is True:
        return True

    wrapper = _marking(original)
    setattr(wrapper, _TAG, True)
    gsm.create_or_accumulate_grad_sample = wrapper
    return True


#: Opacus' ``create_or_accumulate_grad_sample(*, param, grad_sample, max_batch_len)`` (1.4-1.6)
_OPACUS_ARGUMENTS = ("param", "grad_sample", "max_batch_len")


def _keywords_only(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` itself takes exactly Opacus' three arguments, by keyword only, none
    with a default (a wrapper's own signature, not the one it wraps)."""
    try:
        params = inspect.signature(fn, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the general wrapper
        return False
    return tuple(p.name for p in params) == _OPACUS_ARGUMENTS and all(
        p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
        for p in params)


def _marking(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` wrapped to mark a parameter that a backward reached through another
    forward already (its ``_current_grad_sample`` is there), then run as it is.

    It runs once per parameter per backward (task hk3). Where ``original`` has Opacus'
    keyword-only signature, the wrapper has the same one: it takes and passes the three
    arguments by name, without packing them into a tuple and a dict and unpacking them
    again (three times cheaper a call in a loop); a call that signature refuses is refused
    by the wrapper with the same ``TypeError`` (before the mark: the backward fails either
    way). Otherwise the general ``*args, **kwargs`` wrapper."""
    if _keywords_only(original):
        @functools.wraps(original)
        def create_or_accumulate_grad_sample(*, param: Any, grad_sample: Any,
                                             max_batch_len: Any) -> Any:
            if hasattr(param, "_current_grad_sample"):  # the same backward, another forward
                param._privguard_forwards = True  # _MARK
            return original(param=param, grad_sample=grad_sample, max_batch_len=max_batch_len)

        return create_or_accumulate_grad_sample

    @functools.wraps(original)
    def create_or_accumulate_grad_sample_(*args: Any, **kwargs: Any) -> Any:
        try:
            param = kwargs["param"]  # Opacus passes it by keyword
        except KeyError:
            param = args[0] if args else None
        if hasattr(param, "_current_grad_sample"):  # the same backward, another forward
            param._privguard_forwards = True  # _MARK
        return original(*args, **kwargs)

    return create_or_accumulate_grad_sample_


def _every_param_marked(params: Iterable[Any]) -> bool:
    """Whether every parameter holding per-sample gradients was marked (and unmark all).

    ``params``: the optimizer's. The first such parameter unmarked answers at once (a plain
    step: one look); marks left on later parameters only widen the next answer (fail
    closed)."""
    every, seen = True, False
    for p in params:
        if getattr(p, "grad_sample", None) is None:
            continue
        if getattr(p, _MARK, False):
            setattr(p, _MARK, False)
        elif not seen:
            return False
        else:
            every = False
        seen = True
    return seen and every


def held_rows(params: Iterable[Any]) -> tuple[int, int] | None:
    """(entries, rows) of the first of ``params`` (an optimizer's) holding per-sample
    gradients, or None.

    An entry is one ``backward()`` (``grad_sample`` is a list after several); its
    rows are the leading dimension Opacus put the batch in (the entries of
    :func:`~privguard.integrations._describe.first_grad_sample`, as ``held_sets``)."""
    gs = first_grad_sample(params)
    if gs is None:
        return None
    if isinstance(gs, list):
        return len(gs), sum(int(t.shape[0]) for t in gs)
    return 1, int(gs.shape[0])


_PAIRED = (
    "Fewer rows than records: several batches went through one backward() (Opacus adds "
    "their per-sample gradients row by row, so one record moves the rows of the other "
    "batch's records and the sum is not C-sensitive: docs/theory.md §14.9), or the loop "
    "drew a batch it did not train on (a batch drawn ahead, a batch left out), which "
    "privguard cannot tell apart.")
_REUSED = (
    "More backward() passes than batches: a batch went through several backward() calls, "
    "so a record is in several rows of one Poisson draw: its sum moves by 2C with probability q, which "
    "AccumulatedSubsampledGaussian(σ, q, k) (k independent draws) does not cover "
    "(docs/theory.md §14.9, review radv6).")


class PairingCheck:
    """Marks a clip whose per-sample rows are fewer than the records delivered for it."""

    def __init__(self, optimizer: Any, counter: Callable[[], MicroBatchCounter | None],
                 ahead: int = 0) -> None:
        self.optimizer = optimizer
        self._counter = counter  # read live: Lightning moves it to a reloaded loader
        self.ahead = ahead  # batches the loop fetches before training on them
        self._held: list[int] = []  # sizes of batches delivered, not yet clipped
        self._sizes: list[int] | None = None  # the counter's list at the last clip
        self._seen = 0  # how much of it the last clip took in
        self.failure: tuple[str, str] | None = None  # what a marked clip saw, and why
        self._own: Any = None
        self._counted = False  # the counter saw a batch (an iterator made before attach: not)

    def install(self) -> None:
        """Start recording the loader's batch sizes; wrap the optimizer's
        ``clip_and_accumulate`` (an instance attribute)."""
        watch_opacus()
        counter = self._counter()
        if counter is not None:
            if counter.sizes is None:
                counter.sizes = []
            self._sizes, self._seen = counter.sizes, len(counter.sizes)
        optimizer = self.optimizer
        self._saved = vars(optimizer).get("clip_and_accumulate")
        original = optimizer.clip_and_accumulate

        def clip_and_accumulate(*args: Any, **kwargs: Any) -> Any:
            self.see()
            return original(*args, **kwargs)

        self._own = clip_and_accumulate
        optimizer.clip_and_accumulate = clip_and_accumulate

    def restore(self) -> None:
        """Give the optimizer its ``clip_and_accumulate`` back (if still ours)."""
        if self._own is not None and vars(self.optimizer).get("clip_and_accumulate") is self._own:
            if self._saved is None:
                del self.optimizer.clip_and_accumulate
            else:
                self.optimizer.clip_and_accumulate = self._saved
        self._own = None

    def _window(self) -> list[int] | None:
        """Sizes of the batches delivered since the last clip (None: not known)."""
        counter = self._counter()
        if counter is None:
            return None
        sizes = counter.sizes
        if sizes is None:  # start recording; this window is not known
            counter.sizes = self._sizes = []
            self._seen = 0
            return None
        if sizes is not self._sizes:  # a new counter or list: its first window is unknown
            self._sizes, self._seen = sizes, len(sizes)
            self._held = []
            return None
        if len(sizes) < self._seen:  # cleared by the counter's take() (a real step)
            self._seen = 0
        new = sizes[self._seen:]
        self._seen = len(sizes)
        return new

    def see(self) -> None:
        """Opacus is about to clip what the optimizer holds: compare it with what the
        loader delivered since the last clip (and what an earlier clip left held)."""
        new = self._window()
        if new is None:
            return
        window = self._held + new if self._held else new
        self._held = []
        if not (new or self._counted):  # no batch counted yet (an iterator made before
            return  # attach): nothing to compare (task hk3: the rows are not read either)
        self._counted = True
        # the optimizer's parameters read once (Opacus builds the list at each read), for
        # the rows and the marks: nothing between the two reads changes them (task hk3)
        params = getattr(self.optimizer, "params", ())
        if not isinstance(params, (list, tuple)):
            params = list(params)
        held = held_rows(params)
        if held is None:
            return
        entries, rows = held
        # one backward (entries 1, the common case) leaves at the first comparison: 1 >
        # max(len(window), 1) is false, so this refusal cannot be reached (task hk3)
        if entries > max(len(window), 1) and min(window, default=0) >= 0 and rows > sum(window):
            # review radv6: one clip holds more backward() passes than batches, and more
            # rows than records: one batch went through several (a record at weight 2 in
            # one Poisson draw, which Accumulated(σ, q, k) does not cover). A clip of one
            # pass each (skipped steps) is left to the counts, as on main: a micro-batch
            # from another loader or an iterator made before attach is not counted here.
            # the message names counts of batches and passes only: the records and rows
            # are drawn batch sizes, which depend on who is in the data (not shown)
            self._fail(f"the data loader handed the loop {len(window)} batch(es) since the "
                       f"optimizer last clipped (with those drawn ahead before), and it "
                       f"clipped {entries} backward() passes holding more per-sample rows "
                       f"than those batches' records", _REUSED)
            return
        # an unmarked clip: up to `ahead` batches after those trained on were drawn ahead
        # (review radv6: adv6 forgot them here, and compared a later marked clip's rows
        # with the batch after its own)
        keep = min(self.ahead, max(len(window) - entries, 0))
        self._held = window[len(window) - keep:] if keep else []
        # the marks are read even where the rows cover the window (one batch, one backward):
        # this clip clears them, and a mark left would make a later clip look marked, a
        # refusal main does not make (task hk3: not skipped)
        if not watched():  # Opacus renamed it, or a reload unwrapped it: this clip is
            watch_opacus()  # marked (fail closed), later backward passes watched again
        elif not _every_param_marked(params):
            return  # one forward per backward, or tied weights, an RNN's layers
        if not window or min(window) < 0:  # nothing delivered (a batch split over skipped
            return  # steps), or a size not readable
        # docs/theory.md §14.9: a row per record; the last `ahead` batches may wait
        for h in range(min(self.ahead, len(window) - 1) + 1):
            used = window[:len(window) - h]
            if rows >= sum(used):
                self._held = window[len(window) - h:]
                return
        self._fail(f"the data loader handed the loop {len(window)} batch(es) since the "
                   f"optimizer last clipped, and it clipped {entries} backward() pass(es) "
                   f"holding fewer per-sample rows than those batches' records", _PAIRED)

    def _fail(self, seen: str, why: str) -> None:
        if self.failure is None:
            self.failure = seen, why

    def check(self, step: int) -> None:
        """Refuse the real step (the ``step``-th of the handle) if a clip was marked."""
        if self.failure is None:
            return
        seen, why = self.failure
        raise InvalidArgumentError(
            "optimizer", type(self.optimizer).__name__,
            f"step {step}: {seen}. {why} The step is refused, nothing charged or applied; "
            f"run one backward() per batch (accumulate: backward() on each, then step()), "
            f"and draw each batch in the step that trains on it")

    def take(self) -> None:
        """The real step was charged or refused (the counter's sizes were cleared): a new
        window (held batches stay held)."""
        self.failure = None
        self._seen = 0
