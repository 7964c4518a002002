"""Benchmark: where the proven gap of the cost problem comes from, on the real libraries.

`benchmarks/allocator.py --library real` misses its gap targets at the limited level because
the bound, not the plan, stops short. This script measures, per draw, the bounds each exact
method reaches and what it costs in CPU time, with node and round limits instead of time
limits, so that its figures do not depend on the machine's load:

- `lp`: the LP relaxation of the whole ILP;
- `dw`: the Lagrangian (Dantzig-Wolfe) root bound by column generation
  (`decomposition/lagrange.py`);
- `highs root`: HiGHS on the whole ILP, root node only (`mip_max_nodes` 1), cutoff at the
  root's plan (the better of the master rounded and repaired and the best plan of one
  pattern per model, each improved model by model: `decomposition/plan_search.py`; `root plan`
  inf when neither finds one, and HiGHS then runs without a cutoff), with its default
  heuristics, without RENS, and with every root pricing round's bound added as a row per model
  (`sum_{t in T_m} (c_t + pi . nodes_t) x_t >= z_m(pi)`: valid for every plan, so its LP is at
  least the Lagrangian bound);
- `highs N nodes`: the same runs to `--nodes` nodes (default heuristics and without RENS);
- `fixed`: columns whose every unit is ruled out for a plan better than the best plan found
  (`best`: by any of these runs; the bounds are given as a share below it) by the gap
  target (each model's knapsack solved again with one unit forced, at the root prices), and
  the CPU time that takes.

Draws are as `benchmarks/allocator.py`'s (same seed: demand x exp(N(0, 0.25)), availability x
U(0.7, 1.3)), each solved fresh (no running deployment); draws whose demand cannot be met
(scarcity) are skipped, or with `--scarcity` measured alone, phase by phase
(`scarcity/phases.py`): phase 1 (most priority-weighted goodput) by HiGHS to the gap target and
to 0 (`--nodes` nodes), and phase 2 (the cheapest plan at a goodput floor) at each of those
two floors: its LP, the Lagrangian bound with availability priced at the LP's node prices
and the goodput row kept (`phase2_lagrangian`), HiGHS's root and `--nodes` nodes, each
with its plan and its CPU seconds.

    python benchmarks/allocator_bounds.py                        # core limited, 5 draws
    python benchmarks/allocator_bounds.py --draws 3 --nodes 1000
    python benchmarks/allocator_bounds.py --scarcity --nodes 1000
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass
from typing import Callable

import highspy
import numpy as np

from coral.allocator.decomposition.plan_search import (
    best_pattern_plan,
    feasible,
    improve_by_model,
    round_and_repair,
)
from coral.allocator.core.formulation import (
    LpArrays,
    LpBuilder,
    Vars,
    add_goodput_floor_row,
    add_plan_rows,
    add_variables,
    decomposition_of,
)
from coral.allocator.core.highs_runs import lp_relaxation
from coral.allocator.kernels.jit import warm_up
from coral.allocator.decomposition.knapsack import knapsack_dp
from coral.allocator.decomposition.lagrange import (
    Bounds,
    Decomposition,
    Master,
    Pricer,
    column_generation,
)
from coral.allocator.core.presolve import Index, run_presolve
from coral.allocator.scarcity.phases import GOODPUT_REL_TOL
from coral.allocator.problem import DEFAULT_MIP_GAP, AllocationProblem
from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog
from coral.solvers import quiet_highs

#: Without RENS (HiGHS's sub-MIP around the LP optimum at the root).
NO_RENS = {"mip_heuristic_run_rens": False}
#: The HiGHS runs measured.
RUNS = ("root", "root-rens", "root+cuts", "nodes", "nodes-rens")
#: Steps of each model's served range in scarcity phase 2's Lagrangian bound.
PHASE2_LEVELS = 160


@dataclass
class Cut:
    """One model's Lagrangian bound at one set of node prices, as a row of the ILP."""
    model: int
    price: np.ndarray  # per availability row
    value: float  # proven lower bound of the model's cover at `price`


