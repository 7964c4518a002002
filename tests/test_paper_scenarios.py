"""The paper's setups (scenarios paper-core and paper-extended) and the catalog entries they
use: models and per-phase SLOs as the paper's table, demand and its variants, availability
levels, and prices as their sources give them (pro rata where no instance is sold)."""

from __future__ import annotations

import csv
import datetime as dt
import math
from importlib import resources

import pytest

from coral.allocator.scenario.load import load_scenario, parse_scenario
from coral.allocator.scenario.spec import ScenarioError
from coral.catalog import default_catalog

#: The paper's table: model -> (prefill SLO s = TTFT bound, decode SLO s = TPOT bound, trace).
PAPER_MODELS = {
    "phi-4": (1.2, 0.060, "azure-conv-2023"),
    "gpt-oss-20b": (0.9, 0.030, "azure-code-2023"),
    "qwen3-32b": (1.6, 0.100, "burstgpt-standin"),
    "llama-3.3-70b": (1.5, 0.080, "burstgpt-standin"),
    "gpt-oss-120b": (1.0, 0.040, "azure-conv-2023"),
    "qwen3-235b-a22b": (1.8, 0.120, "azure-code-2023"),
}
CORE = ("phi-4", "gpt-oss-20b", "qwen3-32b")
SMALL_GPUS = ("l40s", "l4", "a10g")
BIG_GPUS = ("h100-sxm", "a100-80gb")

#: (node type, region) -> on-demand $/hour as read from the SkyPilot catalog CSVs
#: (catalogs/v8/aws/vms.csv at e385a0d; gcp: VM rows at 8427bbf), and whether derived.
SOURCED = {
    ("1x-l4", "aws-us-east-2"): (0.8048, False), ("4x-l4", "aws-us-east-2"): (4.6016, False),
    ("8x-l4", "aws-us-east-2"): (13.3504, False),
    ("1x-l4", "aws-ap-northeast-2"): (0.9896, False),
    ("4x-l4", "aws-ap-northeast-2"): (5.65823, False),
    ("8x-l4", "aws-ap-northeast-2"): (16.41595, False),
    ("1x-a10g", "aws-us-east-2"): (1.006, False), ("4x-a10g", "aws-us-east-2"): (5.672, False),
    ("8x-a10g", "aws-us-east-2"): (16.288, False),
    ("1x-a10g", "aws-ap-northeast-2"): (1.237, False),
    ("4x-a10g", "aws-ap-northeast-2"): (6.97442, False),
    ("8x-a10g", "aws-ap-northeast-2"): (20.02809, False),
    ("1x-l40s", "aws-us-east-2"): (1.861, False), ("4x-l40s", "aws-us-east-2"): (10.49264, False),
    ("8x-l40s", "aws-us-east-2"): (30.13118, False),
    ("1x-l40s", "aws-ap-northeast-2"): (2.288, False),
    ("4x-l40s", "aws-ap-northeast-2"): (12.90014, False),
    ("8x-l40s", "aws-ap-northeast-2"): (37.04468, False),
    ("1x-h100-sxm", "aws-us-east-2"): (6.88, False),
    ("8x-h100-sxm", "aws-us-east-2"): (55.04, False),
    ("2x-a100-80gb", "gcp-us-central1"): (10.14, True),
    ("4x-a100-80gb", "gcp-us-central1"): (20.28, True),
    ("2x-h100-sxm", "gcp-us-central1"): (10.76654, True),
    ("4x-h100-sxm", "gcp-us-central1"): (21.53307, True),
}
#: Configurations AWS sells no instance of, priced pro rata from the family's larger size:
#: (node type, region) -> (the size it is derived from, GPUs of that size).
PRO_RATA = {
    (f"2x-{g}", r): (f"4x-{g}", 4) for g in SMALL_GPUS
    for r in ("aws-us-east-2", "aws-ap-northeast-2")
} | {(f"{n}x-h100-sxm", "aws-us-east-2"): ("8x-h100-sxm", 8) for n in (2, 4)}


