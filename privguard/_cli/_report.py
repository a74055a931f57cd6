"""What ``privguard report`` and ``privguard plot`` show, as data, text and a PNG.

Used by the command line (:mod:`privguard._cli._cli`) and the demo; it imports
neither. Every ε shown names the statement it is and the δ it holds at:

* the running ε (the odometer): P(privacy loss > ε) ≤ δ at any stopping time,
  under adaptive choices — the number to report for an adaptive run;
* the filter's target, when there is one: the whole interaction is
  (ε_target, δ)-DP (a hockey-stick statement, not a tail bound);
* the non-adaptive RDP ε (what Opacus' RDP accountant prints, on the ledger's orders) and, on
  request, Opacus' PRV ε for the same sequence: NOT guarantees when anything
  was chosen adaptively, shown so you can see what validity costs.

Upper bounds (the running ε, the risk sentence's TPR) are printed rounded up
(:func:`privguard._accounting._results.upper`), so a printed bound is still a bound.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
from collections import OrderedDict
from typing import Any

import numpy as np

from privguard._accounting._accounting import Accounting, nonadaptive_epsilon
from privguard._accounting._budget import meter, meter_after
from privguard._accounting._hybrid import HybridState
from privguard._accounting._journal import Run, _bound, scaled_sum
from privguard._accounting._lease import UNUSED
from privguard._accounting._results import describe, exact, lower, upper, witnessed_note
from privguard._accounting._results import stated_delta as _stated_delta
from privguard._cli._risk import risk_sentence
from privguard._errors import InvalidArgumentError
from privguard._ledger._ledger import Ledger
from privguard._mechanisms._mechanisms import Gaussian, SubsampledGaussian
from privguard._optional import require

#: Opacus' PRV accountant is only asked about journals of at most this many runs.
PRV_MAX_SEGMENTS = 10_000
#: The budget meter is drawn at about this many points.
METER_POINTS = 25


def _replayer(ledger: Ledger) -> Accounting:
    """A fresh accounting with the ledger's configuration and fixed choices."""
    acc = Accounting(ledger._acc.config, fix_now=False)
    if ledger._acc.fixed is not None:
        acc.install_fixed(ledger._acc.fixed)
    return acc


def stated_delta(ledger: Ledger) -> float | None:
    """The δ a running ε is stated at (:func:`privguard._accounting._results.stated_delta`)."""
    return _stated_delta(ledger._acc)


def trajectory(ledger: Ledger, points: int = 200) -> dict[str, list]:
    """Running (odometer) and non-adaptive ε after evenly spaced charges, from the runs, and
    the budget meter (docs/theory.md §12) at about :data:`METER_POINTS` of them."""
    runs = ledger.runs
    total = runs[-1].start + runs[-1].count if runs else 0
    out: dict[str, list] = {"charges": [], "running_epsilon": [], "naive_epsilon": [],
                            "meter_charges": [], "meter": []}
    delta = stated_delta(ledger)
    if delta is None or not total:
        return out
    acc = _replayer(ledger)
    odometer = acc.odometer(delta)
    marks = np.unique(np.linspace(1, total, min(points, total)).astype(int))
    flt = acc.filter if ledger.budget() is not None and not acc.retargeted else None
    # the meter at about METER_POINTS of the marks (a hybrid's part A: one PLD per grid count)
    stride = max(1, math.ceil(marks.size / METER_POINTS))
    # the journal's own sums (Journal.spent_after): base + n × curve over a streak of one
    # mechanism, each operation rounded up (docs/theory.md §6), +inf past the float range
    base = np.zeros(ledger.orders.size)
    streak, done = None, 0  # the streak's mechanism, and its charges in earlier runs
    i = 0
    for run in runs:
        curve = acc.curve(run.mechanism)
        if streak is None or not (run.mechanism is streak or run.mechanism == streak):
            if streak is not None:
                base = scaled_sum(base, _bound(base), done, acc.curve(streak),
                                  _bound(acc.curve(streak)))
            streak, done = run.mechanism, 0
        while i < marks.size and marks[i] <= run.start + run.count:
            spent = scaled_sum(base, _bound(base), int(done + marks[i] - run.start), curve,
                               _bound(curve))
            out["charges"].append(int(marks[i]))
            out["running_epsilon"].append(odometer.epsilon(spent, delta))
            out["naive_epsilon"].append(nonadaptive_epsilon(acc.orders, spent, delta))
            if flt is not None and (i % stride == 0 or i == marks.size - 1):
                out["meter_charges"].append(int(marks[i]))
                out["meter"].append(_meter_at(flt, spent, run, marks[i] - run.start))
            i += 1
        done += run.count
        if flt is not None and flt.kind == "hybrid":  # part A's state after the run
            from privguard._accounting._hybrid import envelope_steps_in

            k = envelope_steps_in(run.mechanism, flt.envelope)
            if flt.a_alive and k is not None and flt.a_count + k * run.count <= flt.steps_a:
                flt.apply(HybridState(flt.a_count + k * run.count, True))
            else:
                flt.apply(HybridState(flt.a_count, False))
    return out