def draws(size: str, level: str, n: int, seed: int) -> list[AllocationProblem]:
    """The draws of `benchmarks/allocator.py --library real`, without a running deployment."""
    sys.path.insert(0, "benchmarks")
    from allocator import DEFAULT_REAL_NMAX, real_templates  # noqa: PLC0415

    catalog = default_catalog()
    scenario = load_scenario(size, level=level, catalog=catalog).in_mode("aggregated")
    base = scenario.problem(real_templates(scenario, catalog, DEFAULT_REAL_NMAX[size]))
    rng = random.Random(seed + 1)
    out = []
    for _ in range(n):
        demands = tuple(
            type(d)(d.model, d.requests_per_s * math.exp(rng.gauss(0.0, 0.25)),
                    input_tokens=d.input_tokens, output_tokens=d.output_tokens,
                    priority=d.priority)
            for d in base.demands)
        availability = {k: int(v * rng.uniform(0.7, 1.3)) for k, v in base.availability.items()}
        out.append(type(base)(**{**base.__dict__, "demands": demands,
                                 "availability": availability, "current": {}}))
    return out


def model_bounds(dec: Decomposition, pricer: Pricer, price: np.ndarray) -> np.ndarray:
    """Each model's proven least cover value at node prices `price` (root bounds)."""
    extra = dec.usage @ price
    root = Bounds.root(dec)
    out = np.zeros(dec.n_models)
    for m, it in enumerate(pricer.items):
        lo, hi = it.bounds(root)
        out[m] = knapsack_dp(it.cost + extra[it.col], it.cap, hi, float(dec.demand[m]),
                             lo=lo).lower_bound
    return out


def mip_run(lp_in: highspy.HighsLp, *, nodes: int, gap: float = DEFAULT_MIP_GAP,
            cutoff: float = math.inf, options: dict | None = None,
            cuts: Callable[[highspy.Highs], None] | None = None
            ) -> tuple[float, float, float]:
    """HiGHS on `lp_in` to `nodes` nodes and `gap`: (bound, best objective or nan, CPU s).
    `cuts` adds rows to the model before the run."""
    h = quiet_highs()
    h.passModel(lp_in)
    if cuts is not None:
        cuts(h)
    h.setOptionValue("time_limit", 3600.0)
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("mip_heuristic_run_feasibility_jump", False)  # as `run_highs`
    h.setOptionValue("mip_max_nodes", int(nodes))
    if math.isfinite(cutoff):
        h.setOptionValue("objective_bound", float(cutoff))
    for key, value in (options or {}).items():
        h.setOptionValue(key, value)
    cpu = time.process_time()
    h.run()
    info = h.getInfo()
    found = info.objective_function_value if info.primal_solution_status == 2 else math.nan
    return float(info.mip_dual_bound), float(found), time.process_time() - cpu


def highs_run(arr: LpArrays, v: Vars, dec: Decomposition, *, cutoff: float, nodes: int,
              options: dict, cuts: list[Cut]) -> tuple[float, float, float]:
    """HiGHS on the whole ILP to `nodes` nodes: (bound, best objective or inf, CPU s)."""
    bound, found, cpu = mip_run(arr.highs_lp(arr.cost, arr.col_lb, arr.row_lb, maximise=False),
                                nodes=nodes, cutoff=cutoff, options=options,
                                cuts=lambda h: add_cuts(h, arr, v, dec, cuts))
    return bound, found if math.isfinite(found) else math.inf, cpu


def add_cuts(h: highspy.Highs, arr: LpArrays, v: Vars, dec: Decomposition,
             cuts: list[Cut]) -> None:
    """Each Lagrangian bound as a row of the ILP."""
    y_of = np.full(len(v.x), -1)
    y_of[v.y_of_x] = v.y
    for cut in cuts:
        own = np.flatnonzero(dec.col_model == cut.model)
        idx = list(v.x[own])
        val = list(arr.cost[v.x[own]] + dec.usage[own] @ cut.price)
        with_y = own[y_of[own] >= 0]
        idx += list(y_of[with_y])
        val += list(v.penalty[with_y])
        h.addRow(cut.value * (1 - 1e-9), highspy.kHighsInf, len(idx),
                 np.array(idx, dtype=np.int32), np.array(val))


