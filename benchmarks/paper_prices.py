"""A what-if of the paper's setups at the paper's relative GPU prices.

PAPER.md ("Setups") gives the relative GPU cost its evaluation uses, the mean of AWS, GCP and
RunPod with the L4 at 1: H100 7.6, A100 3.5, L40S 2.2, L4 1.0, A10G 1.2. Coral's catalog prices
the same configurations from AWS's and GCP's on-demand lists only, where an A100 80GB costs
about 7x an L4 per GPU and multi-GPU AWS nodes carry a per-GPU premium over 1-GPU ones. This
script writes a copy of `paper-core` / `paper-extended` whose every node type, in every region
that sells it, is priced at the paper's relative cost x that region's 1-GPU L4 price x its GPU
count (`price_overrides`; nothing is made available where the catalog does not sell it), so
that `coral plan` on it shows how much of a cost ratio the prices carry. Template libraries
are shared with the original scenario (the library key holds SLOs, node types and regions,
not prices), so planning it reuses them.

    python benchmarks/paper_prices.py paper-extended out/paper-extended-paper-prices.yaml
    coral plan out/paper-extended-paper-prices.yaml --json
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog

#: PAPER.md, "Setups": relative GPU cost (mean of AWS/GCP/RunPod, L4 = 1).
PAPER_RELATIVE_COST = {"h100-sxm": 7.6, "a100-80gb": 3.5, "l40s": 2.2, "l4": 1.0, "a10g": 1.2}

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "coral" / "allocator" / "data" / "scenarios"


def main(name: str, out: Path) -> None:
    cat = default_catalog()
    sc = load_scenario(name, catalog=cat)
    doc = yaml.safe_load((SCENARIO_DIR / f"{name}.yaml").read_text())
    regions = []
    for region in doc["regions"]:
        rname = region["name"]
        l4 = cat.node_type("1x-l4").price_in(rname)
        if l4 is None:
            raise SystemExit(f"{rname}: the catalog has no 1x-l4 price to anchor on")
        overrides = {}
        for node_name in sc.node_types:
            node = cat.node_type(node_name)
            sold = node.price_in(rname) is not None or node_name in region.get(
                "price_overrides", {})
            if sold:
                rel = PAPER_RELATIVE_COST[node.gpu]
                overrides[node_name] = round(rel * l4 * node.gpu_count, 4)
        regions.append({"name": rname, "price_overrides": overrides})
    doc["regions"] = regions
    doc["name"] = f"{name}-paper-prices"
    doc["description"] = (f"{name} at the paper's relative GPU prices (what-if, "
                          "benchmarks/paper_prices.py)")
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# {name} with every node priced at PAPER.md's relative GPU cost x its region's "
              "1x-l4 price x GPUs\n# (a what-if written by benchmarks/paper_prices.py; not "
              "a real price list).\n")
    out.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=200))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