def _meter_at(flt: Any, spent: np.ndarray, run: Run, within: int) -> float:
    """The meter after ``within`` charges of ``run`` (part A's state before the run in ``flt``)."""
    if flt.kind != "hybrid":
        return meter(flt, spent)[0]
    return meter_after(flt, spent, run.mechanism, within)[0]


def prv_epsilon(runs: tuple[Run, ...] | list[Run], delta: float) -> float | None:
    """Opacus' PRV ε for the same sequence, fixed in advance (NOT a guarantee under adaptivity).

    None when a run is not a (subsampled) Gaussian, or there are more than
    :data:`PRV_MAX_SEGMENTS` runs. Loads Opacus (and torch).
    """
    history = []
    for run in runs:
        m = run.mechanism
        if isinstance(m, SubsampledGaussian):
            history.append((m.noise_multiplier, m.sample_rate, run.count * m.steps))
        elif isinstance(m, Gaussian):
            history.append((m.noise_multiplier, 1.0, run.count))
        else:
            return None
    if not history or len(history) > PRV_MAX_SEGMENTS:
        return None
    from opacus.accountants import PRVAccountant  # loads torch: only when asked

    prv = PRVAccountant()
    prv.history = history
    with np.errstate(divide="ignore", invalid="ignore"):  # Opacus' log(0) at short prefixes
        return float(prv.get_epsilon(delta=delta))


def _time(t: float | None) -> str:
    if t is None:
        return "?"
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _finite(x: float | None) -> float | str | None:
    """JSON has no infinity: an unlimited count is reported as the string "unlimited"."""
    if x is None:
        return None
    return "unlimited" if math.isinf(x) else x