def fixed_columns(dec: Decomposition, pricer: Pricer, price: np.ndarray, bound: float,
                  limit: float) -> tuple[int, float]:
    """Columns no plan below `limit` uses (one unit forced into the model's cover at the root
    prices lifts the Lagrangian bound `bound` past it), and the CPU time that takes."""
    cpu = time.process_time()
    lower = model_bounds(dec, pricer, price)
    extra = dec.usage @ price
    root = Bounds.root(dec)
    closed = 0
    for m, it in enumerate(pricer.items):
        lo, hi = it.bounds(root)
        cost = it.cost + extra[it.col]
        for i in range(len(it.cols)):
            if hi[i] < 1:
                continue
            forced = lo.copy()
            forced[i] = max(forced[i], 1)
            sol = knapsack_dp(cost, it.cap, hi, float(dec.demand[m]), lo=forced)
            closed += bound - lower[m] + sol.lower_bound >= limit
    return closed, time.process_time() - cpu


def measure(problem: AllocationProblem, nodes: int) -> dict | None:
    ix = Index.build(problem)
    cols = run_presolve(problem, ix, dominance=True)
    lp = LpBuilder()
    v = add_variables(lp, problem, ix, cols)
    add_plan_rows(lp, ix, v)
    arr = lp.arrays()
    dec = decomposition_of(ix, v, lp)
    relaxed = lp_relaxation(arr, arr.cost, arr.col_lb, arr.row_lb, lp, len(v.x))
    if relaxed is None:
        return None  # scarcity: the cost problem has no plan
    cpu = time.process_time()
    master, pricer = Master(dec), Pricer(dec, rel_gap=1e-5)
    prices: list[np.ndarray] = []
    price_once = pricer.price

    def recording(node_price: np.ndarray, bounds: Bounds, **kw: object):
        prices.append(np.asarray(node_price, dtype=float).copy())
        return price_once(node_price, bounds, **kw)

    pricer.price = recording  # type: ignore[method-assign]
    node = column_generation(master, pricer, Bounds.root(dec), deadline=math.inf,
                             start_price=relaxed.node_price, bound=relaxed.value)
    dw_cpu = time.process_time() - cpu
    pricer.price = price_once  # type: ignore[method-assign]
    mix = sum(w * master.patterns[i].counts for i, w in enumerate(node.master.weights)
              if w > 1e-12)
    plans = [round_and_repair(dec, np.asarray(mix, dtype=float)),
             best_pattern_plan(dec, master.patterns, time_limit_s=60.0)]
    plans = [improve_by_model(dec, x, node_price=node.master.node_price)
             for x in plans if x is not None and feasible(dec, x)]
    cutoff = min((dec.cost(x) for x in plans), default=math.inf)
    cuts = [Cut(m, p, z) for p in prices for m, z in enumerate(model_bounds(dec, pricer, p))]
    out = {"columns": len(v.x), "lp": relaxed.value, "dw": node.bound, "dw_cpu": dw_cpu,
           "plan": cutoff, "rounds": node.rounds}
    for label, options, with_cuts, n in (("root", {}, False, 1), ("root-rens", NO_RENS, False, 1),
                                         ("root+cuts", {}, True, 1),
                                         ("nodes", {}, False, nodes),
                                         ("nodes-rens", NO_RENS, False, nodes)):
        out[label] = highs_run(arr, v, dec, cutoff=cutoff, nodes=n, options=options,
                               cuts=cuts if with_cuts else [])
    best = min([cutoff] + [out[k][1] for k in RUNS])
    out["best"] = best
    limit = best - DEFAULT_MIP_GAP * abs(best)
    out["fixed"] = fixed_columns(dec, pricer, node.master.node_price, node.bound, limit)
    return out


