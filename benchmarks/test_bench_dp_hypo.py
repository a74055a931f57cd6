"""DP-HyPO: exact projection against a general-purpose QP solver (cvxpy), same run.

Run: pip install cvxpy   (the 'bench' extra)
     python -m pytest benchmarks/test_bench_dp_hypo.py --benchmark-only \
        --benchmark-json=bench_dp_hypo.json
     python benchmarks/report.py bench_dp_hypo.json
"""

from __future__ import annotations

import numpy as np
import pytest

from privguard import mechanisms as M
from privguard.tuning import DPHyPOSearch, Geometric, project_bounded_simplex

cp = pytest.importorskip("cvxpy")  # benchmarks only; not part of the test suite


def problem(n: int):
    rng = np.random.default_rng(n)
    prior = np.full(n, 1.0 / n)
    p = rng.dirichlet(np.ones(n)) * 1.3 + rng.normal(0, 0.3 / n, n)
    return p, 0.75 * prior, 2.0 * prior


def cvxpy_projection(p, lo, hi):
    x = cp.Variable(p.size)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - p)), [x >= lo, x <= hi, cp.sum(x) == 1])
    prob.solve(solver="CLARABEL")
    return x.value


@pytest.mark.parametrize("n", [2500, 100_000])
def test_privguard_projection(benchmark, n):
    p, lo, hi = problem(n)
    benchmark.group = f"projection onto S_C,c, n = {n}"
    f = benchmark(project_bounded_simplex, p, lo, hi)
    assert abs(f.sum() - 1) < 1e-9


@pytest.mark.parametrize("n", [2500, 100_000])
def test_cvxpy_clarabel_projection(benchmark, n):
    p, lo, hi = problem(n)
    benchmark.group = f"projection onto S_C,c, n = {n}"
    x = benchmark.pedantic(cvxpy_projection, args=(p, lo, hi), rounds=3, iterations=1)
    ours = project_bounded_simplex(p, lo, hi)
    # the same point, up to the solver's tolerance; ours is at least as close to p
    assert np.abs(x - ours).max() < 1e-5
    assert ((ours - p) ** 2).sum() <= ((x - p) ** 2).sum() + 1e-12


@pytest.mark.benchmark(group="one GP update + projection + sample, 2,500 candidates")
def test_gp_step(benchmark):
    space = {"lr": list(np.logspace(-4, 1, 50)), "clip": list(np.linspace(0.1, 5, 50))}
    tuner = DPHyPOSearch(space, Geometric(mean=20.0), cost=M.Gaussian(5.0), progress=False)
    rng = np.random.default_rng(0)
    history = [(int(rng.integers(2500)), float(rng.uniform(0.5, 0.95))) for _ in range(20)]

    def step():
        pi = tuner.density(history)
        return int(rng.choice(pi.size, p=pi / pi.sum()))

    benchmark(step)
