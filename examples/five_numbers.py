"""The ε numbers a user meets for one run, side by side: the table in README
"The numbers of one run".

One short DP-SGD run, fixed in advance (the quick start's step, σ = 1.1 and
q = 256/60000, for 20 epochs of 234 steps), charged to a ledger with a target
of (ε = 3, δ = 1e-5) and its plan declared, under each filter; beside them
Opacus' two accountants for the same steps. No model is trained: the numbers
depend on the steps only. Every ε is printed rounded up (a shorter number that
is still a bound).

Run: python examples/five_numbers.py
"""

from __future__ import annotations

import warnings

from _fmt import up

from privguard import Ledger, Plan
from privguard import mechanisms as M

SIGMA, Q, STEPS, TARGET, DELTA = 1.1, 256 / 60_000, 234 * 20, 3.0, 1e-5


def ledger(filter: str) -> Ledger:
    """The run's ledger under ``filter``, every step charged."""
    step = M.SubsampledGaussian(SIGMA, Q)
    book = Ledger(epsilon=TARGET, delta=DELTA, plan=Plan(step, steps=STEPS), filter=filter)
    book.charge(step, times=STEPS)
    return book


def opacus_epsilons() -> tuple[float, float]:
    """Opacus' default (PRV) and RDP accountants' ε for the same steps."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    prv, rdp = PRVAccountant(), RDPAccountant()
    prv.history = rdp.history = [(SIGMA, Q, STEPS)]
    with warnings.catch_warnings():  # Opacus' "optimal order is the largest alpha" notes
        warnings.simplefilter("ignore")
        return prv.get_epsilon(DELTA), rdp.get_epsilon(DELTA)


def table() -> str:
    """The README's table, as markdown."""
    plain, hybrid = ledger("rdp"), ledger("hybrid")
    prv, rdp = opacus_epsilons()
    rows = [
        ("`ledger.budget()`", f"`{plain.budget()}`",
         "the budget meter: how much of the target the filter has used. Consumption, "
         "not a privacy statement (why it reads above the RDP ε: below the table)",
         "never as the privacy claim; log it while training"),
        ("`ledger.budget()`, `filter=\"hybrid\"`", f"`{hybrid.budget()}`",
         "the same meter when the hybrid filter decides: the plan's steps counted by PLD, "
         "as Opacus' PRV accountant counts them, so it reads close to Opacus' PRV ε",
         "never as the claim: it is consumption, even where it matches Opacus' PRV ε"),
        ("`ledger.guarantee()`", f"`{str(plain.guarantee()).split(' (a ')[0]}`",
         "the filter's (ε, δ)-DP for the whole interaction: the target, whatever the run "
         "spent below it (either filter)", "**report this**"),
        ("`ledger.epsilon()`", up(plain.epsilon()),
         "the any-time ε (odometer): a tail bound valid under adaptive choices and at any "
         "stopping time, without the filter, so it usually reads above the non-adaptive ε", "the claim of a ledger without a target; beside the "
         "guarantee only as another statement (not the smaller of the two)"),
        ("`ledger.nonadaptive_epsilon()`", up(plain.nonadaptive_epsilon()),
         "the spent curve's RDP conversion, as if every choice was fixed in advance",
         "only for a run fixed in advance; compare with Opacus' RDP ε"),
        ("Opacus `RDPAccountant`", up(rdp),
         "Opacus' RDP ε for the same steps", "beside `nonadaptive_epsilon()`"),
        ("Opacus `PRVAccountant` (its default)", up(prv),
         "Opacus' default ε for the same steps", "beside the hybrid meter; not a guarantee "
         "under adaptive choices"),
    ]
    lines = ["| you call | this run | what it is | when to report it |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines)


def orders() -> tuple[float, float]:
    """The order the default δ shares sit at (where the target would be reached) and the
    order at which this run's RDP ε is smallest: why the meter reads above that ε."""
    import numpy as np

    book = ledger("rdp")
    weights = np.asarray(book._acc.filter.resolve_weights(None))
    spent = np.asarray(book._acc.spent())
    alphas = np.asarray(book.orders)
    eps = spent - (np.log(DELTA) + np.log(alphas)) / (alphas - 1) + np.log((alphas - 1) / alphas)
    return float(alphas[int(np.argmax(weights))]), float(alphas[int(np.argmin(eps))])


def main() -> str:
    text = table()
    print(f"{STEPS} steps of SubsampledGaussian(σ = {SIGMA}, q = 256/60000), "
          f"target (ε = {TARGET:g}, δ = {DELTA:g}), plan declared:\n")
    print(text)
    shares, best = orders()
    print(f"\nthe δ shares sit at order {shares:g}; this run's best order is {best:g}")
    return text


if __name__ == "__main__":
    main()
