"""A strict plan that cannot meet demand is the user's error: the CLI prints its message
(which models fall short and how to fix it) with exit status 2, not a traceback."""

from __future__ import annotations

import pytest
import typer
from test_allocator_support import column

from coral.allocator.problem import AllocationProblem, ModelDemand
from coral.allocator.solve.ilp import InfeasiblePlanError, solve_allocation
from coral.cli.common import user_errors
from coral.errors import CoralError


def _short_problem() -> AllocationProblem:
    # 5 req/s of demand, 2 nodes of the only node type: 2 req/s at most
    t = column("t", "m", {"a": 1}, 1.0, {"r1": 1.0})
    return AllocationProblem(demands=(ModelDemand("m", 5.0),), templates=(t,), regions=("r1",),
                             availability={("a", "r1"): 2}, mip_gap=0.0)


def test_a_strict_infeasible_plan_is_a_user_error_printed_without_traceback(capsys):
    with pytest.raises(typer.Exit) as info:
        with user_errors():
            solve_allocation(_short_problem(), strict=True)
    assert info.value.exit_code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "m: 2 of 5 req/s served, short by 3" in err
    assert "Traceback" not in err


def test_the_error_keeps_its_old_base_and_the_plan():
    with pytest.raises(InfeasiblePlanError) as info:
        solve_allocation(_short_problem(), strict=True)
    assert isinstance(info.value, CoralError) and isinstance(info.value, RuntimeError)
    assert info.value.plan.short_models == ("m",)
    assert info.value.plan.instances == {("t", "r1"): 2}
