"""How far the template DP's own ratings are from the pipeline step model the simulator runs.

The placement DP rates a pipeline as a flow (each node its own batch, TPOT = the sum of step
times); the simulator and the planner's sizing run the micro-batched step model of
`coral.perf.step`. For every one-pipeline template of a scenario's libraries this prints, per
mode, the step model's busy rate over the DP's rate and its busy step over the DP's TPOT
(quantiles), and how many templates, busy, would step slower than the TPOT target (the
planner does not plan those). A ratio of 1 everywhere would mean the DP optimises exactly
what runs.

    python benchmarks/step_model_gap.py [--scenario core] [--nmax 3] [--modes aggregated pd]
        [--engine coral|vllm]
"""

from __future__ import annotations

import argparse

from coral.planning.libraries import templates_for_scenario
from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog
from coral.perf.step import template_saturation
from coral.templates.builder.build_options import BuildOptions
from coral.templates.builder.parallel import default_perf_factory


def _q(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--nmax", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["aggregated", "pd"])
    ap.add_argument("--engine", default="coral", choices=["coral", "vllm"])
    ap.add_argument("--templates-dir", default="out/templates")
    args = ap.parse_args()
    cat = default_catalog()
    perf = default_perf_factory(cat)
    for scenario_mode in args.modes:
        scenario = load_scenario(args.scenario, catalog=cat)
        scenario = scenario.in_mode(scenario_mode)
        st = templates_for_scenario(scenario, cat, perf, out_root=args.templates_dir,
                                    nmax=args.nmax,
                                    options=BuildOptions(engine=args.engine, workers=2))
        for mode in scenario.template_modes:
            rate, step, busy_miss, multi = [], [], 0, 0
            for tpls in st.by_model.values():
                for t in tpls:
                    if t.mode != mode or not t.is_pipeline:
                        continue
                    sat = template_saturation(t, perf=perf, catalog=cat)
                    if sat is None:
                        continue
                    multi += len(t.shape.stages) > 1
                    rate.append(sat.rps / t.throughput_rps)
                    if mode != "prefill" and t.tpot_s:
                        step.append(sat.step_s / t.tpot_s)
                        busy_miss += sat.step_s > t.slo.tpot_s * (1 + 1e-9)
            if not rate:
                continue
            rate.sort()
            step.sort()
            line = (f"{args.scenario} {args.engine} n_max {args.nmax} {mode}: {len(rate)} templates "
                    f"({multi} multi-stage); step-model rate / DP rate median "
                    f"{_q(rate, .5):.3f}, p10 {_q(rate, .1):.3f}, min {rate[0]:.3f}")
            if step:
                line += (f"; busy step / DP TPOT median {_q(step, .5):.3f}, p90 "
                         f"{_q(step, .9):.3f}; busy step over the TPOT target: {busy_miss}")
            print(line)


if __name__ == "__main__":
    main()
