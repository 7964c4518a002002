"""SLO and workload defaults, overrides and error messages."""

from __future__ import annotations

import pytest

from coral.catalog import default_catalog
from coral.templates.slo import SloError, SloSpec, default_slo, resolve_slo


def test_every_catalog_model_has_a_sensible_default():
    cat = default_catalog()
    previous = None
    for arch in sorted(cat.models.values(), key=lambda m: m.weight_bytes):
        slo = default_slo(arch)
        assert 0.1 <= slo.tpot_s <= 0.2
        assert 2.0 <= slo.ttft_s <= 5.0
        assert slo.percentile == 0.9
        assert (slo.input_tokens, slo.output_tokens) == (1024, 256)
        if previous is not None:  # never tighter for a bigger model
            assert slo.tpot_s >= previous.tpot_s and slo.ttft_s >= previous.ttft_s
        previous = slo


def test_unknown_model_falls_back_to_weight_brackets():
    small = default_slo("my-model", weight_bytes=10e9)
    big = default_slo("my-model", weight_bytes=900e9)
    assert (small.tpot_s, small.ttft_s) == (0.10, 2.0)
    assert (big.tpot_s, big.ttft_s) == (0.20, 5.0)
    with pytest.raises(SloError, match="weight size is unknown"):
        default_slo("my-model")


def test_overrides_and_key():
    arch = default_catalog().model("llama-3.1-8b")
    base = resolve_slo(arch)
    tight = resolve_slo(arch, tpot_s=0.05, input_tokens=2048)
    assert tight.tpot_s == 0.05 and tight.input_tokens == 2048 and tight.ttft_s == base.ttft_s
    assert tight.key() != base.key() and base.key() == resolve_slo(arch).key()
    with pytest.raises(Exception):
        base.tpot_s = 1.0  # frozen


@pytest.mark.parametrize(
    "values, match",
    [
        ({"tpot_s": -0.1, "ttft_s": 2.0}, "tpot_s"),
        ({"tpot_s": 0.1, "ttft_s": 0.0}, "ttft_s"),
        ({"tpot_s": 0.5, "ttft_s": 0.2}, "below tpot_s"),
        ({"tpot_s": 0.1, "ttft_s": 2.0, "percentile": 1.5}, "percentile"),
        ({"tpot_s": 0.1, "ttft_s": 2.0, "input_tokens": 0}, "input_tokens"),
        ({"tpot_s": 0.1, "ttft_s": 2.0, "output_tokens": -3}, "output_tokens"),
        ({"tpot_s": 0.1, "ttft_s": 2.0, "colour": "red"}, "colour"),
    ],
)
def test_bad_values_are_named(values, match):
    with pytest.raises(SloError, match=match):
        SloSpec.parse(values)


def test_non_finite_override_is_refused():
    arch = default_catalog().model("llama-3.1-8b")
    with pytest.raises(SloError, match="finite"):
        resolve_slo(arch, tpot_s=float("nan"))


def test_parse_refuses_a_non_mapping():
    with pytest.raises(SloError, match="must map field names to values"):
        SloSpec.parse([("tpot_s", 0.1), ("ttft_s", 2.0)])  # type: ignore[arg-type]


def test_overrides_are_checked_again():
    base = SloSpec.parse({"tpot_s": 0.1, "ttft_s": 2.0})
    assert base.with_overrides(percentile=None) == base
    with pytest.raises(SloError, match="SLO field 'ttft_s': .*below tpot_s"):
        base.with_overrides(ttft_s=0.05)