@pytest.fixture(scope="module")
def cat():
    return default_catalog()


@pytest.mark.parametrize("name", ["paper-core", "paper-extended"])
def test_models_slos_and_traces_are_the_papers(name, cat):
    sc = load_scenario(name, catalog=cat)
    expected = CORE if name == "paper-core" else tuple(PAPER_MODELS)
    assert tuple(m.name for m in sc.models) == expected
    rps = 10.0 if name == "paper-core" else 25.0
    for m in sc.models:
        ttft, tpot, trace = PAPER_MODELS[m.name]
        assert (m.ttft_s, m.tpot_s, m.trace, m.demand_rps) == (ttft, tpot, trace, rps)
    assert sc.mode == "pd"  # the paper's setting
    assert sc.spec.n_max == 6 and sc.spec.rho == 12


@pytest.mark.parametrize("name,gpus,regions", [
    ("paper-core", SMALL_GPUS, ("aws-us-east-2", "aws-ap-northeast-2")),
    ("paper-extended", SMALL_GPUS + BIG_GPUS,
     ("aws-us-east-2", "aws-ap-northeast-2", "gcp-us-central1")),
])
def test_configurations_and_regions(name, gpus, regions, cat):
    sc = load_scenario(name, catalog=cat)
    assert set(sc.node_types) == {f"{n}x-{g}" for g in gpus for n in (1, 2, 4, 8)}
    assert sc.regions == regions
    # every configuration is rentable somewhere at the default level
    assert {g for g, _ in sc.availability} == set(sc.node_types)
    for (g, r), n in sc.availability.items():
        assert n > 0 and (g, r) in sc.node_prices


@pytest.mark.parametrize("name,largest,smallest", [
    ("paper-core", {"qwen3-32b"}, {"phi-4"}),
    ("paper-extended", {"qwen3-235b-a22b", "gpt-oss-120b"}, {"phi-4", "gpt-oss-20b"}),
])
def test_demand_variants_send_80_percent_to_a_third(name, largest, smallest, cat):
    base = load_scenario(name, catalog=cat)
    total = sum(m.demand_rps for m in base.models)
    for level, third in (("large-heavy", largest), ("small-heavy", smallest)):
        sc = load_scenario(name, level=level, catalog=cat)
        demand = {m.name: m.demand_rps for m in sc.models}
        assert sum(demand.values()) == pytest.approx(total)
        assert sum(demand[m] for m in third) == pytest.approx(0.8 * total)
        assert len(third) == len(demand) // 3
        others = {v for m, v in demand.items() if m not in third}
        assert len(others) == 1  # the rest share the other 20 % evenly
        assert sc.availability == base.availability  # the default availability
        assert [m.ttft_s for m in sc.models] == [m.ttft_s for m in base.models]


@pytest.mark.parametrize("name,margin", [("paper-core", 0.25), ("paper-extended", 0.75)])
def test_scarce_supply_is_the_stated_margin_over_the_estimate(name, margin, cat):
    sc = load_scenario(name, level="scarce", catalog=cat)
    gpus = sum(cat.node_types[g].gpu_count * n for (g, _), n in sc.availability.items())
    estimate = int(sc.spec.levels["scarce"].description.split("(")[1].split(" GPUs")[0])
    assert math.ceil((1 + margin) * estimate) <= gpus <= math.ceil((1 + margin) * estimate) + 7
    assert {r for _, r in sc.availability} == set(sc.regions)  # spread over every region


def test_prices_are_as_sourced(cat):
    for (g, r), (usd, approximate) in SOURCED.items():
        price = next(p for p in cat.node_types[g].prices if p.region == r)
        assert price.usd_per_hour == usd, (g, r)
        assert price.approximate is approximate, (g, r)
        assert price.date == dt.date(2026, 12, 6)


