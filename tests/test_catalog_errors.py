"""Bad catalog files: every problem is a `CatalogError` naming the file, the entry and the field.

The last test throws randomly mutated documents at the loader and checks that nothing but a
`CatalogError` ever comes out.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coral.catalog import CatalogError, load_catalog

GPU = """\
  - name: x9
    memory_gb: 32
    bf16_tflops: 100
    mem_bandwidth_gb_per_s: 1000
    intra_node_link: pcie
    intra_node_link_gb_per_s: 32
    architecture: other
    source: "test fixture"
"""

MODEL = """\
  - name: tiny
    hf_id: example/tiny
    num_layers: 2
    hidden_size: 64
    ffn_size: 128
    num_heads: 4
    num_kv_heads: 2
    head_dim: 16
    vocab_size: 100
    source: "test fixture"
"""


def node(gpu: str = "l4", region: str = "aws-us-east-1", usd: float = 1.0) -> str:
    return f"""\
  - name: 2x-test
    gpu: {gpu}
    gpu_count: 2
    nic_gbps: 10
    instances: {{aws: t.big}}
    prices:
      - {{region: {region}, usd_per_hour: {usd}, source: "test fixture"}}
"""


def load_error(tmp_path: Path, text: str, name: str = "user.yaml") -> tuple[str, str]:
    """Write `text`, load it on top of the built-in catalog; the error message and the path."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_catalog([path])
    return str(info.value), str(path)


def assert_names(msg: str, path: str, entry: str, field: str) -> None:
    """The message says which file, which entry (`section[index] 'name'`) and which field."""
    assert path in msg, msg
    assert entry in msg, msg
    assert f"field '{field}'" in msg, msg


# ---------------------------------------------------------------- entry fields


def test_unknown_field(tmp_path: Path) -> None:
    text = "gpus:\n" + GPU.replace("memory_gb:", "memory_gib:")
    msg, path = load_error(tmp_path, text)
    assert_names(msg, path, "gpus[0] 'x9'", "memory_gib")
    assert "unknown field" in msg
    assert "field 'memory_gb': missing field" in msg  # the typo also leaves the real one unset


def test_unknown_field_in_nested_price(tmp_path: Path) -> None:
    text = "node_types:\n" + node().replace("usd_per_hour:", "usd_per_hr: 1, usd_per_hour:")
    msg, path = load_error(tmp_path, text)
    assert_names(msg, path, "node_types[0] '2x-test'", "prices.0.usd_per_hr")
    assert "unknown field" in msg


def test_missing_field(tmp_path: Path) -> None:
    text = "gpus:\n" + GPU.replace("    bf16_tflops: 100\n", "")
    msg, path = load_error(tmp_path, text)
    assert_names(msg, path, "gpus[0] 'x9'", "bf16_tflops")
    assert "missing field" in msg


def test_missing_name(tmp_path: Path) -> None:
    text = "gpus:\n" + GPU + GPU.replace("  - name: x9\n    memory_gb", "  - memory_gb")
    msg, path = load_error(tmp_path, text)
    assert_names(msg, path, "gpus[1]", "name")


def test_non_string_name(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "gpus:\n" + GPU.replace("name: x9", "name: 12"))
    assert_names(msg, path, "gpus[0]", "name")


@pytest.mark.parametrize("memory", ["0", "-16", ".inf", ".nan"])
def test_bad_memory(tmp_path: Path, memory: str) -> None:
    text = "gpus:\n" + GPU.replace("memory_gb: 32", f"memory_gb: {memory}")
    msg, path = load_error(tmp_path, text)
    assert_names(msg, path, "gpus[0] 'x9'", "memory_gb")


def test_memory_of_wrong_type(tmp_path: Path) -> None:
    text = "gpus:\n" + GPU.replace("memory_gb: 32", "memory_gb: lots")
    msg, path = load_error(tmp_path, text)
    assert_names(msg, path, "gpus[0] 'x9'", "memory_gb")


@pytest.mark.parametrize("usd", [0, -2.5])
def test_non_positive_price(tmp_path: Path, usd: float) -> None:
    msg, path = load_error(tmp_path, "node_types:\n" + node(usd=usd))
    assert_names(msg, path, "node_types[0] '2x-test'", "prices.0.usd_per_hour")
    assert "greater than 0" in msg


def test_region_priced_twice(tmp_path: Path) -> None:
    price = '      - {region: aws-us-east-1, usd_per_hour: 2, source: "test fixture"}\n'
    msg, path = load_error(tmp_path, "node_types:\n" + node() + price)
    assert_names(msg, path, "node_types[0] '2x-test'", "prices")
    assert "priced twice" in msg


def test_bad_gpu_count(tmp_path: Path) -> None:
    text = "node_types:\n" + node().replace("gpu_count: 2", "gpu_count: 3")
    msg, path = load_error(tmp_path, text)
    assert_names(msg, path, "node_types[0] '2x-test'", "gpu_count")


