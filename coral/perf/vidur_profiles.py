"""Vidur's measured per-operator timings, in the compact form the package ships.

The source is Vidur's public compute profiles (microsoft/vidur, MIT licence, see
`data/vidur/LICENSE`): for each GPU and model, one layer's linear and element-wise operators
timed over token counts and tensor-parallel degrees. The package keeps only the median of
each operator, the shape columns, and which GPU/model a row belongs to, all in one gzipped CSV
(`data/vidur/mlp_medians.csv.gz`); `compact_raw_profiles` rebuilds it from a Vidur checkout.

Times are milliseconds for ONE layer on ONE GPU of the tensor-parallel group. There is no
attention kernel and no communication in these profiles.
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterable

import numpy as np

from coral.catalog.schema import ModelArch

COMPACT_FILE = "mlp_medians.csv.gz"

#: Vidur's GPU directory names and the catalog GPU type each one is.
VIDUR_GPUS: dict[str, str] = {"a100": "a100-80gb", "h100": "h100-sxm", "a40": "a40"}

#: Operators in the profiles, in Vidur's order. `emb` is the embedding lookup (not per layer).
OPERATORS: tuple[str, ...] = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
#: The per-layer operators (everything but the embedding).
LAYER_OPERATORS: tuple[str, ...] = OPERATORS[1:]

SHAPE_COLUMNS: tuple[str, ...] = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
)
INDEX_COLUMNS: tuple[str, ...] = ("num_tokens", "num_tensor_parallel_workers")
COMPACT_COLUMNS: tuple[str, ...] = ("gpu", "model", *SHAPE_COLUMNS, *INDEX_COLUMNS, *OPERATORS)


@dataclass(frozen=True)
class VidurProfiles:
    """All rows as column arrays (one entry per measured point)."""

    gpu: np.ndarray  # Vidur GPU name ("a100", "h100", "a40")
    model: np.ndarray  # "<org>/<model>" as in Vidur, e.g. "meta-llama/Llama-2-7b-hf"
    n_head: np.ndarray
    n_kv_head: np.ndarray
    n_embd: np.ndarray
    n_expanded_embd: np.ndarray
    vocab_size: np.ndarray
    use_gated_mlp: np.ndarray  # bool
    num_tokens: np.ndarray
    tp: np.ndarray  # num_tensor_parallel_workers
    op_ms: dict[str, np.ndarray]  # operator -> median milliseconds

    def __len__(self) -> int:
        return len(self.num_tokens)

    @property
    def layer_ms(self) -> np.ndarray:
        """Sum of the per-layer operators' medians (embedding excluded), ms."""
        return sum((self.op_ms[op] for op in LAYER_OPERATORS), np.zeros(len(self)))

    def select(self, mask: np.ndarray) -> "VidurProfiles":
        return VidurProfiles(
            gpu=self.gpu[mask],
            model=self.model[mask],
            n_head=self.n_head[mask],
            n_kv_head=self.n_kv_head[mask],
            n_embd=self.n_embd[mask],
            n_expanded_embd=self.n_expanded_embd[mask],
            vocab_size=self.vocab_size[mask],
            use_gated_mlp=self.use_gated_mlp[mask],
            num_tokens=self.num_tokens[mask],
            tp=self.tp[mask],
            op_ms={op: v[mask] for op, v in self.op_ms.items()},
        )

    def groups(self) -> list[tuple[str, str]]:
        """Distinct (gpu, model) pairs, sorted."""
        return sorted(set(zip(self.gpu.tolist(), self.model.tolist())))


def short_model_name(model: str) -> str:
    """"meta-llama/Meta-Llama-3-70B" -> "Llama-3-70B", for reports."""
    name = model.split("/")[-1]
    for junk in ("-Instruct-hf", "-hf"):
        name = name.removesuffix(junk)
    return name.removeprefix("Meta-")


def model_arch(profiles: VidurProfiles, model: str) -> ModelArch:
    """The architecture of a profiled model, from its shape columns."""
    rows = np.flatnonzero(profiles.model == model)
    if not len(rows):
        raise KeyError(f"no Vidur profile for model {model!r}")
    i = int(rows[0])
    heads, hidden = int(profiles.n_head[i]), int(profiles.n_embd[i])
    return ModelArch(
        name=model.split("/")[-1].lower(),
        hf_id=model,
        num_layers=1,
        hidden_size=hidden,
        ffn_size=int(profiles.n_expanded_embd[i]),
        num_heads=heads,
        num_kv_heads=int(profiles.n_kv_head[i]),
        head_dim=hidden // heads,
        vocab_size=int(profiles.vocab_size[i]),
        gated_mlp=bool(profiles.use_gated_mlp[i]),
        source="shape columns of Vidur's profile (microsoft/vidur)",
    )


def _parse(text: str) -> VidurProfiles:
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    if tuple(header) != COMPACT_COLUMNS:
        raise ValueError(f"unexpected columns in {COMPACT_FILE}: {header}")
    rows = list(reader)
    cols = {name: [r[j] for r in rows] for j, name in enumerate(header)}

    def ints(name: str) -> np.ndarray:
        return np.array(cols[name], dtype=np.int64)

    return VidurProfiles(
        gpu=np.array(cols["gpu"]),
        model=np.array(cols["model"]),
        n_head=ints("n_head"),
        n_kv_head=ints("n_kv_head"),
        n_embd=ints("n_embd"),
        n_expanded_embd=ints("n_expanded_embd"),
        vocab_size=ints("vocab_size"),
        use_gated_mlp=np.array([v == "True" for v in cols["use_gated_mlp"]]),
        num_tokens=ints("num_tokens"),
        tp=ints("num_tensor_parallel_workers"),
        op_ms={op: np.array(cols[op], dtype=np.float64) for op in OPERATORS},
    )


@lru_cache(maxsize=1)
def load_vidur_profiles() -> VidurProfiles:
    """The shipped profiles (read once per process)."""
    blob = (resources.files("coral.perf") / "data" / "vidur" / COMPACT_FILE).read_bytes()
    return _parse(gzip.decompress(blob).decode())


def compact_raw_profiles(raw_root: Path | str, out_file: Path | str) -> int:
    """Rebuild the compact file from Vidur's `data/profiling/compute/<gpu>/<org>/<model>/mlp.csv`.

    Keeps the median of each operator plus the shape and index columns; returns the row count.
    """
    raw_root = Path(raw_root)
    out_rows: list[list[str]] = []
    files: Iterable[Path] = sorted(raw_root.glob("*/*/*/mlp.csv"))
    for path in files:
        gpu = path.parts[-4]
        model = f"{path.parts[-3]}/{path.parts[-2]}"
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                out = [gpu, model]
                out += [row[c] for c in SHAPE_COLUMNS]
                out += [row[c] for c in INDEX_COLUMNS]
                out += [format(float(row[f"time_stats.{op}.median"]), ".6g") for op in OPERATORS]
                out_rows.append(out)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COMPACT_COLUMNS)
    writer.writerows(out_rows)
    # mtime=0 keeps the gzip bytes reproducible
    Path(out_file).write_bytes(gzip.compress(buf.getvalue().encode(), mtime=0))
    return len(out_rows)