def test_pro_rata_prices_are_the_larger_sizes_per_gpu_and_marked(cat):
    for (g, r), (source, gpus) in PRO_RATA.items():
        node = cat.node_types[g]
        price = next(p for p in node.prices if p.region == r)
        per_gpu = cat.node_types[source].price_in(r) / gpus
        assert price.usd_per_hour == pytest.approx(node.gpu_count * per_gpu, rel=1e-6)
        assert price.approximate and "pro rata" in price.source
        assert node.instances["aws"] == ""  # no instance type to ask AWS for


def test_configurations_the_clouds_do_not_sell_stay_unpriced(cat):
    for n in (1, 2, 4, 8):
        assert cat.node_types[f"{n}x-a100-80gb"].price_in("aws-us-east-2") is None
        assert cat.node_types[f"{n}x-h100-sxm"].price_in("aws-ap-northeast-2") is None
        for g in ("a10g", "l40s"):
            assert cat.node_types[f"{n}x-{g}"].price_in("gcp-us-central1") is None


@pytest.mark.parametrize("name", ["core", "advanced"])
def test_existing_scenarios_see_none_of_the_new_prices(name, cat):
    """Prices added for the paper's setups are dated 2026-12-06; the older scenarios' plans do
    not move because none of those prices is in them."""
    sc = load_scenario(name, catalog=cat)
    for g, r in sc.node_prices:
        price = next(p for p in cat.node_types[g].prices if p.region == r)
        assert price.date < dt.date(2026, 12, 6), (g, r)


def test_burstgpt_standin_matches_the_scenario_shape():
    path = resources.files("coral.sim") / "data" / "burstgpt_standin.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    prompts = [int(r["num_prefill_tokens"]) for r in rows]
    outputs = [int(r["num_decode_tokens"]) for r in rows]
    model = next(m for m in load_scenario("paper-core").models if m.name == "qwen3-32b")
    assert model.trace == "burstgpt-standin"
    assert sum(prompts) / len(prompts) == pytest.approx(model.input_tokens, rel=0.01)
    assert sum(outputs) / len(outputs) == pytest.approx(model.output_tokens, rel=0.01)


DEMAND_LEVEL = """
schema_version: 1
name: t
models:
  - {name: phi-4, demand_rps: 10, tpot_s: 0.06, ttft_s: 1.2}
  - {name: qwen3-32b, demand_rps: 10, tpot_s: 0.1, ttft_s: 1.6}
regions: [{name: aws-us-east-2}]
base_availability: {1x-l40s: 4}
availability: base
levels:
  base: {scale: 1.0}
  skew: {scale: 0.5, demand_rps: {DEMAND}}
"""


def test_a_level_replaces_only_the_demand_it_names(cat):
    sc = parse_scenario(DEMAND_LEVEL.replace("{DEMAND}", "{phi-4: 16}"), level="skew",
                        catalog=cat)
    assert {m.name: m.demand_rps for m in sc.models} == {"phi-4": 16.0, "qwen3-32b": 10.0}
    assert sc.availability == {("1x-l40s", "aws-us-east-2"): 2}
    base = parse_scenario(DEMAND_LEVEL.replace("{DEMAND}", "{phi-4: 16}"), catalog=cat)
    assert {m.name: m.demand_rps for m in base.models} == {"phi-4": 10.0, "qwen3-32b": 10.0}


@pytest.mark.parametrize("demand,message", [
    ("{phi-5: 1}", "levels.skew: field 'demand_rps.phi-5': unknown model"),
    ("{phi-4: -1}", "demand_rps of 'phi-4' is -1"),
])
def test_bad_level_demand_is_named(demand, message, cat):
    with pytest.raises(ScenarioError, match=message.replace(".", r"\.")):
        parse_scenario(DEMAND_LEVEL.replace("{DEMAND}", demand), catalog=cat)
