"""What ``privguard report`` and ``privguard plot`` show, as data, text and a PNG.

Used by the command line (:mod:`privguard._cli`) and the demo; it imports
neither.
"""

from __future__ import annotations

import datetime
from collections import OrderedDict
from typing import Any

import numpy as np

from privguard._ledger import Ledger
from privguard._optional import require


def trajectory(ledger: Ledger, points: int = 200) -> dict[str, list]:
    """Running (odometer) and naive ε after evenly spaced charges, by replay."""
    history = ledger.history
    replay = Ledger(delta=ledger.delta, orders=ledger.orders,
                    odometer=ledger._odometer_mode) if ledger.delta is not None else None
    if replay is None or not history:
        return {"charges": [], "running_epsilon": [], "naive_epsilon": []}
    marks = set(np.unique(np.linspace(1, len(history), min(points, len(history))).astype(int)))
    cap = ledger.target[0] if ledger.target and not ledger._retargeted else None
    out = {"charges": [], "running_epsilon": [], "naive_epsilon": []}
    for i, record in enumerate(history, start=1):
        replay.charge(record.mechanism)
        if i in marks:
            eps = replay.epsilon()
            out["charges"].append(i)
            out["running_epsilon"].append(min(eps, cap) if cap is not None else eps)
            out["naive_epsilon"].append(replay.nonadaptive_epsilon())
    return out


def _describe(mechanism) -> str:
    return _short(mechanism.to_dict())


def _short(value: Any) -> str:
    """A one-line description of a serialised mechanism (curves abbreviated)."""
    if isinstance(value, dict) and set(value) == {"type", "params"}:
        if value["type"] == "RDPCurve":
            return f"RDPCurve({len(value['params']['orders'])} orders)"
        inner = ", ".join(f"{k}={_short(v)}" for k, v in value["params"].items())
        return f"{value['type']}({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value[:4]) + (", ...]" if len(value) > 4 else "]")
    return f"{value:g}" if isinstance(value, float) else str(value)


def _time(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def report(ledger: Ledger) -> dict[str, Any]:
    """Everything ``privguard report`` shows, as plain data."""
    history = ledger.history
    groups: OrderedDict[str, dict] = OrderedDict()
    for r in history:
        g = groups.setdefault(str(r.label), {"label": r.label, "charges": 0, "mechanisms": [],
                                             "first": r.time, "last": r.time})
        g["charges"] += 1
        g["last"] = r.time
        d = _describe(r.mechanism)
        if d not in g["mechanisms"]:
            g["mechanisms"].append(d)
    timeline: list[dict] = []
    for r in history:
        if timeline and timeline[-1]["label"] == r.label and timeline[-1]["mechanism"] == _describe(r.mechanism):
            timeline[-1]["charges"] += 1
            timeline[-1]["end"] = r.time
        else:
            timeline.append({"label": r.label, "mechanism": _describe(r.mechanism), "charges": 1,
                             "start": r.time, "end": r.time})
    target = ledger.target
    last = history[-1].mechanism if history else None
    remaining = ledger.remaining(last) if last is not None else ledger.remaining()
    return {
        "path": ledger.path,
        "orders": len(ledger.orders),
        "odometer": ledger._odometer_mode,
        "delta": ledger.delta,
        "target_epsilon": None if target is None else target[0],
        "strict_budget": ledger._filter is not None and target is None,
        "charges": len(history),
        "running_epsilon": ledger.epsilon() if ledger.delta is not None else None,
        "naive_epsilon_not_a_guarantee": (ledger.nonadaptive_epsilon()
                                          if ledger.delta is not None else None),
        "remaining_repeats_of_last_mechanism": (None if remaining.repeats is None
                                                else float(remaining.repeats)),
        "last_mechanism": None if last is None else _describe(last),
        "by_label": list(groups.values()),
        "timeline": timeline,
        "events": list(ledger.events),
    }


def print_report(data: dict[str, Any]) -> None:
    print(f"ledger      {data['path']}")
    budget = (f"(ε = {data['target_epsilon']:g}, δ = {data['delta']:g}) filter"
              if data["target_epsilon"] is not None else
              "strict per-order RDP budget" if data["strict_budget"] else "none (report only)")
    print(f"budget      {budget}")
    print(f"grid        {data['orders']} Rényi orders; odometer {data['odometer']!r}")
    print(f"charges     {data['charges']}")
    if data["running_epsilon"] is not None:
        print(f"running ε   {data['running_epsilon']:.4f} at δ = {data['delta']:g} "
              "(valid under adaptivity and at any stopping time)")
        print(f"naive ε     {data['naive_epsilon_not_a_guarantee']:.4f} "
              "(conversion of the spent curve: NOT a guarantee under adaptivity)")
    if data["last_mechanism"] is not None:
        reps = data["remaining_repeats_of_last_mechanism"]
        print(f"remaining   {'unlimited' if reps == float('inf') else int(reps)} more of "
              f"the last mechanism, {data['last_mechanism']}")
    if data["events"]:
        for e in data["events"]:
            print(f"event       {e['event']} at {_time(e['time'])}: {e.get('reason')!r}")
    print("\ncharges by label")
    for g in data["by_label"]:
        mechs = "; ".join(g["mechanisms"][:3]) + (" ..." if len(g["mechanisms"]) > 3 else "")
        print(f"  {g['label']!s:24s} {g['charges']:8d}  {mechs}")
    print("\ntimeline (runs of identical charges)")
    rows = data["timeline"]
    shown = rows if len(rows) <= 12 else [*rows[:6], None, *rows[-5:]]
    for row in shown:
        if row is None:
            print(f"  ... {len(rows) - 11} more runs ...")
            continue
        print(f"  {_time(row['start'])}  {row['charges']:7d} × {row['label']!s:16s} "
              f"{row['mechanism']}")


def plot(ledger: Ledger, out: str) -> str:
    """Write a PNG of ε over charges: odometer, filter budget, naive (labelled)."""
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr = trajectory(ledger)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(tr["charges"], tr["running_epsilon"], label="running ε (odometer; valid)")
    ax.plot(tr["charges"], tr["naive_epsilon"], linestyle=":",
            label="naive conversion (NOT a guarantee under adaptivity)")
    if ledger.target is not None:
        ax.axhline(ledger.target[0], color="k", linestyle="--",
                   label=f"filter budget ε = {ledger.target[0]:g}")
    ax.set_xlabel("charges")
    ax.set_ylabel(f"ε at δ = {ledger.delta:g}" if ledger.delta else "ε")
    ax.set_title(str(ledger.path))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