def cover_levels(dec: Decomposition, pricer: Pricer, price: np.ndarray, m: int,
                 levels: np.ndarray) -> np.ndarray:
    """Model `m`'s proven least cost of capacity at least each of `levels` (req/s), every
    node at `price`."""
    extra = dec.usage @ price
    it = pricer.items[m]
    lo, hi = it.bounds(Bounds.root(dec))
    return np.array([knapsack_dp(it.cost + extra[it.col], it.cap, hi, float(q), lo=lo,
                                 rel_gap=1e-5).lower_bound for q in levels])


def phase2_lagrangian(dec: Decomposition, pricer: Pricer, price: np.ndarray, floor: float,
                      levels: int = PHASE2_LEVELS) -> float:
    """A lower bound of scarcity phase 2 (the cheapest plan of goodput >= `floor`), every
    node at `price` and the goodput row kept. Each model serves `q_m` within the shortfall
    the floor allows (`d_m - (W - floor) / w_m` to `d_m`) at no less than its cheapest cover
    of `q_m`; on `levels` steps of that range, a step counts the cover of its lower end and
    the goodput of its upper end (so the bound holds between the steps), and the models'
    steps are combined exactly (Pareto lists of shortfall and cost)."""
    total = float(dec.priority @ dec.demand)
    budget = total - floor
    front = [(0.0, 0.0)]  # (weighted shortfall, cost) of the models so far, Pareto-optimal
    for m in range(dec.n_models):
        w, d = float(dec.priority[m]), float(dec.demand[m])
        grid = np.linspace(max(0.0, d - budget / w), d, levels + 1)
        cost = cover_levels(dec, pricer, price, m, grid)
        steps = [(w * (d - grid[0]), cost[0])] + [
            (w * (d - grid[k]), cost[k - 1]) for k in range(1, levels + 1)]
        merged = sorted((a + b, c + e) for a, c in front for b, e in steps)
        front, least = [], math.inf
        for short, value in merged:
            if short <= budget + 1e-9 * total and value < least - 1e-12:
                front.append((short, value))
                least = value
    return min(value for _, value in front) - float(price @ dec.avail)


def scarcity(problem: AllocationProblem, nodes: int) -> dict | None:
    """Both scarcity phases of a draw whose demand cannot be met, measured as the module
    docstring says; None when the demand can be met."""
    ix = Index.build(problem)
    cols = run_presolve(problem, ix, dominance=True)
    lp = LpBuilder()
    v = add_variables(lp, problem, ix, cols)
    add_plan_rows(lp, ix, v)
    add_goodput_floor_row(lp, ix, v)
    arr = lp.arrays()
    col_lb = arr.col_lb.copy()
    col_lb[v.s] = 0.0
    goodput = np.zeros(lp.n_col)
    goodput[v.s] = ix.priority
    demand = float(ix.priority @ ix.demand)
    out: dict = {}
    for label, gap in (("phase 1 exact", 0.0), ("phase 1", DEFAULT_MIP_GAP)):
        out[label] = mip_run(arr.highs_lp(goodput, col_lb, arr.row_lb, maximise=True),
                             nodes=nodes, gap=gap)
        if out[label][1] >= demand * (1.0 - GOODPUT_REL_TOL):
            return None  # a plan meets demand
    relaxed = lp_relaxation(arr, -goodput, col_lb, arr.row_lb, lp, len(v.x))
    assert relaxed is not None  # serving nothing fits
    out.update({"columns": len(v.x), "demand": demand, "goodput lp": -relaxed.value})
    dec = decomposition_of(ix, v, lp)
    pricer = Pricer(dec)
    for label in ("phase 1", "phase 1 exact"):
        floor = out[label][1]
        row_lb = arr.row_lb.copy()
        row_lb[-1] = floor * (1.0 - GOODPUT_REL_TOL)
        cost_lp = lp_relaxation(arr, arr.cost, col_lb, row_lb, lp, len(v.x))
        assert cost_lp is not None  # phase 1's plan keeps the floor
        cpu = time.process_time()
        lagrangian = phase2_lagrangian(dec, pricer, cost_lp.node_price, float(row_lb[-1]))
        lagrangian_cpu = time.process_time() - cpu
        model = arr.highs_lp(arr.cost, col_lb, row_lb, maximise=False)
        out[f"{label} floor"] = {
            "floor": floor, "lp": cost_lp.value, "lagrangian": (lagrangian, lagrangian_cpu),
            "root": mip_run(model, nodes=1), "nodes": mip_run(model, nodes=nodes)}
    return out


