"""Spot prices, interruption bands and notices in the catalog: the built-in figures, the rates
derived from them, and bad entries refused with the file, the entry and the field."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from coral.catalog import CatalogError, default_catalog, load_catalog
from coral.catalog.schema import Interruption


def test_builtin_spot_prices_are_sourced_and_below_on_demand() -> None:
    cat = default_catalog()
    clouds = set()
    for node in cat.node_types.values():
        for spot in node.spot_prices:
            on_demand = node.price_in(spot.region)
            assert on_demand is not None, (node.name, spot.region)
            assert 0 < spot.usd_per_hour < on_demand, (node.name, spot.region)
            assert spot.date is not None, (node.name, spot.region)
            # every figure names the file and the commit it was read from
            assert re.search(r"\(catalogs/v\d+/\w+/vms\.csv at [0-9a-f]{7}\)", spot.source), \
                (node.name, spot.region, spot.source)
            if spot.approximate:  # an uncertain figure says why
                assert "uncertain" in spot.source, (node.name, spot.region)
            clouds.add(cat.region(spot.region).cloud)
    assert clouds == {"aws", "gcp", "azure"}
    # g2-standard-4 VM spot 0.05874 + one L4 0.2231 (SkyPilot's GCP CSV, us-central1)
    assert cat.node_type("1x-l4").spot_price_in("gcp-us-central1") == pytest.approx(0.28184)
    assert cat.node_type("1x-l4").spot_price_in("aws-us-east-1") == pytest.approx(0.38205)
    assert cat.node_type("8x-a100-40gb").spot_price_in("azure-eastus") == pytest.approx(2.99167)
    # no spot row (P5 not read) or no discount in the file (Azure's NC40ads_H100_v5)
    assert cat.node_type("8x-h100-sxm").spot_price_in("aws-us-east-1") is None
    assert not cat.node_type("1x-h100-nvl").spot_prices


def test_aws_pools_carry_their_advisor_band() -> None:
    cat = default_catalog()
    n = 0
    for node in cat.node_types.values():
        for spot in node.spot_prices:
            if not spot.region.startswith("aws-"):
                assert spot.interruption is None  # GCP and Azure: the cloud's default
                continue
            band = spot.interruption
            assert band is not None and not band.approximate and band.per == "month"
            assert "spot-advisor-data.json" in band.source and band.date is not None
            assert node.instances["aws"] in band.source
            n += 1
    assert n > 0
    assert cat.interruption("4x-l4", "aws-eu-central-1").band == "<5%"
    assert cat.interruption("1x-l4", "aws-us-east-1").band == ">20%"
    assert cat.interruption("1x-l40s", "aws-us-east-1").band == "5-10%"


def test_cloud_defaults_say_whether_they_are_published() -> None:
    cat = default_catalog()
    gcp = cat.clouds["gcp"].default_interruption
    assert (gcp.band, gcp.per, gcp.approximate) == ("5-15%", "day", False)
    assert "5% and 15% per day per project" in gcp.source
    for cloud in ("aws", "azure"):
        default = cat.clouds[cloud].default_interruption
        assert default.approximate and default.source.startswith("Assumed")
    assert cat.interruption("1x-t4", "azure-eastus") == cat.clouds["azure"].default_interruption
    assert cat.interruption("1x-l4", "gcp-us-central1") == gcp


@pytest.mark.parametrize("band, per, share, hours", [
    (">20%", "month", 0.25, 730.0),
    ("<5%", "month", 0.025, 730.0),
    ("10-15%", "month", 0.125, 730.0),
    ("5-15%", "day", 0.10, 24.0),
])
def test_a_band_is_a_share_of_instances_reclaimed_per_period(band: str, per: str, share: float,
                                                             hours: float) -> None:
    i = Interruption(band=band, per=per, source="test fixture")  # type: ignore[arg-type]
    rate = i.rate_per_hour()
    # a Poisson hazard that reclaims exactly `share` of the nodes within one period ...
    assert 1 - math.exp(-rate * hours) == pytest.approx(share)
    assert rate == pytest.approx(-math.log(1 - share) / hours)
    # ... which is more than `share` events per node-period read as a count
    assert rate > share / hours


def test_preemption_rates_of_the_builtin_pools() -> None:
    cat = default_catalog()
    # AWS g6.xlarge in us-east-1: the advisor's >20 % band, read as 25 %/month
    rate = cat.preemption_rate_per_hour("1x-l4", "aws-us-east-1")
    assert rate == pytest.approx(-math.log(0.75) / 730.0) == pytest.approx(3.94e-4, rel=1e-3)
    # g6.12xlarge in eu-central-1: <5 %/month
    assert cat.preemption_rate_per_hour("4x-l4", "aws-eu-central-1") == pytest.approx(
        -math.log(0.975) / 730.0)
    # every GCP pool: 10 % of instances per day
    assert cat.preemption_rate_per_hour("1x-a100-40gb", "gcp-us-central1") == pytest.approx(
        -math.log(0.9) / 24.0) == pytest.approx(4.39e-3, rel=1e-3)
    assert cat.preemption_notice_s("aws-us-east-1") == 120
    assert cat.preemption_notice_s("gcp-us-central1") == 30
    assert cat.preemption_notice_s("azure-eastus") == 30


def test_a_pool_band_overrides_the_cloud_default(tmp_path: Path) -> None:
    extra = tmp_path / "spot.yaml"
    extra.write_text("""\
