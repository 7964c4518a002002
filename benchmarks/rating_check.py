"""Does each template of a plan meet its SLO, alone, at the rate the plan gives it?

The planner rates one instance of a template at a planned rate
(`coral.allocator.scenario.headroom`); the simulator is the judge. This simulates every distinct
template row of PLAN alone (one instance, no router pooling with other instances) under Poisson
arrivals of the SLO's request shape at its planned rate and at `--factors` times it, over
`--seeds`, and prints per template the TTFT and TPOT at the SLO percentile and the share of
requests that meet the SLO.

A PD half cannot run alone: a prefill row is simulated with enough instances of its model's
decode row beside it that they run at no more than half their planned rate (and a decode row
with prefill instances likewise), and it is judged on its own half of the SLO (a prefill
instance on TTFT, a decode instance on TPOT, which holds the KV hand-over and the wait for a
decode slot).

    python benchmarks/rating_check.py PLAN.json [--seeds 0 1 2 3] [--factors 1.0 1.1]
                                                [--duration 300] [--lengths fixed]
                                                [--only TEXT] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

#: A partner half (PD) runs at no more than this share of its planned rate, so that what is
#: judged is the half under test.
PARTNER_LOAD = 0.5


@dataclass(frozen=True)
class Check:
    """One template simulated alone at one load factor and seed."""

    template_id: str
    mode: str
    planned_rps: float
    factor: float
    seed: int
    requests: int
    ttft_s: float | None  # at the SLO percentile
    tpot_s: float | None
    attainment: float  # share of the template's requests meeting the SLO
    met: bool  # the half's SLO (aggregated: both) holds at the percentile


def distinct_rows(plan: Any) -> list[Any]:
    """One row per template id (a template's rows in other regions run the same shape)."""
    seen: dict[str, Any] = {}
    for row in plan.instances:
        seen.setdefault(row.template_id, row)
    return list(seen.values())


def _one(row: Any, count: int, tag: str, slos: dict) -> list:
    from coral.sim.deployment import instances_from_rows

    specs = instances_from_rows([replace(row, count=count, region="r")], slos)
    return [replace(s, name=f"{tag}#{k}") for k, s in enumerate(specs)]


def _partner(plan: Any, row: Any) -> Any | None:
    """The plan's other half of `row`'s model with the most planned requests/s an instance."""
    other = "decode" if row.mode == "prefill" else "prefill"
    rows = [r for r in plan.instances if r.model == row.model and r.mode == other]
    return max(rows, key=lambda r: r.capacity_rps, default=None)


def check_row(plan: Any, row: Any, slos: dict, *, factor: float, seed: int,
              duration_s: float, perf: Any, catalog: Any, lengths: str = "fixed") -> Check:
    """Simulate `row`'s template alone at `factor` x its planned rate."""
    from coral.sim.event_loop import SimConfig, Simulator
    from coral.sim.workload import synthetic

    slo = slos[row.model]
    rate = row.capacity_rps
    specs = _one(row, 1, "test", slos)
    if row.mode != "aggregated":
        partner = _partner(plan, row)
        if partner is None:
            raise SystemExit(f"{row.template_id}: the plan has no other half to pair with")
        n = max(1, math.ceil(factor * rate / (PARTNER_LOAD * partner.capacity_rps)))
        specs += _one(partner, n, "partner", slos)
    reqs = synthetic(row.model, rate_rps=factor * rate, duration_s=duration_s, seed=seed,
                     prompt_tokens=slo.input_tokens, output_tokens=slo.output_tokens,
                     length_dist=lengths)  # type: ignore[arg-type]
    result = Simulator(specs, perf=perf, catalog=catalog, config=SimConfig()).run(reqs)
    rs = result.requests
    q = 100.0 * slo.percentile
    done = [r.status == "done" for r in rs]
    ttfts = np.array([r.ttft_s if d else math.inf for r, d in zip(rs, done)])
    tpots = np.array([r.tpot_s if d else math.inf for r, d in zip(rs, done)])
    ttft = float(np.percentile(ttfts, q, method="higher"))
    tpot = float(np.percentile(tpots, q, method="higher"))
    ttft_ok, tpot_ok = ttfts <= slo.ttft_s + 1e-12, tpots <= slo.tpot_s + 1e-12
    if row.mode == "prefill":  # judged on its half: TTFT
        good, met = ttft_ok, ttft <= slo.ttft_s
    elif row.mode == "decode":  # TPOT holds the hand-over and the wait for a slot
        good, met = tpot_ok, tpot <= slo.tpot_s
    else:
        good, met = ttft_ok & tpot_ok, ttft <= slo.ttft_s and tpot <= slo.tpot_s
    return Check(row.template_id, row.mode, rate, factor, seed, len(rs),
                 ttft if math.isfinite(ttft) else None, tpot if math.isfinite(tpot) else None,
                 float(good.mean()) if len(rs) else 0.0, bool(met))


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def main(argv: list[str] | None = None) -> int:
    from coral.plans.file import read_plan
    from coral.catalog.loader import default_catalog
    from coral.templates.builder.parallel import default_perf_factory

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--factors", type=float, nargs="+", default=[1.0, 1.1])
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--lengths", default="fixed", choices=["fixed", "lognormal"],
                    help="Request lengths: the SLO's shape, or lognormal around it.")
    ap.add_argument("--only", default="", help="Only template ids containing this text.")
    ap.add_argument("--json", type=Path, default=None, help="Write every check here.")
    args = ap.parse_args(argv)
    plan = read_plan(args.plan)
    slos = plan.slos
    if slos is None:
        raise SystemExit(f"{args.plan}: the plan carries no SLOs (re-plan it)")
    catalog = default_catalog()
    perf = default_perf_factory(catalog)
    checks: list[Check] = []
    rows = [r for r in distinct_rows(plan) if args.only in r.template_id]
    print(f"{args.plan.name}: {len(rows)} templates alone, seeds {args.seeds}, "
          f"{args.duration:g} s of Poisson arrivals each, {args.lengths} lengths; "
          f"attainment % (the half's own SLO for PD rows), TTFT / TPOT at the SLO percentile "
          f"in ms (worst seed); * : missed")
    head = "| template | mode | planned req/s | " + " | ".join(
        f"x{f:g}: attainment min-max | TTFT / TPOT" for f in args.factors) + " |"
    print(head)
    print("|" + "---|" * (3 + 2 * len(args.factors)))
    for row in sorted(rows, key=lambda r: (r.model, r.mode, r.template_id)):
        cells = []
        for f in args.factors:
            runs = [check_row(plan, row, slos, factor=f, seed=s, duration_s=args.duration,
                              perf=perf, catalog=catalog, lengths=args.lengths)
                    for s in args.seeds]
            checks += runs
            lo = min(c.attainment for c in runs) * 100
            hi = max(c.attainment for c in runs) * 100
            mark = "" if all(c.met for c in runs) else "*"
            ttft = max((c.ttft_s for c in runs if c.ttft_s is not None), default=None)
            tpot = max((c.tpot_s for c in runs if c.tpot_s is not None), default=None)
            cells += [f"{lo:.1f}-{hi:.1f}{mark}", f"{_ms(ttft)} / {_ms(tpot)}"]
        print(f"| {row.template_id} | {row.mode} | {row.capacity_rps:.2f} | "
              + " | ".join(cells) + " |", flush=True)
    base = [c for c in checks if c.factor == 1.0]
    if base:
        missed = sorted({c.template_id for c in base if not c.met})
        print(f"at the planned rate: {len(base) - sum(not c.met for c in base)} of {len(base)} "
              f"runs meet the SLO percentile; templates missing: "
              + (", ".join(missed) if missed else "none"))
    if args.json:
        args.json.write_text(json.dumps([c.__dict__ for c in checks], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
