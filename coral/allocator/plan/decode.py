"""An allocation decoded into plan-file rows.

`decode_instances` turns an allocation's instance counts into the plan file's rows
(`coral.plans.file.PlanRow`), each with its template's nodes and layer placement;
`baseline_summary` is a baseline's entry in the file. The file itself (its records, reader
and writer) is `coral.plans`, the layer below.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from coral.allocator.problem import AllocationPlan, TemplateColumn
from coral.plans.file import PlanRow

if TYPE_CHECKING:
    from coral.templates.template import Template


def decode_instances(plan: AllocationPlan, columns: Sequence[TemplateColumn],
                     templates: Mapping[str, Template], markets: Mapping[str, str] | None = None
                     ) -> tuple[PlanRow, ...]:
    """The plan's instance counts with each template's nodes and layer placement; `markets`
    names the spot columns (column id -> `spot`), every other column is on demand."""
    col_by_id = {c.id: c for c in columns}
    out: list[PlanRow] = []
    for (tid, region), count in sorted(plan.instances.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        col = col_by_id[tid]
        tpl = templates.get(tid)
        shape = tpl.shape if tpl is not None else None
        if tpl is not None and tpl.throughput > 0:
            rps = col.capacity * tpl.throughput_rps / tpl.throughput
            utilisation = col.capacity / tpl.throughput
        else:
            rps = col.capacity if col.mode == "aggregated" else 0.0
            utilisation = 1.0
        out.append(PlanRow(
            region=region, template_id=tid, model=col.model, mode=col.mode, count=int(count),
            node_counts=dict(col.node_counts), shape=shape, capacity=col.capacity,
            unit=tpl.unit if tpl is not None else "req/s", capacity_rps=rps,
            usd_per_hour=col.price_usd_per_hour[region],
            started=int(plan.started.get((tid, region), 0)), utilisation=utilisation,
            market=(markets or {}).get(tid, "on_demand"),
        ))
    return tuple(out)


def baseline_summary(result: Any) -> dict[str, Any]:
    """A baseline result's figures as plain JSON values."""
    plan = getattr(result, "plan", None)
    served = {m: float(f) for m, f in dict(result.served_fraction).items()}
    return {
        "cost_per_hour": float(result.cost_per_hour),
        "served_fraction": served,
        # the paper's scarcity rule: the uniform factor on every model's demand its plan
        # meets (1: the full demand), and the generated tokens/s it serves
        "demand_scale": float(getattr(result, "demand_scale", 1.0)),
        "goodput_tokens_per_s": finite(float(getattr(result, "goodput_tokens_per_s",
                                                     math.nan))),
        # only a plan serving all demand compares with Coral's on cost
        "meets_demand": bool(getattr(result, "meets_demand",
                                     all(f >= 1.0 - 1e-6 for f in served.values()))),
        # how far its cost may be from the best its restriction allows: null for a heuristic
        # plan (nothing proven); a plan stopped by the time limit may cost up to `gap` less
        "status": plan.status.value if plan is not None else None,
        "gap": finite(getattr(result, "gap", math.inf)),
        "goodput_gap": None if plan is None or getattr(result, "heuristic", False)
        else finite(plan.goodput_gap),
        "solve_seconds": float(plan.solve_s) if plan is not None else None,
        "solved": getattr(result, "solved", None),
        "notes": [str(n) for n in getattr(result, "notes", ())],
    }


def finite(x: float) -> float | None:
    """`x`, or None (JSON null) when it is not finite."""
    return float(x) if math.isfinite(x) else None