node_types:
  - name: 1x-t4
    spot_prices:
      - region: aws-us-east-1
        usd_per_hour: 0.2
        source: "test fixture"
        interruption: {band: "<5%", source: "test fixture"}
""")
    cat = load_catalog([extra])
    assert cat.preemption_rate_per_hour("1x-t4", "aws-us-east-1") == pytest.approx(
        -math.log(1 - 0.025) / 730.0)
    # the file replaced the node type's whole list: the pools it did not name have no spot
    # price and fall back to the cloud default
    assert cat.node_type("1x-t4").spot_price_in("aws-us-west-2") is None
    assert cat.preemption_rate_per_hour("1x-t4", "aws-us-west-2") == pytest.approx(
        -math.log(0.75) / 730.0)


def test_spot_figures_leave_the_template_cache_key_alone(tmp_path: Path) -> None:
    extra = tmp_path / "spot.yaml"
    extra.write_text("""\
node_types:
  - name: 1x-l4
    spot_prices:
      - {region: aws-us-east-1, usd_per_hour: 0.3, source: "test fixture"}
clouds:
  - name: aws
    notice_s: 60
    notice_source: "test fixture"
    default_interruption: {band: "5-10%", source: "test fixture"}
""")
    cat = load_catalog([extra])
    assert cat.preemption_notice_s("aws-us-east-1") == 60
    assert cat.content_hash() == default_catalog().content_hash()
    # and with every built-in spot price gone
    bare = tmp_path / "no-spot.yaml"
    bare.write_text(yaml.safe_dump({"node_types": [
        {"name": name, "spot_prices": []} for name in default_catalog().node_types]}))
    cat = load_catalog([bare])
    assert not any(n.spot_prices for n in cat.node_types.values())
    assert cat.content_hash() == default_catalog().content_hash()


@pytest.mark.parametrize("body, field, what", [
    ("""\
node_types:
  - name: 1x-l4
    spot_prices:
      - {region: aws-us-east-1, usd_per_hour: 5.0, source: "test fixture"}
""", "spot_prices", "exceeds the on-demand"),
    ("""\
node_types:
  - name: 1x-l4
    spot_prices:
      - {region: azure-eastus, usd_per_hour: 0.1, source: "test fixture"}
""", "spot_prices", "no on-demand price"),
    ("""\
node_types:
  - name: 1x-l4
    spot_prices:
      - region: aws-us-east-1
        usd_per_hour: 0.3
        source: "test fixture"
        interruption: {band: "30%", source: "test fixture"}
""", "spot_prices.0.interruption.band", "Input should be"),
    ("""\
clouds:
  - name: aws
    notice_s: 120
    notice_source: "test fixture"
    default_interruption: {band: "5-15%", per: week, source: "test fixture"}
""", "default_interruption.per", "Input should be"),
    ("""\
clouds:
  - name: lambda
    notice_source: "test fixture"
    default_interruption: {band: "5-10%", source: "test fixture"}
""", "notice_s", "missing"),
])
def test_bad_spot_entries_name_file_entry_and_field(tmp_path: Path, body: str, field: str,
                                                    what: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(CatalogError) as err:
        load_catalog([path])
    msg = str(err.value)
    assert str(path) in msg
    assert any(f"'{name}'" in msg for name in ("1x-l4", "lambda", "aws"))
    assert f"field '{field}" in msg
    assert what.lower() in msg.lower()
