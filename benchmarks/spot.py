"""Spot plans under preemptions: `core` (n_max 3, mode auto: every serving mode tried, the
cheapest kept) planned on demand, with `--spot`, and the naive spot plan (`--spot
--risk-target 0`), each simulated with preemptions; prints every
plan's cost (planned, and held over the run with its replacements), its preemption figures and
each model's SLO attainment.

Two parts, because preemptions at the catalog's rates are rare (about 4e-4 events per pool
per hour) and the simulator runs core's 840 requests/s at roughly 20,000 requests per CPU
second:

1. Events over 24 h at the catalog's rates, drawn as the simulator draws them (seeds
   0..N-1), without simulating requests: how many events hit each plan's spot pools per day.
2. Each plan simulated for `--horizon` seconds with `coral.sim.preemption` at the catalog's
   rates times `--rate-scale` (1: the catalog's), re-planning after each event as
   `coral simulate --preemptions` does.

3. With `--event-windows`, in place of 2: each plan simulated for `--window` seconds once
   without events and once per spot pool (at least `--min-pool-prob` likely to have an
   event in an hour) with that pool reclaimed at `--event-at`, and the hourly probability
   that a model's attainment falls below 99 % and its expected attainment over 24 h at the
   catalog's rates computed from those windows (see `event_windows`); `--extend FILE`
   simulates the pools such a run left out and `--summarise FILE` prints its figures.

    python benchmarks/spot.py [--horizon 900] [--rate-scale 1] [--seeds 1] [--days-seeds 1000]
        [--plans-dir out/bench-spot] [--replan] [--event-windows [--window 480]]
        [--extend FILE | --summarise FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from coral.plans.file import PlanFile, read_plan
from coral.catalog import default_catalog
from coral.sim import SimConfig, Simulator, instances_from_plan, summarize
from coral.sim.preemption import (
    PreemptionConfig,
    PreemptionRun,
    draw_pool_events,
    pool_rng,
    row_market,
    row_pools,
)
from coral.planning.preemption_replan import AllocatorReplanner
from coral.sim.workload import merge, synthetic
from coral.templates.builder.parallel import default_perf_factory

PLANS = {
    "on demand": [],
    "spot (0.99)": ["--spot"],
    "naive spot": ["--spot", "--risk-target", "0"],
}


class ScaledRates:
    """The catalog's preemption figures with every rate times `scale`."""

    def __init__(self, catalog, scale: float):
        self.catalog, self.scale = catalog, scale

    def preemption_rate_per_hour(self, node_type: str, region: str) -> float:
        return self.scale * self.catalog.preemption_rate_per_hour(node_type, region)

    def preemption_notice_s(self, region: str) -> float:
        return self.catalog.preemption_notice_s(region)


def plan(name: str, flags: list[str], folder: Path, replan: bool) -> Path:
    out = folder / (name.replace(" ", "-").replace("(", "").replace(")", "") + ".json")
    if replan or not out.exists():
        cmd = ["coral", "plan", "core", "--nmax", "3", "--no-baselines", "--out", str(out),
               *flags]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def events_per_day(payload: PlanFile, catalog, seeds: int) -> tuple[float, float]:
    """(mean events hitting the plan's spot pools in 24 h, share of seeds with at least one)."""
    pools = sorted({p for r in payload.instances if row_market(r) == "spot"
                    for p in row_pools(r)})
    counts = []
    for seed in range(seeds):
        counts.append(sum(len(draw_pool_events(catalog.preemption_rate_per_hour(*p),
                                               86_400.0, pool_rng(seed, p))) for p in pools))
    return sum(counts) / seeds, sum(c > 0 for c in counts) / seeds


def simulate(payload: PlanFile, catalog, perf, *, horizon_s: float, seed: int,
             rate_scale: float, event: tuple[float, tuple[str, str]] | None = None
             ) -> tuple[dict, dict, float]:
    slos = payload.slos
    reqs = merge(*[synthetic(m, rate_rps=d, duration_s=horizon_s, seed=1000 * k,
                             prompt_tokens=slos[m].input_tokens,
                             output_tokens=slos[m].output_tokens)
                   for k, (m, d) in enumerate(sorted((payload.demand_rps or {}).items())) if d > 0])
    sim = Simulator(instances_from_plan(payload, slos), perf=perf, catalog=catalog,
                    config=SimConfig(workers=1))
    replanner = AllocatorReplanner(payload, catalog=catalog, perf=perf)
    run = PreemptionRun(sim, payload.instances, slos, ScaledRates(catalog, rate_scale),
                        replanner, PreemptionConfig(seed=seed, startup_s=replanner.startup_s))
    run.install(horizon_s, extra_pools=replanner.pools())
    if event is not None:
        run.preempt_at(*event)
    t0 = time.process_time()
    result = sim.run(reqs)
    cpu = time.process_time() - t0
    return summarize(result, slos), run.report(result), cpu


def spot_pools(payload: PlanFile) -> list[tuple[str, str]]:
    return sorted({p for r in payload.instances if row_market(r) == "spot"
                   for p in row_pools(r)})


