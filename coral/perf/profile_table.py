"""Measured per-layer times of one model on one node type, and how to read them back.

A profile table holds what `coral profile` measured: the time of ONE transformer layer for

- prefill rows: one sequence of `prefill_tokens` tokens, causal attention over itself;
- decode rows: `decode_batch` sequences, one new token each, attending over their KV cache;
  `context_tokens` is the TOTAL context of the batch (batch x per-sequence context).

File format (CSV with a comment header; plain text, diff-friendly)::

    # coral profile table v1
    # model: llama-3.1-8b
    # node_type: 1x-h100-sxm
    # device_name: NVIDIA H100 80GB HBM3
    # dtype: bfloat16
    # torch_version: 2.5.1
    # created: 2026-09-10T12:00:00+00:00
    # layers_timed: 1
    # repeats: 10
    # warmup: 3
    # cuda_graphs: true
    # skipped: [{"kind": "decode", "prefill_tokens": 0, "decode_batch": 256, ...}]
    kind,prefill_tokens,decode_batch,context_tokens,seconds_per_layer
    prefill,16,0,0,0.000123
    decode,4,0,2048,0.000211

Only `model` and `node_type` are required in the header; extra CSV columns are ignored, so a
table may carry e.g. a human-readable `ms_per_layer` column. Malformed files raise
`ProfileTableError` naming the file, the line and the column.

Interpolation (`layer_seconds`):

- prefill: piecewise linear in the prompt length P; beyond the grid, the end segment's slope
  continues the line (above the grid the slope is floored at 0, so more work never takes less
  time); the result is floored at 0.
- decode: linear (not log) interpolation over the (B, c = C / B) grid, first along c within
  each measured batch size, then along B. Linear space is chosen because a roofline-shaped
  decode time `t = w + a*B + b*B*c` (weights read once, per-token work, KV read) is bilinear
  in (B, c), so the interpolant is exact for it and extrapolates it correctly. A batch size
  whose row has only one context point (the others skipped, e.g. out of memory) borrows the
  context slope of the nearest row with two or more, scaled by B (attention work grows with
  B*c). Extrapolation as for prefill, floored at 0.
- mixed iterations (P > 0 and B > 0): prefill part + decode part - one "empty iteration"
  intercept. Both measured parts include the per-iteration cost that a real mixed batch pays
  once (reading the layer's weights, kernel launches); the intercept estimates it as the
  prefill line extrapolated to P = 0, and is capped by the smaller of the two parts so a
  mixed iteration never takes less than either part alone. This is an approximation: it
  ignores the interference between the prefill and decode kernels that a fused batch has.

Why one module of ~520 lines: the file format's reader (`_parse`) builds the `ProfileTable`
whose `load` calls it, so the two would import each other if split; the format is documented
once, above, for both.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Literal

from coral.errors import CoralError

FORMAT_LINE = "# coral profile table v1"
COLUMNS = ("kind", "prefill_tokens", "decode_batch", "context_tokens", "seconds_per_layer")
KINDS = ("prefill", "decode")

Kind = Literal["prefill", "decode"]


class ProfileTableError(CoralError, ValueError):
    """A profile table is malformed; the message names the file, line and column."""


@dataclass(frozen=True)
class ProfileRow:
    """One measured point: seconds for ONE layer."""

    kind: Kind
    prefill_tokens: int
    decode_batch: int
    context_tokens: int
    seconds_per_layer: float

    @property
    def key(self) -> tuple[str, int, int, int]:
        return (self.kind, self.prefill_tokens, self.decode_batch, self.context_tokens)

    @property
    def context_per_sequence(self) -> float:
        """Decode rows: context of each sequence (C / B); 0 for prefill rows."""
        return self.context_tokens / self.decode_batch if self.decode_batch else 0.0


@dataclass(frozen=True)
class SkippedPoint:
    """A grid point the profiler could not measure (e.g. out of memory), and why."""

    kind: Kind
    prefill_tokens: int
    decode_batch: int
    context_tokens: int
    reason: str


def _check_row(row: ProfileRow) -> str | None:
    """Why `row` is invalid (a message naming the column), or None when it is fine."""
    if row.kind not in KINDS:
        return f"column 'kind': expected one of {list(KINDS)}, got {row.kind!r}"
    for col in ("prefill_tokens", "decode_batch", "context_tokens"):
        value = getattr(row, col)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"column '{col}': expected a non-negative integer, got {value!r}"
    sec = row.seconds_per_layer
    if not isinstance(sec, (int, float)) or not math.isfinite(sec) or sec <= 0:
        return f"column 'seconds_per_layer': expected a positive finite number, got {sec!r}"
    if row.kind == "prefill":
        if row.prefill_tokens < 1:
            return "column 'prefill_tokens': a prefill row needs prefill_tokens >= 1"
        if row.decode_batch or row.context_tokens:
            return "column 'decode_batch': a prefill row needs decode_batch = context_tokens = 0"
    else:
        if row.decode_batch < 1:
            return "column 'decode_batch': a decode row needs decode_batch >= 1"
        if row.prefill_tokens:
            return "column 'prefill_tokens': a decode row needs prefill_tokens = 0"
    return None


def _interp1(xs: list[float], ys: list[float], x: float, slope_if_single: float = 0.0) -> float:
    """Piecewise-linear interpolation; the end segments' slopes extrapolate (not clamped).

    Above the last point the slope is floored at 0. With one point, `slope_if_single` is used.
    """
    n = len(xs)
    if n == 1:
        return ys[0] + slope_if_single * (x - xs[0])
    if x <= xs[0]:
        i = 0
    elif x >= xs[-1]:
        i = n - 2
    else:
        i = bisect.bisect_right(xs, x) - 1
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    if x > xs[-1]:
        return ys[-1] + max(slope, 0.0) * (x - xs[-1])
    return ys[i] + slope * (x - xs[i])


@dataclass(frozen=True)
class _DecodeRow:
    batch: int
    contexts: list[float]  # per-sequence context, ascending
    seconds: list[float]


@dataclass(frozen=True)
class ProfileTable:
    """Measured per-layer times of `model` on `node_type` (satisfies the perf model's
    `MeasuredTable` protocol through `model`, `node_type` and `layer_seconds`)."""

    model: str
    node_type: str
    device_name: str
    dtype: str
    torch_version: str
    created: str  # ISO 8601 timestamp
    rows: tuple[ProfileRow, ...]
    layers_timed: int = 1
    repeats: int = 1
    warmup: int = 0
    cuda_graphs: bool = False
    skipped: tuple[SkippedPoint, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple(self.rows))
        object.__setattr__(self, "skipped", tuple(self.skipped))
        for name in ("model", "node_type"):
            if not getattr(self, name):
                raise ProfileTableError(f"profile table: '{name}' must be a non-empty string")
        if not self.rows:
            raise ProfileTableError(f"profile table of {self.model} on {self.node_type}: no rows")
        seen: set[tuple[str, int, int, int]] = set()
        for i, row in enumerate(self.rows):
            problem = _check_row(row)
            if problem:
                raise ProfileTableError(f"profile table row {i}: {problem}")
            if row.key in seen:
                raise ProfileTableError(f"profile table row {i}: duplicate point {row.key}")
            seen.add(row.key)

    # ---- selections ----
    @property
    def prefill_rows(self) -> tuple[ProfileRow, ...]:
        return tuple(sorted((r for r in self.rows if r.kind == "prefill"),
                            key=lambda r: r.prefill_tokens))

    @property
    def decode_rows(self) -> tuple[ProfileRow, ...]:
        return tuple(sorted((r for r in self.rows if r.kind == "decode"),
                            key=lambda r: (r.decode_batch, r.context_tokens)))

    # ---- interpolation ----
    @cached_property
    def _prefill_curve(self) -> tuple[list[float], list[float]]:
        rows = self.prefill_rows
        return [float(r.prefill_tokens) for r in rows], [r.seconds_per_layer for r in rows]

    @cached_property
    def _decode_grid(self) -> list[_DecodeRow]:
        by_batch: dict[int, list[ProfileRow]] = {}
        for r in self.decode_rows:
            by_batch.setdefault(r.decode_batch, []).append(r)
        out = []
        for batch in sorted(by_batch):
            pts = sorted(by_batch[batch], key=lambda r: r.context_per_sequence)
            out.append(_DecodeRow(batch, [r.context_per_sequence for r in pts],
                                  [r.seconds_per_layer for r in pts]))
        return out

    @cached_property
    def empty_iteration_seconds(self) -> float:
        """Estimated per-layer cost of an iteration with no tokens: the prefill line
        extrapolated to P = 0 (0 with fewer than two prefill points)."""
        xs, ys = self._prefill_curve
        if len(xs) < 2:
            return 0.0
        return max(0.0, _interp1(xs, ys, 0.0))

    def prefill_seconds(self, prefill_tokens: float) -> float:
        """Seconds for one layer to prefill one sequence of `prefill_tokens` tokens."""
        xs, ys = self._prefill_curve
        if not xs:
            raise ValueError(
                f"profile table of {self.model} on {self.node_type} has no prefill rows"
            )
        return max(0.0, _interp1(xs, ys, float(prefill_tokens)))

    def _row_slope(self, index: int) -> float:
        """Context slope for a one-point decode row: the nearest multi-point row's, scaled by B."""
        grid = self._decode_grid
        row = grid[index]
        candidates = [j for j, r in enumerate(grid) if len(r.contexts) >= 2]
        if not candidates:
            return 0.0
        j = min(candidates, key=lambda k: (abs(k - index), k))
        other = grid[j]
        slope = (other.seconds[-1] - other.seconds[-2]) / (other.contexts[-1] - other.contexts[-2])
        return max(slope, 0.0) * row.batch / other.batch

    def _row_value(self, index: int, context: float) -> float:
        row = self._decode_grid[index]
        slope = self._row_slope(index) if len(row.contexts) == 1 else 0.0
        return _interp1(row.contexts, row.seconds, context, slope_if_single=slope)

    def decode_seconds(self, decode_batch: float, context_tokens: float) -> float:
        """Seconds for one layer to decode one token for each of `decode_batch` sequences
        whose contexts total `context_tokens`."""
        grid = self._decode_grid
        if not grid:
            raise ValueError(
                f"profile table of {self.model} on {self.node_type} has no decode rows"
            )
        if decode_batch <= 0:
            raise ValueError(f"decode_batch must be positive, got {decode_batch}")
        context = context_tokens / decode_batch
        batches = [float(r.batch) for r in grid]
        if len(grid) == 1:
            return max(0.0, self._row_value(0, context))
        if decode_batch <= batches[0]:
            lo = 0
        elif decode_batch >= batches[-1]:
            lo = len(grid) - 2
        else:
            lo = bisect.bisect_right(batches, decode_batch) - 1
        pair_x = batches[lo:lo + 2]
        pair_y = [self._row_value(lo, context), self._row_value(lo + 1, context)]
        return max(0.0, _interp1(pair_x, pair_y, float(decode_batch)))

    def layer_seconds(self, prefill_tokens: int, decode_batch: int, context_tokens: int) -> float:
        """Seconds for ONE layer of an iteration with `prefill_tokens` prompt tokens and
        `decode_batch` decoding sequences of total context `context_tokens`."""
        for name, value in (("prefill_tokens", prefill_tokens), ("decode_batch", decode_batch),
                            ("context_tokens", context_tokens)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if prefill_tokens == 0 and decode_batch == 0:
            return 0.0
        if decode_batch == 0:
            return self.prefill_seconds(prefill_tokens)
        decode = self.decode_seconds(decode_batch, context_tokens)
        if prefill_tokens == 0:
            return decode
        prefill = self.prefill_seconds(prefill_tokens)
        return prefill + decode - min(self.empty_iteration_seconds, prefill, decode)

    # ---- serialisation ----
    def metadata(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "node_type": self.node_type,
            "device_name": self.device_name,
            "dtype": self.dtype,
            "torch_version": self.torch_version,
            "created": self.created,
            "layers_timed": self.layers_timed,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "cuda_graphs": self.cuda_graphs,
            "skipped": [asdict(s) for s in self.skipped],
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.metadata(), "rows": [asdict(r) for r in self.rows]}

    def to_csv(self) -> str:
        buf = io.StringIO()
        buf.write(FORMAT_LINE + "\n")
        for key, value in self.metadata().items():
            if isinstance(value, (bool, list)):
                text = json.dumps(value)
            else:
                text = " ".join(str(value).splitlines())
            buf.write(f"# {key}: {text}\n")
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(COLUMNS)
        for r in self.rows:
            writer.writerow([r.kind, r.prefill_tokens, r.decode_batch, r.context_tokens,
                             repr(float(r.seconds_per_layer))])
        return buf.getvalue()

    def save(self, path: str | Path) -> Path:
        """Write the table as CSV with its metadata in a comment header; returns the path."""
        path = Path(path)
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_csv())
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ProfileTable":
        """Read a table written by `save` (or by hand in the same format)."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProfileTableError(f"{path}: cannot read profile table: {exc.strerror}") from None
        return cls.parse(text, source=str(path))

    @classmethod
    def parse(cls, text: str, source: str = "<string>") -> "ProfileTable":
        return _parse(text, source)


_INT_META = ("layers_timed", "repeats", "warmup")


def _parse(text: str, source: str) -> ProfileTable:
    lines = text.splitlines()
    if not lines or lines[0].strip() != FORMAT_LINE:
        first = lines[0][:60] if lines else ""
        raise ProfileTableError(
            f"{source}:1: not a coral profile table (expected first line {FORMAT_LINE!r}, "
            f"got {first!r})"
        )
    meta: dict[str, tuple[int, str]] = {}
    header: list[str] | None = None
    header_line = 0
    rows: list[ProfileRow] = []
    row_lines: list[int] = []
    for lineno, line in enumerate(lines[1:], start=2):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if header is None:
                body = stripped[1:].strip()
                key, sep, value = body.partition(":")
                if sep and key.strip().replace("_", "").isalnum():
                    meta[key.strip()] = (lineno, value.strip())
            continue
        cells = next(csv.reader([line]))
        cells = [c.strip() for c in cells]
        if header is None:
            missing = [c for c in COLUMNS if c not in cells]
            if missing:
                raise ProfileTableError(
                    f"{source}:{lineno}: header is missing column(s) {missing}; "
                    f"expected {','.join(COLUMNS)}"
                )
            header, header_line = cells, lineno
            continue
        if len(cells) != len(header):
            raise ProfileTableError(
                f"{source}:{lineno}: expected {len(header)} columns, got {len(cells)}"
            )
        rec = dict(zip(header, cells))
        rows.append(_parse_row(rec, source, lineno))
        row_lines.append(lineno)
    if header is None:
        raise ProfileTableError(f"{source}: no header line ({','.join(COLUMNS)})")
    if not rows:
        raise ProfileTableError(f"{source}:{header_line}: the table has no rows")
    seen: dict[tuple[str, int, int, int], int] = {}
    for row, lineno in zip(rows, row_lines):
        if row.key in seen:
            raise ProfileTableError(
                f"{source}:{lineno}: duplicate point {row.key} (first on line {seen[row.key]})"
            )
        seen[row.key] = lineno

    def need(key: str) -> str:
        if key not in meta or not meta[key][1]:
            raise ProfileTableError(f"{source}: header is missing '# {key}: ...'")
        return meta[key][1]

    kwargs: dict[str, Any] = {
        "model": need("model"),
        "node_type": need("node_type"),
        "device_name": meta.get("device_name", (0, "unknown"))[1],
        "dtype": meta.get("dtype", (0, "unknown"))[1],
        "torch_version": meta.get("torch_version", (0, "unknown"))[1],
        "created": meta.get("created", (0, ""))[1],
    }
    for key in _INT_META:
        if key in meta:
            lineno, value = meta[key]
            try:
                kwargs[key] = int(value)
                if kwargs[key] < 0:
                    raise ValueError
            except ValueError:
                raise ProfileTableError(
                    f"{source}:{lineno}: header '{key}': expected a non-negative integer, "
                    f"got {value!r}"
                ) from None
    if "cuda_graphs" in meta:
        lineno, value = meta["cuda_graphs"]
        if value.lower() not in ("true", "false"):
            raise ProfileTableError(
                f"{source}:{lineno}: header 'cuda_graphs': expected true or false, got {value!r}"
            )
        kwargs["cuda_graphs"] = value.lower() == "true"
    if "skipped" in meta:
        lineno, value = meta["skipped"]
        kwargs["skipped"] = _parse_skipped(value, source, lineno)
    try:
        return ProfileTable(rows=tuple(rows), **kwargs)
    except ProfileTableError as exc:
        raise ProfileTableError(f"{source}: {exc}") from None


def _parse_row(rec: dict[str, str], source: str, lineno: int) -> ProfileRow:
    kind = rec["kind"]
    if kind not in KINDS:
        raise ProfileTableError(
            f"{source}:{lineno}: column 'kind': expected one of {list(KINDS)}, got {kind!r}"
        )
    ints: dict[str, int] = {}
    for col in ("prefill_tokens", "decode_batch", "context_tokens"):
        raw = rec[col]
        try:
            ints[col] = int(raw)
        except ValueError:
            raise ProfileTableError(
                f"{source}:{lineno}: column '{col}': expected a non-negative integer, "
                f"got {raw!r}"
            ) from None
    raw = rec["seconds_per_layer"]
    try:
        seconds = float(raw)
    except ValueError:
        raise ProfileTableError(
            f"{source}:{lineno}: column 'seconds_per_layer': expected a number, got {raw!r}"
        ) from None
    row = ProfileRow(kind, ints["prefill_tokens"], ints["decode_batch"],  # type: ignore[arg-type]
                     ints["context_tokens"], seconds)
    problem = _check_row(row)
    if problem:
        raise ProfileTableError(f"{source}:{lineno}: {problem}")
    return row


def _parse_skipped(value: str, source: str, lineno: int) -> tuple[SkippedPoint, ...]:
    try:
        items = json.loads(value)
        if not isinstance(items, list):
            raise TypeError("not a list")
        return tuple(
            SkippedPoint(kind=i["kind"], prefill_tokens=int(i["prefill_tokens"]),
                         decode_batch=int(i["decode_batch"]),
                         context_tokens=int(i["context_tokens"]), reason=str(i["reason"]))
            for i in items
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise ProfileTableError(
            f"{source}:{lineno}: header 'skipped': expected a JSON list of points ({exc})"
        ) from None


def load_profile_dir(directory: str | Path, *, missing_ok: bool = False) -> list[ProfileTable]:
    """Every `*.csv` profile table in `directory` (sorted by file name).

    A missing directory is an error unless `missing_ok`, when it gives an empty list.
    """
    directory = Path(directory)
    if not directory.is_dir():
        if missing_ok and not directory.exists():
            return []
        raise ProfileTableError(f"{directory}: not a directory of profile tables")
    return [ProfileTable.load(p) for p in sorted(directory.glob("*.csv"))]


def tables_by_key(tables: Iterable[ProfileTable]) -> dict[tuple[str, str], ProfileTable]:
    """Index tables by (model, node_type); two tables for the same pair is an error."""
    out: dict[tuple[str, str], ProfileTable] = {}
    for t in tables:
        key = (t.model, t.node_type)
        if key in out:
            raise ProfileTableError(
                f"two profile tables for model {t.model!r} on node type {t.node_type!r}"
            )
        out[key] = t
    return out
