"""Checks of the certified random-allocation epoch PLD (docs/theory.md §2b.3).

Run: ``nice -n 19 python benchmarks/allocation_pld_prototype.py --validate
[--sigmas 0.8 1 2] [--mc-epochs 4000000]`` (``--mc-epochs 0`` skips the t = 10 check).

The construction itself now lives in the package
(``privguard/_accounting/_allocation_envelope.py``, Lemmas 2b.3–2b.6) and is part A of
the hybrid filter for a plan ``RandomAllocation(σ₀, t₀)``; this script (the prototype's
name kept, since docs cite it) validates it against independent references:

* t = 2: the exact tails P(ℓ > a) by one-dimensional quadrature, both directions, at
  400 points of [−3, 4], σ ∈ {0.8, 1, 2}: the certified tail is never below;
* negative control: every remove loss one grid step lower is caught by that check;
* t = 10: 4·10⁶ exact Monte-Carlo epochs per σ, 101 points of [−2, 3] (evidence).

The epochs admitted (RDP filter against the hybrid filter) are printed by
``benchmarks/hybrid_allocation_pld.py``.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from privguard._accounting import _allocation_envelope as AE


def pmf_tail(pmf, x: np.ndarray, shift: int = 0) -> np.ndarray:
    """P(ℓ̂ > x) of a DensePLDPmf (its +∞ mass included); ``shift`` lowers every loss."""
    losses = (np.arange(pmf.size) + pmf._lower_loss - shift) * pmf._discretization
    probs = np.asarray(pmf._probs)
    tail = np.concatenate([np.cumsum(probs[::-1])[::-1], [0.0]]) + pmf._infinity_mass
    return tail[np.searchsorted(losses, x, side="right")]


def exact_tails_t2(sigma: float, x: np.ndarray):
    """t = 2 by quadrature: remove E_Z[P(A > 2e^a − W(Z))], add E_Z[P(W < 2e^(−a) − W(Z))]."""
    from scipy import integrate
    from scipy.special import ndtr

    s = 1.0 / sigma
    c = 1.0 / math.sqrt(2 * math.pi)
    rem, add = [], []
    for a in x:
        y, y2 = 2 * math.exp(a), 2 * math.exp(-a)

        def f_rem(z, y=y):
            r = y - math.exp(s * z - s * s / 2)
            dens = c * math.exp(-z * z / 2)
            return dens * (1.0 if r <= 0 else float(ndtr(-(math.log(r) - s * s / 2) / s)))

        def f_add(z, y2=y2):
            r = y2 - math.exp(s * z - s * s / 2)
            dens = c * math.exp(-z * z / 2)
            return dens * (0.0 if r <= 0 else float(ndtr((math.log(r) + s * s / 2) / s)))

        zk, zk2 = (math.log(y) + s * s / 2) / s, (math.log(y2) + s * s / 2) / s
        rem.append(sum(integrate.quad(f_rem, lo, hi, epsabs=1e-16, epsrel=1e-10, limit=400)[0]
                       for lo, hi in ((-40, zk), (zk, 40))))
        add.append(integrate.quad(f_add, -40, zk2, epsabs=1e-16, epsrel=1e-10, limit=400)[0])
    return np.array(rem), np.array(add)


def validate(sigmas: tuple[float, ...] = (0.8, 1.0, 2.0), mc_epochs: int = 4_000_000) -> None:
    print("== t = 2: certified tail / exact (quadrature), 400 points of [-3, 4]")
    x = np.linspace(-3.0, 4.0, 400) + 1.234e-5
    for sigma in sigmas:
        pld = AE.epoch_pld(sigma, 2)
        rem, add = exact_tails_t2(sigma, x)
        cr, ca = pmf_tail(pld._pmf_remove, x), pmf_tail(pld._pmf_add, x)
        mr, ma = rem > 1e-13, add > 1e-13
        print(f"sigma={sigma}: remove min ratio {np.min(cr[mr] / rem[mr]):.6f} max ratio "
              f"{np.max(cr[mr] / rem[mr]):.6f} (violations {int(np.sum(cr < rem * (1 - 1e-9)))}), "
              f"add min ratio {np.min(ca[ma] / add[ma]):.6f} max ratio "
              f"{np.max(ca[ma] / add[ma]):.6f} (violations {int(np.sum(ca < add * (1 - 1e-9)))})",
              flush=True)
        if sigma == 1.0:
            low = pmf_tail(pld._pmf_remove, x, shift=1)
            print(f"negative control, remove losses one grid step low, sigma=1: violations "
                  f"{int(np.sum(low < rem * (1 - 1e-9)))} of 400, min ratio "
                  f"{np.min(low[mr] / rem[mr]):.6f}", flush=True)
    if not mc_epochs:
        return
    print(f"== t = 10: certified tail vs Monte-Carlo ({mc_epochs:.0e} epochs), "
          "violations = certified < MC - 4 SE, 101 points of [-2, 3]")
    rng = np.random.default_rng(20261126)
    for sigma in sigmas:
        s = 1.0 / sigma
        pld = AE.epoch_pld(sigma, 10)
        n, block = mc_epochs, min(mc_epochs, 500_000)
        rem_l, add_l = np.empty(n), np.empty(n)
        for b in range(0, n, block):
            z = rng.standard_normal((min(block, n - b), 10))
            w = np.exp(s * z - s * s / 2)
            add_l[b:b + block] = -np.log(w.mean(axis=1))
            w[:, 0] = np.exp(s * z[:, 0] + s * s / 2)  # the example's step under P
            rem_l[b:b + block] = np.log(w.mean(axis=1))
        xs = np.linspace(-2.0, 3.0, 101)
        out = []
        for name, losses, pmf in (("remove", rem_l, pld._pmf_remove), ("add", add_l, pld._pmf_add)):
            mc = np.array([np.count_nonzero(losses > v) / n for v in xs])
            se = np.sqrt(np.maximum(mc * (1 - mc), 1.0 / n) / n)  # floored at one event in n
            cert = pmf_tail(pmf, xs)
            out.append(f"{name}: violations {int(np.sum(cert < mc - 4 * se))}, max (MC - "
                       f"certified)/SE {float(np.max((mc - cert) / se)):+.2f}, max certified - "
                       f"MC {float(np.max(cert - mc)):.2e}")
        print(f"sigma={sigma}: " + "; ".join(out), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validate", action="store_true",
                        help="run the checks (the script's only job; the epochs admitted are "
                             "printed by benchmarks/hybrid_allocation_pld.py)")
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.8, 1.0, 2.0],
                        help="noise multipliers checked (default: 0.8 1 2; the negative "
                             "control runs at σ = 1)")
    parser.add_argument("--mc-epochs", type=int, default=4_000_000,
                        help="Monte-Carlo epochs per σ of the t = 10 check (0: skip it)")
    args = parser.parse_args(argv)
    if not args.validate:  # the arguments were ignored: any, or none, ran the checks
        parser.error("nothing to do: pass --validate (the epochs admitted are printed by "
                     "benchmarks/hybrid_allocation_pld.py)")
    if any(not (math.isfinite(s) and s > 0) for s in args.sigmas):
        parser.error(f"--sigmas must be positive and finite, not {args.sigmas}")
    if args.mc_epochs < 0:
        parser.error(f"--mc-epochs must be >= 0, not {args.mc_epochs}")
    validate(tuple(args.sigmas), args.mc_epochs)


if __name__ == "__main__":
    main()
