"""`benchmarks/fair_phase_proofs.py` keeps each fair phase's ILP as the allocator poses it:
on small scarce pools the long runs on those ILPs find the oracle's values phase by phase, and
never a bound that cuts off the allocator's exact plan."""

from __future__ import annotations

import pytest
from conftest import benchmark_module
from test_allocator_fair import scarce_pool

from coral.allocator.problem import fair_levels
from coral.allocator.scarcity import fair
from coral.allocator.solve.bruteforce import solve_bruteforce


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("fair_phase_proofs.py", "fair_phase_proofs_benchmark") as module:
        yield module


@pytest.mark.parametrize("seed", range(4))
def test_each_phase_as_posed_has_the_oracles_value(bench, seed):
    problem = scarce_pool(seed)
    oracle = solve_bruteforce(problem)
    inner = fair._phase
    plan, phases = bench.solve_capturing(problem)
    assert fair._phase is inner  # the allocator is left as it was
    assert [p.name for p in phases] == list(fair.PHASES)
    level = min(fair_levels(problem.demands, oracle.served_rps).values())
    fairness, tokens, cost = phases
    assert -fairness.value == pytest.approx(level, rel=1e-6)
    assert -tokens.value == pytest.approx(oracle.priority_tokens_per_s, rel=1e-6)
    assert cost.value == pytest.approx(oracle.cost_usd_per_hour, rel=1e-6)
    assert plan.cost_usd_per_hour == pytest.approx(oracle.cost_usd_per_hour, rel=1e-6)
    for phase in phases:
        run = bench.long_run(phase, seconds=10.0, threads=1)
        # cut off at the allocator's exact plan: no better plan, and a proof that it is optimal
        assert run.finished, phase.name
        assert not run.best < phase.value - 1e-6 * max(1.0, abs(phase.value))
        assert run.bound == pytest.approx(phase.value, rel=2 * bench.LONG_RUN_GAP, abs=1e-9)
        assert run.bound <= phase.value + 1e-6 * max(1.0, abs(phase.value))
