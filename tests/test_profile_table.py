"""Profile tables: interpolation, extrapolation, save/load and malformed files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from coral.perf.profile_table import (
    ProfileRow,
    ProfileTable,
    ProfileTableError,
    SkippedPoint,
    load_profile_dir,
    tables_by_key,
)

PREFILL = (16, 64, 256)
BATCHES = (1, 4, 16)
CONTEXTS = (128, 512)


def prefill_time(p: float) -> float:
    return 1e-4 + 2e-6 * p


def decode_time(b: float, c: float) -> float:
    """Roofline-shaped decode time: weights + per-sequence work + KV read (bilinear in B, c)."""
    return 1e-4 + 3e-6 * b + 1e-8 * b * c


def make_table(model: str = "tiny", node: str = "cpu", **kw) -> ProfileTable:
    rows = [ProfileRow("prefill", p, 0, 0, prefill_time(p)) for p in PREFILL]
    rows += [ProfileRow("decode", 0, b, b * c, decode_time(b, c)) for b in BATCHES for c in CONTEXTS]
    fields = dict(model=model, node_type=node, device_name="test cpu", dtype="float32",
                  torch_version="2.x", created="2026-01-01T00:00:00+00:00", rows=tuple(rows),
                  layers_timed=4, repeats=3, warmup=1)
    fields.update(kw)
    return ProfileTable(**fields)


def test_exact_at_grid_points():
    t = make_table()
    for r in t.rows:
        assert t.layer_seconds(r.prefill_tokens, r.decode_batch, r.context_tokens) == \
            pytest.approx(r.seconds_per_layer, rel=1e-12)


def test_linear_between_and_bilinear_decode():
    t = make_table()
    assert t.layer_seconds(40, 0, 0) == pytest.approx(prefill_time(40))
    assert t.layer_seconds(100, 0, 0) == pytest.approx(prefill_time(100))
    # A bilinear decode surface is reproduced exactly between grid points ...
    for b, c in [(2, 200), (10, 300), (3, 511), (7, 128)]:
        assert t.layer_seconds(0, b, b * c) == pytest.approx(decode_time(b, c), rel=1e-9)
    # ... and extrapolated exactly beyond them.
    for b, c in [(64, 4096), (1, 8192), (256, 32)]:
        assert t.layer_seconds(0, b, b * c) == pytest.approx(decode_time(b, c), rel=1e-9)
    assert t.layer_seconds(4096, 0, 0) == pytest.approx(prefill_time(4096))


def test_mixed_iteration_subtracts_one_empty_iteration():
    t = make_table()
    assert t.empty_iteration_seconds == pytest.approx(prefill_time(0))
    p, d = prefill_time(64), decode_time(4, 512)
    assert t.layer_seconds(64, 4, 2048) == pytest.approx(p + d - prefill_time(0))
    assert t.layer_seconds(64, 4, 2048) >= max(p, d)
    assert t.layer_seconds(0, 0, 0) == 0.0
    with pytest.raises(ValueError, match="prefill_tokens"):
        t.layer_seconds(-1, 0, 0)


def test_extrapolation_never_negative():
    rows = (
        ProfileRow("prefill", 16, 0, 0, 1e-3),
        ProfileRow("prefill", 64, 0, 0, 1e-2),
        ProfileRow("prefill", 256, 0, 0, 3e-3),  # noisy: last segment slopes down
        ProfileRow("decode", 0, 1, 100, 5e-3),
        ProfileRow("decode", 0, 1, 200, 4e-3),
        ProfileRow("decode", 0, 2, 200, 1e-3),
    )
    t = make_table(rows=rows)
    # Below the grid the first segment would go negative: floored at 0.
    assert t.layer_seconds(1, 0, 0) == 0.0
    # Above it the downward slope is not continued.
    assert t.layer_seconds(100_000, 0, 0) == pytest.approx(3e-3)
    for b in (1, 2, 3, 50, 1000):
        for c in (0, 1, 50, 10_000, 10**6):
            value = t.layer_seconds(0, b, b * c)
            assert value >= 0.0 and math.isfinite(value)
    for p in (1, 10, 1000):
        assert t.layer_seconds(p, 3, 3000) >= 0.0


def test_one_point_row_borrows_context_slope():
    # B=16 lost its large-context point (e.g. out of memory): its slope comes from B=4, x4.
    rows = [ProfileRow("prefill", 16, 0, 0, 1e-4), ProfileRow("prefill", 64, 0, 0, 2e-4)]
    rows += [ProfileRow("decode", 0, 4, 4 * c, decode_time(4, c)) for c in CONTEXTS]
    rows += [ProfileRow("decode", 0, 16, 16 * 128, decode_time(16, 128))]
    t = make_table(rows=tuple(rows))
    assert t.layer_seconds(0, 16, 16 * 512) == pytest.approx(decode_time(16, 512), rel=1e-9)


def test_missing_kind_is_a_clear_error():
    t = make_table(rows=(ProfileRow("prefill", 16, 0, 0, 1e-4),))
    assert t.layer_seconds(32, 0, 0) == pytest.approx(1e-4)  # one point: constant
    with pytest.raises(ValueError, match="no decode rows"):
        t.layer_seconds(0, 2, 100)


def test_invalid_rows_rejected():
    with pytest.raises(ProfileTableError, match="seconds_per_layer"):
        make_table(rows=(ProfileRow("prefill", 16, 0, 0, -1.0),))
    with pytest.raises(ProfileTableError, match="decode_batch"):
        make_table(rows=(ProfileRow("decode", 0, 0, 10, 1.0),))
    with pytest.raises(ProfileTableError, match="duplicate"):
        make_table(rows=(ProfileRow("prefill", 16, 0, 0, 1.0), ProfileRow("prefill", 16, 0, 0, 2.0)))
    with pytest.raises(ProfileTableError, match="no rows"):
        make_table(rows=())


def test_save_load_round_trip(tmp_path: Path):
    skipped = (SkippedPoint("decode", 0, 16, 8192, "out of memory"),)
    t = make_table(skipped=skipped, cuda_graphs=True, device_name="NVIDIA H100 80GB HBM3")
    path = t.save(tmp_path / "sub" / "tiny__cpu.csv")
    text = path.read_text()
    assert text.startswith("# coral profile table v1\n")
    assert "kind,prefill_tokens,decode_batch,context_tokens,seconds_per_layer" in text
    back = ProfileTable.load(path)
    assert back == t
    assert back.skipped == skipped
    assert back.layer_seconds(100, 5, 1000) == t.layer_seconds(100, 5, 1000)


def _write(tmp_path: Path, body: str, name: str = "bad.csv") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


HEAD = "# coral profile table v1\n# model: tiny\n# node_type: cpu\n"
COLS = "kind,prefill_tokens,decode_batch,context_tokens,seconds_per_layer\n"


@pytest.mark.parametrize(
    "body, pattern",
    [
        ("kind,x\n", r"bad\.csv:1: not a coral profile table"),
        (HEAD + "kind,prefill_tokens\n", r"bad\.csv:4: header is missing column"),
        (HEAD + COLS + "prefill,sixteen,0,0,0.1\n", r"bad\.csv:5: column 'prefill_tokens'"),
        (HEAD + COLS + "prefill,16,0,0,fast\n", r"bad\.csv:5: column 'seconds_per_layer'"),
        (HEAD + COLS + "prefill,16,0,0,0.1\nmixed,1,1,1,0.1\n", r"bad\.csv:6: column 'kind'"),
        (HEAD + COLS + "prefill,16,0,0,0.1\nprefill,16,0,0\n", r"bad\.csv:6: expected 5 columns"),
        (HEAD + COLS + "prefill,16,0,0,0.1\nprefill,16,0,0,0.2\n", r"bad\.csv:6: duplicate"),
        (HEAD + COLS + "decode,0,4,100,0\n", r"bad\.csv:5: column 'seconds_per_layer'"),
        (HEAD + COLS, r"bad\.csv:4: the table has no rows"),
        ("# coral profile table v1\n# node_type: cpu\n" + COLS + "prefill,16,0,0,0.1\n",
         r"bad\.csv: header is missing '# model"),
        (HEAD + "# repeats: many\n" + COLS + "prefill,16,0,0,0.1\n", r"bad\.csv:4: header 'repeats'"),
        (HEAD + "# skipped: {oops\n" + COLS + "prefill,16,0,0,0.1\n", r"bad\.csv:4: header 'skipped'"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path: Path, body: str, pattern: str):
    path = _write(tmp_path, body)
    with pytest.raises(ProfileTableError, match=pattern):
        ProfileTable.load(path)


def test_hand_written_minimal_table_loads(tmp_path: Path):
    path = _write(tmp_path, HEAD + COLS.rstrip("\n") + ",ms_per_layer\n"
                  "prefill,16,0,0,0.001,1.0\n\n# a comment\ndecode,0,2,256,0.002,2.0\n")
    t = ProfileTable.load(path)
    assert t.device_name == "unknown" and len(t.rows) == 2
    assert t.layer_seconds(0, 2, 256) == pytest.approx(0.002)


def test_missing_file_is_named(tmp_path: Path):
    with pytest.raises(ProfileTableError, match="nope.csv: cannot read"):
        ProfileTable.load(tmp_path / "nope.csv")


def test_load_profile_dir(tmp_path: Path):
    make_table(model="a").save(tmp_path / "a__cpu.csv")
    make_table(model="b", node="1x-l4").save(tmp_path / "b__1x-l4.csv")
    (tmp_path / "notes.txt").write_text("not a table")
    tables = load_profile_dir(tmp_path)
    assert [(t.model, t.node_type) for t in tables] == [("a", "cpu"), ("b", "1x-l4")]
    assert set(tables_by_key(tables)) == {("a", "cpu"), ("b", "1x-l4")}
    with pytest.raises(ProfileTableError, match="two profile tables"):
        tables_by_key(tables + tables[:1])
    assert load_profile_dir(tmp_path / "missing", missing_ok=True) == []
    with pytest.raises(ProfileTableError, match="not a directory"):
        load_profile_dir(tmp_path / "missing")
    _write(tmp_path, "garbage\n", "zz.csv")
    with pytest.raises(ProfileTableError, match="zz.csv"):
        load_profile_dir(tmp_path)
