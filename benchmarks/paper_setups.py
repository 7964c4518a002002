"""Coral and every baseline on the paper's setups, with each model's share of the cost.

For each level of the scenario: $/hour, served fraction, solve time and proven gap of Coral's
plan (mode auto, as `coral plan` plans by default) and of every baseline on the same
templates, their goodput in generated tokens/s and the uniform demand factor each meets (the
paper's scarcity rule; Coral's own row at that rule is `coral (uniform rule)`), and the $/hour each plan spends on each model (its instances' nodes). Reuses the
template libraries under out/templates (built by `coral plan SCENARIO`).

Run: `python benchmarks/paper_setups.py paper-core [NMAX [LEVEL ...]]` (NMAX `-`: the
scenario's; no LEVEL: every level).
"""

from __future__ import annotations

import sys
from collections import defaultdict

from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog
from coral.planning.options import PlanOptions
from coral.planning.plan import plan_scenario
from coral.templates.builder.build_options import BuildOptions


def per_model(instances) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for inst in instances:
        out[inst.model] += inst.usd_per_hour * inst.count
    return dict(out)


def main(name: str, nmax: int | None, levels: list[str]) -> None:
    cat = default_catalog()
    for level in levels or load_scenario(name, catalog=cat).levels:
        sc = load_scenario(name, level=level, catalog=cat).in_mode("auto")
        res = plan_scenario(sc, catalog=cat, options=PlanOptions(
            build=BuildOptions(workers=None), nmax=nmax))
        models = [m.name for m in sc.models]
        coral_split = per_model(res.instances)
        print(f"\n{name} level {level} (n_max {res.nmax}, Coral's mode {res.mode})")
        print("| planner | $/hour | x Coral | served (mean; short models) | goodput tok/s | "
              "demand x | solve s | solved | " + " | ".join(models) + " |")
        print("|---|---|---|---|---|---|---|---|" + "---|" * len(models))
        extras = getattr(res, "extras", {}) or {}
        rows = [("coral", res.cost_per_hour, res.served_fraction,
                 float(extras.get("goodput_tokens_per_s", float("nan"))), 1.0,
                 res.solve_seconds, res.plan.proof, coral_split)]
        uniform = extras.get("uniform_scale")
        if uniform:
            rows.append(("coral (uniform rule)", float(uniform["cost_per_hour"]),
                         dict(uniform["served_fraction"]),
                         float(uniform["goodput_tokens_per_s"]), float(uniform["factor"]),
                         float("nan"), "scarcity rule", {}))
        for bname, b in res.baselines.items():
            solve = b.plan.solve_s if b.plan is not None else float("nan")
            rows.append((bname, b.cost_per_hour, b.served_fraction, b.goodput_tokens_per_s,
                         b.demand_scale, solve, b.solved, per_model(b.instances)))
        for bname, cost, served, goodput, scale, solve, solved, split in rows:
            served = {m: min(1.0, float(served.get(m, 0.0))) for m in models}
            mean = sum(served.values()) / len(models)
            short = ", ".join(f"{m} {v:.0%}" for m, v in served.items() if v < 0.9995)
            cells = " | ".join(
                f"{split.get(m, 0.0):.2f} ({split.get(m, 0.0) / coral_split[m]:.2f}x)"
                if coral_split.get(m) else f"{split.get(m, 0.0):.2f}" for m in models)
            print(f"| {bname} | {cost:.2f} | {cost / res.cost_per_hour:.2f} | {mean:.3f}"
                  f"{'; ' + short if short else ''} | {goodput:,.0f} | {scale:.4g} | {solve:.2f} | "
                  f"{solved} | {cells} |")


if __name__ == "__main__":
    nmax_arg = sys.argv[2] if len(sys.argv) > 2 else "-"
    main(sys.argv[1], None if nmax_arg == "-" else int(nmax_arg), sys.argv[3:])
