"""Which rows of a plan depend on which GPU type's model (issue 22, item 3).

Simulates PLAN as it is, then once per GPU type in it with that type `--factor` times slower
than modelled (`coral simulate --slowdown GPU=F`), and prints per GPU type: its nodes and
share of the plan's $/hour, SLO attainment, and the models that miss their SLO; then every
model's SLO attainment per slowed GPU type. A plan from `coral plan --robust R` says so
first (R, its cost beside the nominal plan's).

    python benchmarks/slowdown_sensitivity.py PLAN.json [--factor 1.3|plan] [--duration 300]

`--factor plan` slows each GPU type by the factor the plan was made robust to (the one of
`--robust R`, or each card's own with `--robust auto`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from coral.perf.slowdown import PhaseSlowdown, slowdown_spec


def simulate(plan: Path, duration: float, slowdown: str | None) -> dict:
    cmd = [sys.executable, "-m", "coral.cli.main", "simulate", str(plan), "--json",
           "--no-progress", "--duration", str(duration),
           "--out", str(plan.parent / "sensitivity" / (slowdown or "base").replace("=", "_")
                                                    .replace(":", "-").replace(",", "+"))]
    if slowdown:
        cmd += ["--slowdown", slowdown]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def gpu_mix(plan: Any, catalog) -> tuple[Counter, Counter]:
    """Nodes and $/hour per GPU type of the plan's instances (a `PlanFile`)."""
    nodes, usd = Counter(), Counter()
    for inst in plan.instances:
        for st in inst.shape.stages if inst.shape is not None else ():
            node = catalog.node_type(st.node_type)
            n = inst.count * st.count
            nodes[node.gpu] += n
            usd[node.gpu] += n * (node.price_in(inst.region) or 0.0)
    return nodes, usd


def main(argv: list[str] | None = None) -> int:
    from coral.catalog.loader import default_catalog
    from coral.plans.file import read_plan

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("--factor", default="1.3",
                    help="slowdown of each GPU type in turn, or 'plan': the plan's own factors")
    ap.add_argument("--duration", type=float, default=300.0)
    args = ap.parse_args(argv)
    catalog = default_catalog()
    plan = read_plan(args.plan, catalog)
    nodes, usd = gpu_mix(plan, catalog)
    total = sum(usd.values()) or 1.0
    robust = plan.robust
    if args.factor == "plan":
        if robust is None:
            ap.error(f"--factor plan: {args.plan} was not planned with --robust")
        factors = dict(robust.factors)
    else:
        factors = {g: float(args.factor) for g in nodes}
    label = "own" if args.factor == "plan" else f"x{float(args.factor):g}"
    if robust is not None:
        nominal = robust.figures.get("nominal_cost_per_hour")
        slow = (f"{robust.factor:g}x" if robust.factor else "by its own factor ("
                + ", ".join(f"{g} {PhaseSlowdown.of(f).text()}"
                            for g, f in robust.factors.items()) + ")")
        print(f"plan {args.plan.name}: robust to any one GPU type {slow} slower "
              f"(R = {robust.r}); nominal plan "
              + (f"${nominal:,.2f}/hour, robustness "
                 f"{100 * robust.figures['cost_of_robustness']:+.1f}%"
                 if nominal is not None else "none meeting demand"))
    base = simulate(args.plan, args.duration, None)
    print(f"plan {args.plan.name}: ${base['cost_per_hour']:,.2f}/hour; as modelled: SLO "
          f"attainment {100 * base['slo_attainment']:.1f}%, models missing their SLO: "
          f"{[m for m, v in base['models'].items() if not v['slo_met']] or 'none'}")
    print(f"| GPU type ({label}) | factor | nodes | share of $/hour | SLO attainment | "
          "models missing their SLO (attainment) |")
    print("|---|---|---|---|---|---|")
    runs = {}
    for gpu in sorted(nodes, key=lambda g: -usd[g]):
        f = factors.get(gpu, 1.0)
        s = runs[gpu] = simulate(args.plan, args.duration, slowdown_spec(gpu, f))
        miss = [f"{m} ({100 * v['slo_attainment']:.1f}%)" for m, v in s["models"].items()
                if not v["slo_met"]]
        print(f"| {gpu} | {PhaseSlowdown.of(f).text()} | {nodes[gpu]} | "
              f"{100 * usd[gpu] / total:.1f}% | "
              f"{100 * s['slo_attainment']:.1f}% | {', '.join(miss) or 'none'} |", flush=True)
    models = list(base["models"])
    print()
    print(f"SLO attainment per model (%), as modelled and with one GPU type slowed ({label}; "
          "* : SLO missed)")
    print("| slowed | overall | " + " | ".join(models) + " |")
    print("|---|---|" + "---|" * len(models))
    for name, s in [("none", base)] + list(runs.items()):
        cells = [f"{100 * s['slo_attainment']:.1f}"] + [
            f"{100 * s['models'][m]['slo_attainment']:.1f}"
            + ("" if s["models"][m]["slo_met"] else "*") for m in models]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