def event_windows(payloads: dict, catalog, perf, *, window_s: float, at_s: float,
                  min_prob: float, out: dict) -> None:
    """Each plan simulated for `window_s` without any event, then once per spot pool whose
    hourly probability of an event is at least `min_prob`, that pool reclaimed at `at_s`
    (no other event); `window_figures` turns them into hourly probabilities of a model
    below 99 % (the simulator's counterpart of the planner's P(short in 1 h): single events,
    the pools not simulated counted as hits, so an upper bound) and expected attainment
    over 24 h."""
    for name, payload in payloads.items():
        base, _, cpu = simulate(payload, catalog, perf, horizon_s=window_s, seed=0,
                                rate_scale=0.0)
        base_att = {m: v["slo_attainment"] for m, v in base["models"].items()}
        rec: dict = {"no_event": base_att, "no_event_cpu_s": cpu, "pools": {}}
        print(f"  {name:12s} no event: worst model {min(base_att.values()):.2%} "
              f"({cpu:.0f} s CPU)", flush=True)
        rows = []
        for pool in spot_pools(payload):
            rate = catalog.preemption_rate_per_hour(*pool)
            p_hour = -math.expm1(-rate)
            if p_hour < min_prob:
                rows.append((pool, rate, p_hour, None))
                continue
            summary, rep, cpu = simulate(payload, catalog, perf, horizon_s=window_s, seed=0,
                                         rate_scale=0.0, event=(at_s, pool))
            att = {m: v["slo_attainment"] for m, v in summary["models"].items()}
            rows.append((pool, rate, p_hour, att))
            hit = sorted(m for m, a in att.items() if a < 0.99)
            print(f"    {pool[0]}@{pool[1]} (P(event in 1 h) {p_hour:.2e}): "
                  f"{rep['instances_reclaimed']} reclaimed, {rep['replacements_started']} "
                  f"started; below 99 %: {', '.join(f'{m} {att[m]:.1%}' for m in hit) or 'none'}"
                  f" ({cpu:.0f} s CPU)", flush=True)
            rec["pools"][f"{pool[0]}@{pool[1]}"] = {"p_event_1h": p_hour, "models": att,
                                                    "preemptions": rep, "cpu_s": cpu}
        for pool, rate, p_hour, att in rows:
            if att is None:
                rec["pools"][f"{pool[0]}@{pool[1]}"] = {"p_event_1h": p_hour, "rate_per_hour":
                                                        rate, "models": None}
            else:
                rec["pools"][f"{pool[0]}@{pool[1]}"]["rate_per_hour"] = rate
        rec["window_s"] = window_s
        print_windows(name, rec)
        out["plans"][name]["event_windows"] = rec


def extend_windows(saved: dict, payloads: dict, catalog, perf, *, at_s: float) -> None:
    """Simulate the pools a saved run left out (below its `--min-pool-prob`), in place."""
    for name, plan in saved["plans"].items():
        rec = plan.get("event_windows")
        if rec is None:
            continue
        for key, pool in rec["pools"].items():
            if pool["models"] is not None:
                continue
            g, region = key.split("@")
            summary, rep, cpu = simulate(payloads[name], catalog, perf,
                                         horizon_s=rec["window_s"], seed=0, rate_scale=0.0,
                                         event=(at_s, (g, region)))
            att = {m: v["slo_attainment"] for m, v in summary["models"].items()}
            pool.update(models=att, preemptions=rep, cpu_s=cpu)
            hit = sorted(m for m, a in att.items() if a < 0.99)
            print(f"    {name}: {key} (P(event in 1 h) {pool['p_event_1h']:.2e}): "
                  f"{rep['instances_reclaimed']} reclaimed, {rep['replacements_started']} "
                  f"started; below 99 %: {', '.join(f'{m} {att[m]:.1%}' for m in hit) or 'none'}"
                  f" ({cpu:.0f} s CPU)", flush=True)
        print_windows(name, rec)


def window_figures(rec: dict) -> tuple[dict, dict, dict]:
    """From one plan's event windows: per model, the hourly probability that its window
    falls below 99 %, that the hour holding the window does (the window's loss spread over
    the hour, the rest of the hour as without events), and the expected attainment over
    24 h (each pool's events per day times the requests its window lost). Pools not
    simulated count as hitting every model."""
    window_s = rec["window_s"]
    p_window: dict[str, float] = {}
    p_hour: dict[str, float] = {}
    day: dict[str, float] = {}
    for m, a0 in rec["no_event"].items():
        pw = ph = lost = 0.0
        for pool in rec["pools"].values():
            att = pool["models"]
            if att is None:
                pw += pool["p_event_1h"]
                ph += pool["p_event_1h"]
                continue
            drop = max(0.0, a0 - att.get(m, a0))
            pw += pool["p_event_1h"] if att.get(m, a0) < 0.99 else 0.0
            ph += pool["p_event_1h"] if a0 - drop * window_s / 3600 < 0.99 else 0.0
            lost += pool["rate_per_hour"] * 24 * drop * window_s / 86_400
        p_window[m], p_hour[m], day[m] = pw, ph, a0 - lost
    return p_window, p_hour, day