def test_num_kv_heads_must_divide_num_heads(tmp_path: Path) -> None:
    text = "models:\n" + MODEL.replace("num_kv_heads: 2", "num_kv_heads: 3")
    msg, path = load_error(tmp_path, text)
    assert_names(msg, path, "models[0] 'tiny'", "num_kv_heads")
    assert "must divide num_heads (4)" in msg


def test_moe_more_active_experts_than_experts(tmp_path: Path) -> None:
    moe = "    moe: {num_experts: 4, experts_per_token: 8, expert_ffn_size: 32}\n"
    msg, path = load_error(tmp_path, "models:\n" + MODEL + moe)
    assert_names(msg, path, "models[0] 'tiny'", "moe")
    assert "exceeds num_experts" in msg


def test_bad_date(tmp_path: Path) -> None:
    text = "gpus:\n" + GPU + "    date: someday\n"
    msg, path = load_error(tmp_path, text)
    assert_names(msg, path, "gpus[0] 'x9'", "date")


def test_impossible_calendar_date_is_malformed_yaml(tmp_path: Path) -> None:
    # PyYAML itself raises ValueError while building the date; the loader reports the file.
    msg, path = load_error(tmp_path, "gpus:\n" + GPU + "    date: 2026-02-30\n")
    assert path in msg and "malformed YAML" in msg


def test_bad_override_of_builtin_entry_names_the_user_file(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "node_types:\n  - {name: 4x-l4, nic_gbps: -1}\n")
    assert_names(msg, path, "node_types[0] '4x-l4'", "nic_gbps")


# ---------------------------------------------------------------- references between entries


def test_node_type_with_unknown_gpu(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "gpus:\n" + GPU + "node_types:\n" + node(gpu="h100-sxn"))
    assert_names(msg, path, "node_types[0] '2x-test'", "gpu")
    assert "unknown GPU type 'h100-sxn'" in msg and "Did you mean 'h100-sxm'" in msg


def test_price_in_unknown_region(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "node_types:\n" + node(region="aws-us-east-9"))
    assert_names(msg, path, "node_types[0] '2x-test'", "prices.0.region")
    assert "unknown region 'aws-us-east-9'" in msg and "Did you mean" in msg


def test_price_in_region_of_a_cloud_without_instance(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "node_types:\n" + node(region="gcp-us-central1"))
    assert_names(msg, path, "node_types[0] '2x-test'", "prices.0.region")
    assert "on gcp" in msg


def test_reference_error_names_the_file_that_last_changed_the_entry(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("node_types:\n" + node())
    bad = tmp_path / "bad.yaml"
    bad.write_text("node_types:\n  - {name: 1x-t4}\n  - {name: 2x-test, gpu: nope}\n")
    with pytest.raises(CatalogError) as info:
        load_catalog([good, bad])
    assert_names(str(info.value), str(bad), "node_types[1] '2x-test'", "gpu")


# ---------------------------------------------------------------- file structure


def test_duplicate_names_in_one_file(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "gpus:\n" + GPU + GPU)
    assert_names(msg, path, "gpus[1] 'x9'", "name")
    assert "duplicate" in msg and "gpus[0]" in msg


def test_malformed_yaml(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "gpus:\n  - {name: x9, memory_gb: [32\n", name="broken.yaml")
    assert path in msg and "broken.yaml" in msg
    assert "malformed YAML" in msg


def test_bad_yaml_tag(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "gpus:\n" + GPU.replace("32\n", "!!int many\n", 1))
    assert path in msg and "malformed YAML" in msg


@pytest.mark.parametrize("text", ["- gpus\n- models\n", "just text\n", "42\n"])
def test_top_level_not_a_mapping(tmp_path: Path, text: str) -> None:
    msg, path = load_error(tmp_path, text)
    assert path in msg and "expected a mapping of sections" in msg


def test_unknown_section(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "gpu:\n" + GPU)
    assert path in msg
    assert "unknown section 'gpu'" in msg and "Did you mean 'gpus'" in msg


def test_unsupported_schema_version(tmp_path: Path) -> None:
    msg, path = load_error(tmp_path, "schema_version: 2\ngpus:\n" + GPU)
    assert path in msg and "schema_version 2" in msg


@pytest.mark.parametrize("body", ["{name: x9}", "x9", "7"])
def test_section_not_a_list(tmp_path: Path, body: str) -> None:
    msg, path = load_error(tmp_path, f"gpus: {body}\n")
    assert path in msg and "section 'gpus' must be a list" in msg


@pytest.mark.parametrize("item", ["x9", "[1, 2]", "3.5"])
def test_entry_not_a_mapping(tmp_path: Path, item: str) -> None:
    msg, path = load_error(tmp_path, f"models:\n  - {item}\n")
    assert path in msg and "models[0]" in msg and "expected a mapping" in msg


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(CatalogError) as info:
        load_catalog([path])
    assert str(path) in str(info.value) and "cannot read" in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogError) as info:
        load_catalog([tmp_path])
    assert str(tmp_path) in str(info.value) and "cannot read" in str(info.value)


