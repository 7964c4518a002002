"""Benchmark: the fair scarcity objective (issue 37) — what it serves and where its time goes.

`--plan SCENARIO` plans a scenario as `coral plan SCENARIO` does at its defaults (level, mode
auto, the scenario's n_max, the default time limit and gap, the baselines beside it;
templates reused from `--templates-dir`) and prints the smallest served fraction, the share
of generated tokens/s served, each fair phase's seconds and proven gap, and the same figures
for every baseline (under the paper's uniform scale-down rule).

`--draws N --sizes S... --levels L...` re-plans N synthetic draws per (scenario, level), as
`benchmarks/allocator.py` draws them (its synthetic templates; demand log-normal sigma 0.25,
availability x0.7-1.3), under `--scarcity` (fair by default) and prints per phase the median
and p95 seconds and the largest proven gap, with the smallest served fraction's median.

    python benchmarks/fair_scarcity.py --plan advanced
    python benchmarks/fair_scarcity.py --sizes paper-extended --levels default scarce --draws 5
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from allocator import _quantile, synthetic_templates  # noqa: E402

from coral.allocator.solve.ilp import solve_allocation  # noqa: E402
from coral.allocator.kernels.jit import warm_up  # noqa: E402
from coral.allocator.scenario.load import load_scenario  # noqa: E402
from coral.catalog import default_catalog  # noqa: E402


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2%}"


def plan_figures(name: str, templates_dir: Path, workers: int) -> None:
    """`coral plan NAME` at its defaults, summarised."""
    from coral.planning.libraries import templates_for_scenario
    from coral.planning.plan import plan_scenario
    from coral.templates.builder.build_options import BuildOptions
    from coral.templates.builder.parallel import default_perf_factory

    cat = default_catalog()
    scenario = load_scenario(name, catalog=cat)
    perf = default_perf_factory(cat)
    templates = templates_for_scenario(scenario, cat, perf, out_root=templates_dir,
                                       options=BuildOptions(workers=workers), nmax=None,
                                       progress=False)
    warm_up()
    t = time.perf_counter()
    res = plan_scenario(scenario, catalog=cat, perf=perf, templates=templates)
    wall = time.perf_counter() - t
    p = res.plan
    asked = sum(d.requests_per_s * d.output_tokens for d in scenario.demands())
    sc = res.extras.get("scarcity", {})
    print(f"{name} (level {scenario.level}, mode {res.mode}): ${res.cost_per_hour:,.2f}/hour, "
          f"{p.proof}; solve {p.solve_s:.2f} s (plan_scenario {wall:.0f} s with baselines)")
    print(f"  objective: {sc.get('description')}")
    print(f"  smallest served fraction {p.min_served_fraction:.1%}, fairness level "
          f"{p.fair_level:.3f}, tokens/s served {p.tokens_per_s:,.0f} of {asked:,.0f} "
          f"({p.tokens_per_s / asked:.1%}), req/s {sum(p.served_rps.values()):,.1f}")
    for phase, gap in p.phase_gaps.items():
        print(f"  phase {phase}: {p.phase_s.get(phase, math.nan):.2f} s, gap {_pct(gap)}")
    print("  per model: " + ", ".join(f"{m} {f:.1%}" for m, f in p.served_fraction.items()))
    for note in p.notes:
        if note.startswith("mode auto") or note.startswith("fair"):
            print(f"  note: {note}")
    for b, r in res.baselines.items():
        fr = dict(r.served_fraction)
        tok = getattr(r, "goodput_tokens_per_s", None) or 0.0
        print(f"  baseline {b}: smallest served fraction {min(fr.values(), default=1.0):.1%}, "
              f"tokens {tok / asked:.1%}, demand x{getattr(r, 'demand_scale', 1.0):.3f}, "
              f"${float(r.cost_per_hour):,.2f}/hour")
    for note in res.notes:
        if note.startswith("mode auto"):
            print(f"  {note}")


def draw_figures(size: str, level: str, *, draws: int, per_model: int, seed: int,
                 scarcity: str) -> None:
    """Per fair phase: median / p95 seconds and the largest gap over synthetic draws."""
    cat = default_catalog()
    scenario = load_scenario(size, level=level, catalog=cat)
    base = scenario.problem(synthetic_templates(scenario, cat, per_model, seed),
                            scarcity=scarcity)  # type: ignore[arg-type]
    rng = random.Random(seed + 1)
    warm_up()
    seconds: dict[str, list[float]] = {}
    gaps: dict[str, list[float]] = {}
    total, smallest, tokens, short = [], [], [], 0
    current: dict[tuple[str, str], int] = {}
    for _ in range(draws):
        demands = tuple(replace(d, requests_per_s=d.requests_per_s
                                * math.exp(rng.gauss(0.0, 0.25))) for d in base.demands)
        availability = {k: int(n * rng.uniform(0.7, 1.3)) for k, n in base.availability.items()}
        problem = replace(base, demands=demands, availability=availability, current=current)
        plan = solve_allocation(problem)
        total.append(plan.solve_s)
        current = dict(plan.instances)
        if plan.meets_demand:
            gaps.setdefault("cost (demand met)", []).append(plan.gap)
            continue
        short += 1
        smallest.append(plan.min_served_fraction)
        asked = sum(d.requests_per_s * d.output_tokens for d in demands)
        tokens.append(plan.tokens_per_s / asked)
        for phase, gap in plan.phase_gaps.items():
            gaps.setdefault(phase, []).append(gap)
            seconds.setdefault(phase, []).append(plan.phase_s.get(phase, math.nan))
    print(f"{size} {level} ({scarcity}, {draws} draws, {short} short of demand): solve median "
          f"{statistics.median(total):.2f} s, p95 {_quantile(total, 0.95):.2f} s"
          + (f"; smallest served fraction median {statistics.median(smallest):.1%}, tokens "
             f"served median {statistics.median(tokens):.1%}" if smallest else ""))
    for phase, g in gaps.items():
        s = seconds.get(phase)
        timing = (f"median {statistics.median(s):.2f} s, p95 {_quantile(s, 0.95):.2f} s, "
                  if s and all(map(math.isfinite, s)) else "")
        print(f"  {phase}: {timing}largest gap {_pct(max(g))}, median gap "
              f"{_pct(statistics.median(g))}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", nargs="*", default=[], help="scenarios to plan at defaults")
    ap.add_argument("--templates-dir", type=Path, default=Path("out/templates"))
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--sizes", nargs="*", default=[])
    ap.add_argument("--levels", nargs="+", default=["default", "scarce"])
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--templates", type=int, default=None,
                    help="synthetic templates per model (default: allocator.py's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scarcity", default="fair", choices=["fair", "goodput"])
    args = ap.parse_args(argv)
    for name in args.plan:
        plan_figures(name, args.templates_dir, args.workers)
    for size in args.sizes:
        per_model = args.templates or (300 if size == "core" else 1000)
        for level in args.levels:
            draw_figures(size, level, draws=args.draws, per_model=per_model, seed=args.seed,
                         scarcity=args.scarcity)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