def json_ready(value: Any) -> Any:
    """``value`` with every non-finite float as a string ("inf", "-inf", "nan"): strict JSON
    has none, and an ε can be infinite (review bd: ``report --json`` raised ValueError)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def report(ledger: Ledger, *, compare_prv: bool = False) -> dict[str, Any]:
    """Everything ``privguard report`` shows, as plain (JSON-ready) data."""
    history = ledger.history  # its runs and its leased-but-unused count, read together
    runs = history._runs
    cfg = ledger._acc.config
    groups: OrderedDict[str, dict] = OrderedDict()
    for r in runs:
        g = groups.setdefault(str(r.label), {"label": r.label, "charges": 0, "mechanisms": [],
                                             "first": r.first_time, "last": r.last_time})
        g["charges"] += r.count
        g["last"] = r.last_time
        d = describe(r.mechanism.to_dict())
        if d not in g["mechanisms"]:
            g["mechanisms"].append(d)
    timeline = [{"label": r.label, "mechanism": describe(r.mechanism.to_dict()),
                 "charges": r.count, "start": r.first_time, "end": r.last_time} for r in runs]
    last = runs[-1].mechanism if runs else None
    remaining = ledger.remaining(last)
    delta = ledger.delta
    charges = runs[-1].start + runs[-1].count if runs else 0
    meter = ledger.budget()
    # After a retarget the running ε is stated at the δ the ledger was created with, fixed
    # before the first output, as guarantee() states it (docs/theory.md §4): at a δ
    # chosen after outputs it is not valid under adaptivity.
    retargeted = ledger._acc.retargeted
    running_delta = stated_delta(ledger)
    # a ledger created without δ and retargeted to one has no guarantee to state: the
    # report says so rather than failing (review aa: guarantee()'s refusal stopped it)
    claim = None if delta is None or running_delta is None else ledger.guarantee()
    # the numbers shown beside the running ε are computed at its δ, so that the three compare
    # (review aa: after a retarget they were at the new δ, the running ε at the first one)
    compare_delta = delta if running_delta is None else running_delta
    return {
        "budget": None if meter is None else {"spent": meter.spent, "epsilon": meter.epsilon,
                                              "left": meter.left, "part": meter.part},
        "statement": (claim.statement if claim is not None else None if delta is None else
                      f"no guarantee to state: this ledger's δ = {exact(delta)} was set by a "
                      "retarget of a ledger created without δ, after outputs, so it is not "
                      "covered (docs/theory.md §4)"),
        "statement_kind": None if claim is None else claim.kind,
        # only beside a filter's statement (docs/theory.md §12): not the odometer's tail bound
        "risk": (risk_sentence(claim.epsilon, claim.delta)
                 if claim is not None and claim.kind == "filter" else None),
        "path": ledger.path,
        "orders": len(ledger.orders),
        "odometer": cfg.odometer,
        "delta": delta,
        "filter": cfg.filter,
        "target_epsilon": cfg.epsilon,
        # after a retarget the filter's theorem (a target fixed in advance) does not apply,
        # so its (ε, δ) is not stated as holding (review aa: it was, with a "but" after it)
        "target_statement": (None if cfg.epsilon is None else
                             f"the whole interaction is ({exact(cfg.epsilon)}, {exact(delta)})-DP"
                             if not ledger._acc.retargeted else
                             f"target ({exact(cfg.epsilon)}, {exact(delta)}) set by a retarget after "
                             "charges were made, so it was not fixed in advance and no "
                             "(ε, δ)-DP statement for the whole interaction follows from it"),
        "strict_budget": cfg.filter == "strict",
        "charges": charges,
        # leases (docs/theory.md §13): spent in the journal, never released (still spent)
        "leased_unused": history.leased_unused,
        "released": history.released,
        "runs": len(runs),
        "running_delta": running_delta,
        "running_epsilon": None if running_delta is None else ledger.epsilon(running_delta),
        "running_statement": (None if running_delta is None else
                              f"P(privacy loss > running ε) ≤ {exact(running_delta)}, at any "
                              "stopping time" + (", at the δ fixed before the first output "
                                                 "(the target was changed afterwards)"
                                                 if retargeted else "")
                              + witnessed_note(ledger._acc)),
        "naive_epsilon_not_a_guarantee": (None if compare_delta is None else
                                          ledger.nonadaptive_epsilon(compare_delta)),
        "opacus_prv_epsilon_not_a_guarantee": (prv_epsilon(runs, compare_delta)
                                               if compare_prv and compare_delta is not None
                                               else None),
        "not_a_guarantee_delta": compare_delta,
        "remaining_repeats_of_last_mechanism": _finite(remaining.repeats),
        "last_mechanism": None if last is None else describe(last.to_dict()),
        "by_label": list(groups.values()),
        "timeline": timeline,
        "events": list(ledger.events),
    }


def _above(x: float, target: float | None, why: str) -> str:
    """`` — above the target: why`` when ``x`` exceeds the target (same line, always)."""
    return f" — above the target ε = {exact(target)}: {why}" if target is not None and x > target else ""


def _unused_steps(event: dict[str, Any]) -> str:
    """A lease-unused event's steps and label, as the report's event line ends (task lo8:
    a close records one event per lease, the current one and the prefetched next one, and
    the line showed neither's steps); empty for any other event. The steps stay spent
    (docs/theory.md §13): the line says so, as the charges line does."""
    if event.get("event") != UNUSED:
        return ""
    return (f", {event.get('steps')} steps of label {event.get('label')!r} leased but "
            "unused (spent)")


def print_report(data: dict[str, Any]) -> None:
    """The report; its first lines answer: how much is left, what to report, why ε differs."""
    target, delta = data["target_epsilon"], data["delta"]
    b = data.get("budget")
    if b is not None:
        # over: a retarget lowered ε, or an earlier privguard admitted the last charge
        # within ulps of the budget at δ_α a few ulps larger (review rlo3)
        over = (" — over the target (after a retarget, or by rounding in a ledger an earlier "
                "privguard wrote): every charge is refused"
                if b["spent"] > b["epsilon"] else "")
        # spent rounded up, what is left rounded down (review cli: 59.95% left printed as 60%)
        print(f"budget      {upper(b['spent'], '.4g')} of ε = {exact(b['epsilon'])} spent "
              f"({b['part']}) — {lower(100 * b['left'], '.3g')}% left{over}")
    else:
        print("budget      " + ("strict per-order RDP budget (a tuning candidate's child)"
                               if data["strict_budget"] else "none: no (ε, δ) target, "
                               "this ledger only measures (odometer)"))
    if data.get("statement") is not None:
        risk = f"; {data['risk']}" if data.get("risk") else ""
        print(f"report      {data['statement']}{risk}")
    if data["running_epsilon"] is not None:
        run = data["running_epsilon"]
        above = (f"above the target ε = {exact(target)}, " if target is not None and run > target
                 else "")
        # the filter's guarantee is stated only with a target fixed in advance: after a
        # retarget (statement_kind "odometer") there is none to hold (task wr)
        holds = (" while the filter's guarantee holds" if data.get("statement_kind") == "filter"
                 else "; no filter's guarantee is stated: the target was set by a retarget")
        why = ("" if target is None else f" — {above}a different statement: it must hold at "
               "any stopping time without the filter, so it is usually larger than the meter "
               f"and may exceed the target{holds}")
        print(f"any-time ε  {upper(run, '.4f')} at δ = {exact(data['running_delta'])} "
              f"({data['running_statement']}; valid under adaptivity){why}")
        prv = data["opacus_prv_epsilon_not_a_guarantee"]
        naive = data["naive_epsilon_not_a_guarantee"]
        fixed = "assumes every choice was fixed in advance: NOT a guarantee under adaptivity"
        at = f"at δ = {exact(data['running_delta'])}"
        # comparisons, rounded up as every printed ε (review lo2: to nearest, 1.00001 read 1.0000)
        if prv is not None:
            print(f"Opacus PRV  {upper(prv, '.4f')} {at} (a comparison, rounded up: Opacus' "
                  f"default accountant on the same sequence; {fixed})"
                  f"{_above(prv, target, 'not a statement about this adaptive run')}")
        if naive is not None:  # None: retargeted to no δ
            print(f"naive ε     {upper(naive, '.4f')} {at} (a comparison, rounded up: RDP "
                  "conversion of the spent curve on the "
                  f"ledger's {data['orders']} orders, as Opacus' RDP accountant on them; {fixed})"
                  f"{_above(naive, target, 'not a statement about this run')}")
    print(f"ledger      {data['path']}")
    filt = (f"(ε = {exact(target)}, δ = {exact(delta)}) "
            f"{'hybrid ' if data['filter'] == 'hybrid' else ''}"
            f"filter: {data['target_statement']}" if target is not None else
            "strict per-order RDP budget" if data["strict_budget"] else "none (report only)")
    print(f"filter      {filt}")
    print(f"grid        {data['orders']} Rényi orders; odometer {data['odometer']!r}")
    unused = data.get("leased_unused") or 0
    print(f"charges     {data['charges']} in {data['runs']} runs" + (
        f": {data['released']} released, {unused} leased but unused (spent)" if unused else ""))
    if data["last_mechanism"] is not None:
        reps = data["remaining_repeats_of_last_mechanism"]
        print(f"remaining   {reps if reps == 'unlimited' else int(reps)} more of "
              f"the last mechanism, {data['last_mechanism']}")
    for e in data["events"]:
        print(f"event       {e['event']} at {_time(e.get('time'))}: "
              f"{e.get('reason', e.get('from'))!r}{_unused_steps(e)}")
    print("\ncharges by label")
    for g in data["by_label"]:
        mechs = "; ".join(g["mechanisms"][:3]) + (" ..." if len(g["mechanisms"]) > 3 else "")
        print(f"  {g['label']!s:24s} {g['charges']:8d}  {mechs}")
    print("\ntimeline (runs of identical charges)")
    rows = data["timeline"]
    shown: list[dict | None] = rows if len(rows) <= 12 else [*rows[:6], None, *rows[-5:]]
    for row in shown:
        if row is None:
            print(f"  ... {len(rows) - 11} more runs ...")
            continue
        print(f"  {_time(row['start'])}  {row['charges']:7d} × {row['label']!s:16s} "
              f"{row['mechanism']}")


def plot(ledger: Ledger, out: str, *, compare_prv: bool = True) -> str:
    """Write a PNG: the budget meter against the target on one panel; the any-time ε
    (odometer), the non-adaptive RDP ε and Opacus' PRV ε on a panel of their own.

    Raises:
        InvalidArgumentError: ``out`` cannot be written (its directory is
            missing or not writable, or it is a directory), names a format
            matplotlib cannot write, or is the ledger's own file; checked
            before anything is computed.

    Returns:
        The path written: ``out``, or ``out + ".png"`` when ``out`` has no extension
        (matplotlib would append its configured format's; we write a PNG there), its trailing
        dots dropped as matplotlib drops them (``out.`` is written as ``out.png``).
    """
    _check_output(out)
    out = _with_extension(out)
    _check_output(out)
    _check_not_the_ledger(out, ledger)
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _check_format(out, plt)

    tr = trajectory(ledger)
    meter = tr.get("meter") or []
    target = ledger.target
    panels = 2 if target is not None and meter else 1
    fig, axes = plt.subplots(panels, 1, figsize=(7, 3.2 * panels), sharex=True, squeeze=False)
    if target is not None and panels == 2:
        top = axes[0][0]
        top.plot(tr["meter_charges"], meter, marker=".", label="budget meter (what the filter compares)")
        top.axhline(target[0], color="k", linestyle="--", label=f"target ε = {exact(target[0])}")
        top.set_ylim(0, target[0] * 1.08)
        top.set_ylabel("budget spent (ε units)")
        top.legend(fontsize=8, loc="lower right")
    ax = axes[-1][0]
    running, naive = _drawable(tr["running_epsilon"]), _drawable(tr["naive_epsilon"])
    if any(math.isnan(v) for v in running + naive):  # an ε past the axis: named, not drawn
        ax.set_title(f"ε above {PLOT_MAX:g} (or infinite) is not drawn", fontsize=8)
    ax.plot(tr["charges"], running, label="any-time ε (odometer; valid at any stop)")
    ax.plot(tr["charges"], naive, linestyle=":",
            label="non-adaptive RDP (NOT a guarantee under adaptivity)")
    runs = ledger.runs
    delta = stated_delta(ledger)
    if compare_prv and delta is not None and 0 < len(runs) <= PRV_MAX_SEGMENTS:
        xs, ys = _prv_points(runs, delta)
        if xs:
            ax.plot(xs, ys, linestyle="--", marker=".",
                    label="Opacus PRV (NOT a guarantee under adaptivity)")
    ax.set_xlabel("charges")
    ax.set_ylabel(f"ε at δ = {exact(delta)}" if delta else "ε")
    ax.legend(fontsize=8)
    name = os.path.basename(str(ledger.path)) if ledger.path else "in-memory ledger"
    fig.suptitle(f"{name}: budget meter (top) and ε statements of other kinds (bottom)"
                 if panels == 2 else name, fontsize=10)
    fig.tight_layout()
    # drawn beside ``out`` and renamed over it: a write that fails or is interrupted
    # (a full disk, Ctrl-C) leaves no half-written image at ``out`` (review cli)
    part = os.path.join(os.path.dirname(os.path.abspath(out)),
                        f".{os.path.basename(out)}.{os.getpid()}.part")
    try:
        fig.savefig(part, dpi=120, format=os.path.splitext(out)[1][1:].lower())
        os.replace(part, out)
    except OSError as exc:
        raise InvalidArgumentError("output", out, f"cannot be written ({exc.strerror or exc})"
                                   ) from None
    finally:
        plt.close(fig)
        with contextlib.suppress(OSError):
            os.remove(part)  # left only when the write or the rename failed
    return out


#: The largest ε drawn: matplotlib cannot place ticks up to 1e308 (ValueError, review bd:
#: PureDP(1e308) charged 3 times), and no ε near it says more than "no protection".
PLOT_MAX = 1e12


def _drawable(values: list[float]) -> list[float]:
    """``values`` with every ε above ``PLOT_MAX`` or infinite as NaN, which matplotlib skips."""
    return [v if math.isfinite(v) and v <= PLOT_MAX else math.nan for v in values]


def _with_extension(out: Any) -> str:
    """``out`` as a string, ``.png`` appended when it has no extension: the path the
    image is written to, which the checks and the printed path must name (review bi:
    ``-o out`` wrote out.png and printed ``out``)."""
    path = os.fspath(out)
    # as matplotlib names it (backend_bases.print_figure): an empty extension, "out." or
    # "out..", is stripped of its dots before the format is appended (review rbi: "budget."
    # was written as budget.png, over a ledger stored there, and printed as "budget.")
    return path if os.path.splitext(path)[1][1:] else path.rstrip(".") + ".png"


def _check_output(out: Any) -> None:
    """Refuse an output path that cannot be written, naming it and the cause."""
    if isinstance(out, bytes) or not isinstance(out, (str, os.PathLike)) or not os.fspath(out):
        raise InvalidArgumentError("output", out, "must be a file path")
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise InvalidArgumentError("output", out, f"directory {directory} does not exist")
    if os.path.isdir(out):  # as cc -o, curl -o, sort -o: an output option names a file
        raise InvalidArgumentError("output", out, f"is a directory ({os.path.abspath(out)}): "
                                   "name the image file, e.g. "
                                   f"{os.path.join(os.fspath(out), 'eps.png')}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidArgumentError("output", out, f"directory {directory} is not writable")


def _check_not_the_ledger(out: Any, ledger: Ledger) -> None:
    """Refuse to draw over the ledger's file or its SQLite sidecars (review bx: ``privguard
    plot budget.png -o budget.png`` replaced the ledger with the image, its journal lost)."""
    where = ledger.path
    if not isinstance(where, (str, os.PathLike)) or "://" in os.fspath(where):
        return  # in memory or on a server: no local file to overwrite
    target = os.path.realpath(out)
    base = os.path.realpath(where)
    if target in {base + tail for tail in ("", "-wal", "-shm", "-journal")} or (
            os.path.exists(out) and os.path.exists(base) and os.path.samefile(out, base)):
        raise InvalidArgumentError("output", out, f"is the ledger's own file ({where}); "
                                   "drawing there would destroy the ledger")


def _check_format(out: Any, plt: Any) -> None:
    """Refuse an extension matplotlib cannot write (it raised ValueError after computing)."""
    ext = os.path.splitext(os.fspath(out))[1][1:].lower()
    fig = plt.figure()
    try:
        formats = fig.canvas.get_supported_filetypes()
    finally:
        plt.close(fig)
    if ext and ext not in formats:
        raise InvalidArgumentError("output", out, f"has the extension .{ext}, which is not an "
                                   f"image format matplotlib writes ({', '.join(sorted(formats))})")


def _prv_points(runs: tuple[Run, ...], delta: float, points: int = 12
                ) -> tuple[list[int], list[float]]:
    """Opacus' PRV ε at a few charge counts (each prefix of the journal, cut inside a run)."""
    total = runs[-1].start + runs[-1].count
    xs, ys = [], []
    for mark in np.unique(np.linspace(1, total, min(points, total)).astype(int)):
        prefix = []
        for run in runs:
            if run.start >= mark:
                break
            prefix.append(Run(run.index, run.start, min(run.count, int(mark) - run.start),
                              run.label, run.mechanism, run.first_time, run.last_time, run.pid))
        eps = prv_epsilon(prefix, delta)
        if eps is None:
            return [], []
        xs.append(int(mark))
        ys.append(eps)
    return xs, ys