def print_scarcity(i: int, got: dict, nodes: int) -> None:
    """One draw of `--scarcity`: phase 1, then phase 2 at each floor."""
    def plan_and_bound(run: tuple[float, float, float]) -> str:
        bound, found, cpu = run
        gap = (found - bound) / found if math.isfinite(found) else math.inf
        return f"plan {found:.2f} bound {bound:.2f} gap {gap:.2%} ({cpu:.2f} s)"

    print(f"{i:>4} {got['columns']:>5} columns; weighted demand {got['demand']:.2f}, goodput "
          f"LP {got['goodput lp']:.4f}")
    for label in ("phase 1", "phase 1 exact"):
        bound, found, cpu = got[label]
        print(f"     {label:13}: goodput {found:.4f}, bound {bound:.4f} ({cpu:.2f} s)")
    for label in ("phase 1", "phase 1 exact"):
        p2 = got[f"{label} floor"]
        value, cpu = p2["lagrangian"]
        print(f"     phase 2 at the {label} floor {p2['floor']:.4f}: LP {p2['lp']:.2f}, "
              f"Lagrangian at the LP's prices {value:.2f} ({cpu:.2f} s); HiGHS root "
              f"{plan_and_bound(p2['root'])}; {nodes} nodes {plan_and_bound(p2['nodes'])}",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="core", choices=["core", "advanced"])
    ap.add_argument("--level", default="limited")
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=300)
    ap.add_argument("--scarcity", action="store_true",
                    help="measure the scarcity phases of the draws whose demand cannot be met")
    args = ap.parse_args(argv)
    warm_up()
    if args.scarcity:
        print(f"{args.size} {args.level}: scarcity draws, HiGHS to {args.nodes} nodes (CPU s)")
        for i, problem in enumerate(draws(args.size, args.level, args.draws, args.seed)):
            got = scarcity(problem, args.nodes)
            if got is None:
                print(f"{i:>4} demand met: skipped", flush=True)
            else:
                print_scarcity(i, got, args.nodes)
        return 0
    print(f"{args.size} {args.level}: bounds as a share below the best plan found (CPU s); "
          f"HiGHS with the root's plan as cutoff, {args.nodes} nodes for the node columns")
    print(f"{'draw':>4} {'cols':>5} {'root plan':>9} {'best':>9} {'lp':>7} {'dw (cpu)':>14} "
          f"{'root':>14} {'root-rens':>14} {'root+cuts':>14} {'nodes':>14} "
          f"{'nodes-rens':>14} {'fixed (cpu)':>13}")
    for i, problem in enumerate(draws(args.size, args.level, args.draws, args.seed)):
        got = measure(problem, args.nodes)
        if got is None:
            print(f"{i:>4} demand cannot be met: skipped", flush=True)
            continue
        plan = got["best"]  # the bounds' distance from it is the gap they prove

        def below(bound: float) -> str:
            return f"{(plan - bound) / plan:.2%}"

        def run(key: str) -> str:
            bound, found, cpu = got[key]
            better = "*" if found <= plan else ""
            return f"{below(bound)}{better} ({cpu:.2f})"

        dw = f"{below(got['dw'])} ({got['dw_cpu']:.2f})"
        print(f"{i:>4} {got['columns']:>5} {got['plan']:>9.2f} {plan:>9.2f} {below(got['lp']):>7} {dw:>14} "
              f"{run('root'):>14} {run('root-rens'):>14} {run('root+cuts'):>14} "
              f"{run('nodes'):>14} {run('nodes-rens'):>14} "
              f"{got['fixed'][0]:>5} ({got['fixed'][1]:.2f})", flush=True)
    print("(* the run found the best plan)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