def test_file_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("gpus:\n  - name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(CatalogError) as info:
        load_catalog([path])
    assert str(path) in str(info.value) and "UTF-8" in str(info.value)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "secret.yaml"
    path.write_text("gpus: []\n")
    path.chmod(0)
    try:
        with pytest.raises(CatalogError) as info:
            load_catalog([path])
    finally:
        path.chmod(0o644)
    assert str(path) in str(info.value) and "cannot read" in str(info.value)


# ---------------------------------------------------------------- random mutations

VALID_DOC: dict[str, Any] = {
    "schema_version": 1,
    "gpus": [
        {
            "name": "x9",
            "memory_gb": 32,
            "bf16_tflops": 100.0,
            "mem_bandwidth_gb_per_s": 1000,
            "intra_node_link": "pcie",
            "intra_node_link_gb_per_s": 32,
            "architecture": "other",
            "source": "test fixture",
            "date": dt.date(2026, 1, 1),
        }
    ],
    "node_types": [
        {
            "name": "2x-x9",
            "gpu": "x9",
            "gpu_count": 2,
            "nic_gbps": 25,
            "instances": {"aws": "x9.big"},
            "prices": [
                {"region": "aws-us-east-1", "usd_per_hour": 3.5, "source": "test fixture"},
                {"region": "aws-us-west-2", "usd_per_hour": 3.5, "source": "test fixture",
                 "approximate": True},
            ],
        }
    ],
    "models": [
        {
            "name": "tiny",
            "hf_id": "example/tiny",
            "num_layers": 2,
            "hidden_size": 64,
            "ffn_size": 128,
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 16,
            "vocab_size": 100,
            "moe": {"num_experts": 4, "experts_per_token": 2, "expert_ffn_size": 32},
            "source": "test fixture",
        }
    ],
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.dates(),
    st.sampled_from(["", "x9", "l4", "aws-us-east-1", "nvlink", "1x-l4", "aws", "-1", "0"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=3),
    ),
    max_leaves=6,
)


def _containers(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every dict and list in `obj` (the root included)."""
    found: list[tuple[Any, ...]] = []
    if isinstance(obj, dict):
        found.append(path)
        for k, v in obj.items():
            found += _containers(v, (*path, k))
    elif isinstance(obj, list):
        found.append(path)
        for i, v in enumerate(obj):
            found += _containers(v, (*path, i))
    return found


def _at(obj: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


@st.composite
def mutated_documents(draw: st.DrawFn) -> str | bytes:
    """A valid catalog document after 1-4 random mutations, as YAML (or plain junk)."""
    if draw(st.integers(0, 9)) == 0:  # sometimes not YAML of a document at all
        return draw(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
    doc = copy.deepcopy(VALID_DOC)
    for _ in range(draw(st.integers(1, 4))):
        if not isinstance(doc, (dict, list)):
            break
        path = draw(st.sampled_from(_containers(doc)))
        target = _at(doc, path)
        if isinstance(target, dict):
            keys = list(target)
            op = draw(st.sampled_from(["delete", "set", "add"] if keys else ["add"]))
            if op == "delete":
                del target[draw(st.sampled_from(keys))]
            elif op == "set":
                target[draw(st.sampled_from(keys))] = draw(values)
            else:
                key = draw(st.one_of(st.sampled_from(["extra", "name", "prices", "moe"]),
                                     st.text(max_size=8)))
                target[key] = draw(values)
        else:
            op = draw(st.sampled_from(["delete", "duplicate", "set", "append"] if target
                                      else ["append"]))
            if op == "append":
                target.append(draw(values))
            else:
                i = draw(st.integers(0, len(target) - 1))
                if op == "delete":
                    del target[i]
                elif op == "duplicate":
                    target.insert(i, copy.deepcopy(target[i]))
                else:
                    target[i] = draw(values)
        if draw(st.integers(0, 19)) == 0:
            doc = draw(values)  # the whole document replaced
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def test_valid_document_loads(fuzz_dir: Path) -> None:
    path = fuzz_dir / "valid.yaml"
    path.write_text(yaml.safe_dump(VALID_DOC))
    cat = load_catalog([path])
    assert cat.node_type("2x-x9").price_in("aws-us-west-2") == 3.5
    assert cat.model("tiny").moe is not None


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(document=mutated_documents())
def test_mutated_documents_load_or_raise_catalog_error(
    fuzz_dir: Path, document: str | bytes
) -> None:
    path = fuzz_dir / "mutated.yaml"
    if isinstance(document, bytes):
        path.write_bytes(document)
    else:
        path.write_text(document)
    try:
        cat = load_catalog([path])
    except CatalogError as exc:
        assert str(path) in str(exc)
    else:
        assert len(cat.content_hash()) == 16