def print_windows(name: str, rec: dict) -> None:
    p_window, p_hour, day = window_figures(rec)
    rec["p_window_below_99_per_hour"] = p_window
    rec["p_hour_below_99"] = p_hour
    rec["expected_attainment_24h"] = day
    for label, fig, fmt in (("P(its window below 99 %) per hour", p_window, "{:.2e}"),
                            ("P(an hour below 99 %)", p_hour, "{:.2e}"),
                            ("expected attainment over 24 h", day, "{:.2%}")):
        print(f"  {name:12s} {label}: "
              + ", ".join(f"{m} {fmt.format(v)}" for m, v in fig.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--horizon", type=float, default=900.0, help="simulated seconds")
    ap.add_argument("--rate-scale", type=float, default=1.0,
                    help="multiply the catalog's preemption rates (1: as they are)")
    ap.add_argument("--seeds", type=int, default=1, help="simulated runs per plan")
    ap.add_argument("--days-seeds", type=int, default=1000, help="24-hour event draws")
    ap.add_argument("--plans-dir", type=Path, default=Path("out/bench-spot"))
    ap.add_argument("--replan", action="store_true", help="plan again even if the files exist")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--event-windows", action="store_true",
                    help="instead of drawn events: each spot pool reclaimed alone in a window")
    ap.add_argument("--window", type=float, default=480.0, help="event window, s")
    ap.add_argument("--event-at", type=float, default=20.0, help="event time in the window, s")
    ap.add_argument("--min-pool-prob", type=float, default=1e-3,
                    help="simulate the pools at least this likely to have an event in 1 h")
    ap.add_argument("--summarise", type=Path,
                    help="print the event-window figures of a --json file written before")
    ap.add_argument("--extend", type=Path,
                    help="simulate the pools a saved --event-windows run left out, and save")
    args = ap.parse_args()
    if args.summarise:
        saved = json.loads(args.summarise.read_text())
        for name, rec in saved["plans"].items():
            if "event_windows" in rec:
                print_windows(name, rec["event_windows"])
        return
    args.plans_dir.mkdir(parents=True, exist_ok=True)
    catalog = default_catalog()
    perf = default_perf_factory(catalog)
    payloads = {name: read_plan(plan(name, flags, args.plans_dir, args.replan))
                for name, flags in PLANS.items()}
    if args.extend:
        saved = json.loads(args.extend.read_text())
        extend_windows(saved, payloads, catalog, perf, at_s=args.event_at)
        args.extend.write_text(json.dumps(saved, indent=2) + "\n")
        return
    out: dict = {"horizon_s": args.horizon, "rate_scale": args.rate_scale, "plans": {}}
    print(f"\n24 h at the catalog's rates ({args.days_seeds} draws): events hitting a plan's "
          "spot pools")
    for name, payload in payloads.items():
        mean, share = events_per_day(payload, catalog, args.days_seeds)
        spot = payload.spot.to_dict() if payload.spot is not None else {}
        print(f"  {name:12s} ${payload.report['cost_per_hour']:>9,.2f}/hour planned, spot share "
              f"{spot.get('spot_share', 0.0):.1%}: {mean:.3f} events/day, a day with one or "
              f"more {share:.1%}")
        out["plans"][name] = {"planned_usd_per_hour": payload.report["cost_per_hour"],
                              "spot": spot, "events_per_day": mean,
                              "days_with_events": share, "runs": []}
    if args.event_windows:
        print(f"\nEvent windows of {args.window:,.0f} s, the event at {args.event_at:g} s")
        event_windows(payloads, catalog, perf, window_s=args.window, at_s=args.event_at,
                      min_prob=args.min_pool_prob, out=out)
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
        return
    print(f"\nSimulated {args.horizon:,.0f} s with preemptions at {args.rate_scale:g}x the "
          "catalog's rates")
    for name, payload in payloads.items():
        for seed in range(args.seeds):
            summary, rep, cpu = simulate(payload, catalog, perf, horizon_s=args.horizon,
                                         seed=seed, rate_scale=args.rate_scale)
            models = {m: v["slo_attainment"] for m, v in summary["models"].items()}
            print(f"  {name:12s} seed {seed}: ${rep['cost_per_hour']:,.2f}/hour held "
                  f"(${rep['cost_usd']:,.2f}), {rep['events']} events, "
                  f"{rep['instances_reclaimed']} instances reclaimed, "
                  f"{rep['replacements_started']} started / {rep['instances_stopped']} "
                  f"stopped by re-plans, requests retried {rep['requests_retried']} failed "
                  f"{rep['requests_failed']} rejected {rep['requests_rejected']}; SLO "
                  f"attainment {summary['slo_attainment']:.2%}, worst model "
                  f"{min(models.values()):.2%}; {cpu:.0f} s CPU", flush=True)
            print("      " + ", ".join(f"{m} {a:.2%}" for m, a in models.items()))
            out["plans"][name]["runs"].append({"seed": seed, "preemptions": rep,
                                               "slo_attainment": summary["slo_attainment"],
                                               "models": models, "cpu_s": cpu})
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
