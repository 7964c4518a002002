"""Spot prices, interruption bands and notices in the catalog: the built-in figures, the rates
derived from them, and bad entries refused with the file, the entry and the field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from coral.catalog import CatalogError, default_catalog, load_catalog


def test_builtin_spot_prices_are_sourced_and_below_on_demand() -> None:
    cat = default_catalog()
    n = 0
    for node in cat.node_types.values():
        for spot in node.spot_prices:
            on_demand = node.price_in(spot.region)
            assert on_demand is not None and 0 < spot.usd_per_hour <= on_demand
            assert spot.source and spot.date is not None
            # only the AWS figures were read from a price list; the rest say they are estimates
            assert spot.approximate == (not spot.region.startswith("aws-"))
            n += 1
    assert n > 0
    assert cat.node_type("1x-l4").spot_price_in("aws-us-east-1") == pytest.approx(0.38205)
    assert cat.node_type("8x-h100-sxm").spot_price_in("aws-us-east-1") is None


def test_preemption_rate_is_the_band_midpoint_over_a_month() -> None:
    cat = default_catalog()
    # every built-in pool takes its cloud's default, the >20 % band read as 25 %/month
    rate = cat.preemption_rate_per_hour("1x-l4", "aws-us-east-1")
    assert rate == pytest.approx(-math.log(0.75) / 730.0)
    assert 1 - math.exp(-rate * 730.0) == pytest.approx(0.25)
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
    # the pools the override did not name fall back to the cloud default
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
    assert ("'1x-l4'" in msg) or ("'lambda'" in msg)
    assert f"field '{field}" in msg
    assert what.lower() in msg.lower()
