"""The paper's typical plan shapes, priced and rated under Coral's perf model and catalog.

PAPER.md ("Typical plans") says the baselines of the core setup run one replica per 2x L40S or
4x L4 node while Coral mixes shapes like 1x L4 + 3x 1x L40S, and that on the extended setup the
baselines run one 8x A100 / 8x H100 node per big-model replica while Coral combines 1-2-GPU
A100 / H100 nodes (Qwen3-235B prefill on three 1x L40S + three 2x H100 nodes: 526 prompt
tok/s/USD against 460-481 for pure-H100 layouts). Whether our cost ratios can reach the paper's
depends on how much better per dollar those shapes are *here*, so this script solves each of
them as one template (`coral templates solve`'s computation, the scenario's SLO and request
shape) and prints, per model, phase and shape: capacity (req/s at the SLO), $/hour in one
region, and the capacity per dollar (req/s per $/hour, and tokens/s per $/hour: prompt tokens
for prefill, generated tokens otherwise), next to the best single-node homogeneous shape.

    python benchmarks/paper_plans.py [paper-core|paper-extended]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog
from coral.allocator.scenario.load import scenario_slo
from coral.templates.space.operating_points import OperatingPointTables
from coral.templates.builder.parallel import default_perf_factory
from coral.templates.builder.solve import build_template

#: Shapes PAPER.md names, per setup: model -> (label, node types). "homo" rows are added from
#: every single-node configuration of the scenario.
PAPER_SHAPES: dict[str, dict[str, list[tuple[str, list[str]]]]] = {
    "paper-core": {
        "qwen3-32b": [("paper baseline: 2x L40S", ["2x-l40s"]),
                      ("paper baseline: 4x L4", ["4x-l4"]),
                      ("paper Coral: 1x L4 + 3x 1x L40S", ["1x-l4", "1x-l40s", "1x-l40s", "1x-l40s"])],
        "phi-4": [("paper baseline: 2x L40S", ["2x-l40s"]),
                  ("paper baseline: 4x L4", ["4x-l4"]),
                  ("paper Coral: 1x L4 + 3x 1x L40S", ["1x-l4", "1x-l40s", "1x-l40s", "1x-l40s"])],
        "gpt-oss-20b": [("paper baseline: 2x L40S", ["2x-l40s"]),
                        ("paper baseline: 4x L4", ["4x-l4"]),
                        ("paper Coral: 1x L4 + 3x 1x L40S", ["1x-l4", "1x-l40s", "1x-l40s", "1x-l40s"])],
    },
    "paper-extended": {
        "qwen3-235b-a22b": [
            ("paper baseline: 8x H100", ["8x-h100-sxm"]),
            ("paper baseline: 8x A100", ["8x-a100-80gb"]),
            ("paper example: 3x 1x L40S + 3x 2x H100", ["1x-l40s"] * 3 + ["2x-h100-sxm"] * 3),
            ("pure H100: 4x 2x H100", ["2x-h100-sxm"] * 4),
            ("pure H100: 2x 4x H100", ["4x-h100-sxm"] * 2),
        ],
        "llama-3.3-70b": [
            ("paper baseline: 8x H100", ["8x-h100-sxm"]),
            ("paper baseline: 8x A100", ["8x-a100-80gb"]),
            ("paper Coral: 2x 2x A100", ["2x-a100-80gb"] * 2),
            ("paper Coral: 2x H100 + 2x A100", ["2x-h100-sxm", "2x-a100-80gb"]),
        ],
        "gpt-oss-120b": [
            ("paper baseline: 8x H100", ["8x-h100-sxm"]),
            ("paper baseline: 8x A100", ["8x-a100-80gb"]),
            ("paper Coral: 1x H100 + 1x A100", ["1x-h100-sxm", "1x-a100-80gb"]),
        ],
    },
}


@dataclass(frozen=True)
class Row:
    model: str
    phase: str
    label: str
    rps: float
    usd: float
    tokens_per_req: int

    @property
    def rps_per_usd(self) -> float:
        return self.rps / self.usd if self.usd > 0 else 0.0

    @property
    def tok_per_usd(self) -> float:
        """Tokens/s per $/hour (x3600 = tokens per dollar)."""
        return self.rps_per_usd * self.tokens_per_req


def scenario_prices(sc, combo: list[str]) -> dict[str, float]:
    """$/hour of the combination in each of the scenario's regions that prices every node of
    it (the scenario's prices: catalog prices with its overrides)."""
    out = {}
    for region in sc.regions:
        prices = [sc.node_prices.get((n, region)) for n in combo]
        if all(p is not None for p in prices):
            out[region] = sum(prices)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="?", default="paper-core")
    args = ap.parse_args()
    cat = default_catalog()
    sc = load_scenario(args.scenario, catalog=cat)
    perf = default_perf_factory(cat)
    tables = OperatingPointTables(perf, cat)
    shapes = PAPER_SHAPES[args.scenario]
    t0 = time.perf_counter()
    for model, named in shapes.items():
        slo = scenario_slo(sc, model)
        arch = cat.model(model)
        combos = [(f"homo: {n}", [n]) for n in sc.node_types] + named
        print(f"\n## {model} ({slo.describe()}); $/hour in the cheapest region pricing "
              "the shape\n")
        print("| phase | shape | req/s | $/hour | req/s per $/h | tok/s per $/h | x best homo |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for phase in ("aggregated", "prefill", "decode"):
            tokens = slo.input_tokens if phase == "prefill" else slo.output_tokens
            rows: list[Row] = []
            for label, names in combos:
                tpl = build_template(arch, names, slo, phase, "flow", perf, cat,
                                     tables=tables, time_limit_s=30.0)
                priced = scenario_prices(sc, names)
                usd = min(priced.values(), default=math.nan)
                if not tpl.feasible or not math.isfinite(usd):
                    rows.append(Row(model, phase, label, 0.0, usd, tokens))
                    continue
                rows.append(Row(model, phase, label, tpl.throughput_rps, usd, tokens))
            homo = [r for r in rows if r.label.startswith("homo") and r.rps > 0]
            best = max(homo, key=lambda r: r.rps_per_usd, default=None)
            shown = ([best] if best else []) + [r for r in rows if not r.label.startswith("homo")]
            for r in shown:
                label = f"best homo = {r.label[6:]}" if r is best else r.label
                ratio = r.rps_per_usd / best.rps_per_usd if best and best.rps_per_usd else math.nan
                print(f"| {phase} | {label} | {r.rps:.2f} | {r.usd:.2f} | {r.rps_per_usd:.3f} | "
                      f"{r.tok_per_usd:.1f} | {ratio:.2f} |")
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
