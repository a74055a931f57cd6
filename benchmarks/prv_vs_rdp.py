"""σ calibrated by Opacus' PRV accountant, accounted in RDP (what privguard uses).

Run: python benchmarks/prv_vs_rdp.py
Setting of tests/test_opacus_integration.py::test_optimizer_from_make_private_with_epsilon:
q = 32/512, 2 epochs (32 steps), target ε = 4, δ = 1e-5; plus a typical DP-SGD setting.
"""

from __future__ import annotations

import warnings

from opacus.accountants.utils import get_noise_multiplier

from privguard import Ledger
from privguard import mechanisms as M

warnings.filterwarnings("ignore")


def main() -> None:
    delta = 1e-5
    for q, steps, eps in [(32 / 512, 32, 4.0), (256 / 60000, 60 * 234, 3.0)]:
        sigma = get_noise_multiplier(target_epsilon=eps, target_delta=delta, sample_rate=q,
                                     steps=steps, accountant="prv")
        ledger = Ledger(delta=delta)
        ledger.charge(M.SubsampledGaussian(sigma, q, steps=steps))
        print(f"q={q:.5f}, {steps} steps, PRV target ε={eps}: σ={sigma:.4f}; "
              f"RDP ε of that run = {ledger.nonadaptive_epsilon():.3f}")


if __name__ == "__main__":
    main()
