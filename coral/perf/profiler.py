"""Measure real per-layer prefill and decode times of a model with torch.

The profiler builds transformer decoder layers (`coral.perf.torch_layers`, the layer the
runtime's pipeline stages serve with) from a catalog `ModelArch` with random weights (no
download, no `transformers`), times them on the chosen device and returns a `ProfileTable`.
The layer is Llama-style: RMSNorm, fused QKV projection with grouped-query attention, rotary
embeddings, causal attention through `torch.nn.functional.scaled_dot_product_attention`,
output projection, RMSNorm and a gated SiLU MLP (GELU MLP when the model's MLP is not
gated). A mixture-of-experts model gets a softmax router, top-k routed experts as one grouped
matmul (one by one where torch has no grouped matmul for the device), and its shared experts
as one always-on MLP. Its parameter count equals `ModelArch.params_per_layer`.

What is timed, per layer (K stacked layers are timed together, then divided by K):

- prefill of one sequence of P tokens (causal attention over itself, no prior context);
- decode of B sequences with c tokens of context each: one new token per sequence, written
  into a preallocated KV cache of c + 1 slots per sequence, then attention over the cache.
  The row records the batch's total context C = B * c.

Approximations: every sequence of a decode batch has the same context and the KV cache is a
dense tensor (a paged-attention kernel over ragged contexts performs somewhat differently);
without grouped matmul, routed experts run one by one (fused MoE kernels are faster, so MoE
times are then pessimistic, especially on GPUs); on CUDA, dense decode is captured in a CUDA graph (as serving engines do)
unless disabled, while prefill and MoE decode run eagerly. Times are medians over repeats.
"""

from __future__ import annotations

import datetime as dt
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from coral.catalog.schema import ModelArch
from coral.errors import InputError
from coral.perf.devices import gpu_type_for_device
from coral.perf.profile_table import ProfileRow, ProfileTable, SkippedPoint
from coral.perf.profile_timing import (
    decode_bytes,
    device_free_bytes,
    is_oom,
    prefill_bytes,
    timed,
)
from coral.perf.torch_layers import (  # noqa: F401 - the layers are part of the profiler's API
    DecoderLayer,
    build_layers,
    count_parameters,
    rope_tables,
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Fraction of the free memory a grid point may plan to use before it is skipped unmeasured.
MEMORY_HEADROOM = 0.9
#: The stacked layers' weights are at least this many times the device's last-level cache, so
#: every timed step streams them from memory, as a served stage of many layers does (on this
#: 32 MiB-L3 CPU, SmolLM2's decode of one sequence takes 0.65 ms a layer with one 14 MB layer
#: stacked, 1.29-1.33 ms with 4-20: benchmarks/results/perf-model.md, "coral profile past the
#: cache").
CACHE_MULTIPLE = 2


class ProfilerWarning(UserWarning):
    """A grid point was skipped, or a faster timing mode fell back to a slower one."""


# --------------------------------------------------------------------------------------
# grids, devices, dtypes
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileGrid:
    """Points to measure: prompt lengths; decode batch sizes x per-sequence contexts."""

    prefill_tokens: tuple[int, ...]
    decode_batch: tuple[int, ...]
    context: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("prefill_tokens", "decode_batch", "context"):
            values = tuple(getattr(self, name))
            if not values:
                raise InputError(f"grid '{name}' is empty")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise InputError(f"grid '{name}': values must be positive integers, got {v!r}")
            object.__setattr__(self, name, tuple(sorted(set(values))))

    @property
    def size(self) -> int:
        return len(self.prefill_tokens) + len(self.decode_batch) * len(self.context)

    @classmethod
    def default(cls, device: str | torch.device) -> "ProfileGrid":
        return CUDA_GRID if torch.device(device).type == "cuda" else CPU_GRID


CPU_GRID = ProfileGrid(prefill_tokens=(16, 64, 256), decode_batch=(1, 4, 16), context=(128, 512))
CUDA_GRID = ProfileGrid(
    prefill_tokens=(16, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
    decode_batch=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    context=(128, 512, 2048, 8192),
)


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """'16,64,256' -> (16, 64, 256); a clear ValueError for anything else."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InputError(f"{what}: expected a comma-separated list of positive integers, got "
                         f"{text!r}")
    values = []
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise InputError(f"{what}: {p!r} is not an integer (in {text!r})") from None
        if v < 1:
            raise InputError(f"{what}: values must be positive, got {v}")
        values.append(v)
    return tuple(values)


def resolve_device(device: str | torch.device) -> torch.device:
    """Validate a device string ('cpu', 'cuda', 'cuda:N')."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise InputError(f"unknown device {str(device)!r}; use 'cpu' or 'cuda[:N]'") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise InputError(f"unsupported device {str(device)!r}; use 'cpu' or 'cuda[:N]'")
    if not torch.cuda.is_available():
        raise InputError(
            f"--device {device}: CUDA is not available (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda or 'none'}); use --device cpu"
        )
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise InputError(
            f"--device {device}: there are only {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", index)


def resolve_dtype(name: str | None, device: torch.device, arch: ModelArch) -> torch.dtype:
    """The dtype to profile in: the model's own on CUDA (bf16; fp32 for 4-byte models);
    float32 on CPU, where bf16 matmuls are slow and unrepresentative."""
    if name is None:
        if device.type == "cpu" or arch.dtype_bytes >= 4:
            return torch.float32
        return torch.bfloat16
    if name not in DTYPES:
        raise InputError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cpu_brand() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: torch.device) -> str:
    """Human-readable name of the device, e.g. 'NVIDIA H100 80GB HBM3'."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_cpu_brand()} ({torch.get_num_threads()} threads)"


def last_level_cache_bytes(device: torch.device) -> int | None:
    """The device's last-level cache in bytes (a GPU's L2; a CPU's highest cache level, from
    Linux's sysfs), None when the platform does not say."""
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or None
    best: tuple[int, int] | None = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not text:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        try:
            size = int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
        if best is None or level > best[0]:
            best = (level, size)
    return best[1] if best is not None else None


def layers_past_cache(arch: ModelArch, elem: int, cache_bytes: int | None) -> int:
    """The fewest stacked layers whose weights are `CACHE_MULTIPLE` times `cache_bytes` (all
    of the model's layers at most; one when the cache size is unknown)."""
    if not cache_bytes:
        return 1
    per_layer = arch.params_per_layer * elem
    need = -(-CACHE_MULTIPLE * cache_bytes // per_layer)
    return max(1, min(arch.num_layers, need))


# --------------------------------------------------------------------------------------
# the profiler
# --------------------------------------------------------------------------------------


@dataclass
class _Point:
    kind: str
    prefill_tokens: int = 0
    decode_batch: int = 0
    context: int = 0  # per sequence

    @property
    def context_tokens(self) -> int:
        return self.decode_batch * self.context

    def label(self) -> str:
        if self.kind == "prefill":
            return f"prefill P={self.prefill_tokens}"
        return f"decode B={self.decode_batch} ctx={self.context}"


def profile_model(
    arch: ModelArch,
    *,
    node_type: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    layers: int | None = None,
    grid: ProfileGrid | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    cuda_graphs: bool = True,
    show_progress: bool = False,
    console: object | None = None,
    seed: int = 0,
) -> ProfileTable:
    """Time `layers` stacked decoder layers of `arch` over `grid` and return the per-layer
    table. Grid points that run out of memory are skipped with a `ProfilerWarning` and
    recorded in the table's `skipped`. Defaults: enough layers that their weights do not fit
    in the device's last-level cache (`layers_past_cache`; fewer where memory is short, with a
    warning, as when `layers` is given that small), the device's default grid, float32 on CPU
    and the model's dtype on CUDA, 5 repeats + 2 warmups on CPU, 10 + 3 on CUDA."""
    dev = resolve_device(device)
    if isinstance(dtype, str) or dtype is None:
        torch_dtype = resolve_dtype(dtype, dev, arch)
    else:
        torch_dtype = dtype
    if layers is not None and layers < 1:
        raise InputError(f"--layers must be >= 1, got {layers}")
    if layers is not None and layers > arch.num_layers:
        raise InputError(f"--layers {layers} exceeds the {arch.num_layers} layers of {arch.name}")
    grid = grid or ProfileGrid.default(dev)
    on_cuda = dev.type == "cuda"
    repeats = repeats if repeats is not None else (10 if on_cuda else 5)
    warmup = warmup if warmup is not None else (3 if on_cuda else 2)
    if repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise InputError(f"--warmup must be >= 0, got {warmup}")
    elem = torch.empty((), dtype=torch_dtype).element_size()

    free = device_free_bytes(dev)
    cache = last_level_cache_bytes(dev)
    if layers is None:
        layers = layers_past_cache(arch, elem, cache)
        if free is not None:  # as many as memory holds, if that is fewer
            layers = max(1, min(layers, int(MEMORY_HEADROOM * free / 2
                                            // (arch.params_per_layer * elem))))
    weight_bytes = layers * arch.params_per_layer * elem
    if cache and weight_bytes < CACHE_MULTIPLE * cache and layers < arch.num_layers:
        warnings.warn(
            f"{layers} layer(s) of {arch.name} hold {weight_bytes / 1e6:.1f} MB of weights, "
            f"less than {CACHE_MULTIPLE}x the device's {cache / 2**20:.0f} MiB last-level "
            f"cache: decode steps read them from the cache, so their times come out faster "
            f"than a served stage's, which streams its layers' weights from memory; profile "
            f"{layers_past_cache(arch, elem, cache)} or more layers (--layers)",
            ProfilerWarning, stacklevel=2)
    if free is not None and weight_bytes > MEMORY_HEADROOM * free:
        raise InputError(
            f"{layers} layer(s) of {arch.name} need {weight_bytes / 1e9:.1f} GB of weights in "
            f"{dtype_name(torch_dtype)}, but only {free / 1e9:.1f} GB is free on {dev}; "
            f"profile fewer layers (--layers)"
        )

    stack = build_layers(arch, layers, dev, torch_dtype, seed=seed)
    # A MoE layer without grouped matmul syncs with the host every step: not capturable.
    sync_free = all(getattr(layer.mlp, "grouped_mm", True) is not None for layer in stack)
    use_graphs = bool(cuda_graphs and on_cuda and sync_free)
    points = [_Point("prefill", prefill_tokens=p) for p in grid.prefill_tokens] + [
        _Point("decode", decode_batch=b, context=c)
        for b in grid.decode_batch for c in grid.context
    ]
    rows: list[ProfileRow] = []
    skipped: list[SkippedPoint] = []

    def skip(point: _Point, reason: str) -> None:
        skipped.append(SkippedPoint(point.kind, point.prefill_tokens,  # type: ignore[arg-type]
                                    point.decode_batch, point.context_tokens, reason))
        warnings.warn(f"skipped {point.label()}: {reason}", ProfilerWarning, stacklevel=3)

    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    progress = Progress(
        TextColumn("[bold]profiling[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console if isinstance(console, Console) else Console(stderr=True),
        transient=True, disable=not show_progress,
    )
    flush_denormal = dev.type == "cpu" and torch.set_flush_denormal(True)
    try:
        with progress, torch.inference_mode():
            task = progress.add_task(arch.name, total=len(points))
            for point in points:
                progress.update(task, description=f"{arch.name}: {point.label()}")
                try:
                    seconds, graphs_failed = _measure(
                        point, arch, stack, dev, torch_dtype, elem, layers, warmup, repeats,
                        use_graphs, free_bytes=device_free_bytes(dev),
                    )
                except _Skip as exc:
                    skip(point, str(exc))
                except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
                    if not is_oom(exc):
                        raise
                    if on_cuda:
                        torch.cuda.empty_cache()
                    skip(point, "out of memory")
                else:
                    if graphs_failed:
                        use_graphs = False
                        warnings.warn(f"CUDA graph capture failed ({graphs_failed}); steps are "
                                      "timed eagerly from here on", ProfilerWarning, stacklevel=2)
                    rows.append(ProfileRow(point.kind, point.prefill_tokens,  # type: ignore[arg-type]
                                           point.decode_batch, point.context_tokens,
                                           seconds / layers))
                progress.advance(task)
    finally:
        if flush_denormal:
            torch.set_flush_denormal(False)
    if not rows:
        raise InputError(
            f"every grid point of {arch.name} was skipped (first reason: {skipped[0].reason}); "
            f"try fewer --layers or a smaller grid"
        )
    return ProfileTable(
        model=arch.name,
        node_type=node_type,
        device_name=device_name(dev),
        dtype=dtype_name(torch_dtype),
        torch_version=torch.__version__,
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        rows=tuple(rows),
        layers_timed=layers,
        repeats=repeats,
        warmup=warmup,
        cuda_graphs=use_graphs,
        skipped=tuple(skipped),
    )


class _Skip(Exception):
    """A grid point that is not measured (the message says why)."""


def _measure(point: _Point, arch: ModelArch, stack: nn.ModuleList, dev: torch.device,
             dtype: torch.dtype, elem: int, layers: int, warmup: int, repeats: int,
             use_graphs: bool, free_bytes: float | None) -> tuple[float, str]:
    """Median seconds of the whole stack at `point`, and why graph capture failed ('' if not)."""
    hidden = arch.hidden_size
    if point.kind == "prefill":
        need = prefill_bytes(arch, point.prefill_tokens, elem)
    else:
        need = decode_bytes(arch, layers, point.decode_batch, point.context, elem)
    if free_bytes is not None and need > MEMORY_HEADROOM * free_bytes:
        raise _Skip(f"needs about {need / 1e9:.1f} GB, {free_bytes / 1e9:.1f} GB free")

    if point.kind == "prefill":
        p = point.prefill_tokens
        x = torch.randn(p, hidden, device=dev, dtype=dtype)
        cos, sin = rope_tables(torch.arange(p, device=dev), arch.head_dim, dtype)

        def run_prefill() -> torch.Tensor:
            h = x
            for layer in stack:
                h = layer.prefill(h, cos, sin)
            return h

        return timed(run_prefill, dev, warmup, repeats, use_graphs)

    b, c = point.decode_batch, point.context
    shape = (b, arch.num_kv_heads, c + 1, arch.head_dim)
    caches = [
        (torch.empty(shape, device=dev, dtype=dtype).normal_(),
         torch.empty(shape, device=dev, dtype=dtype).normal_())
        for _ in range(layers)
    ]
    x = torch.randn(b, hidden, device=dev, dtype=dtype)
    cos, sin = rope_tables(torch.tensor([c], device=dev), arch.head_dim, dtype)

    def run_decode() -> torch.Tensor:
        h = x
        for layer, (k_cache, v_cache) in zip(stack, caches):
            h = layer.decode(h, cos, sin, k_cache, v_cache, c)
        return h

    try:
        return timed(run_decode, dev, warmup, repeats, use_graphs)
    finally:
        caches.clear()  # this point's KV cache goes before the next point's is allocated
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def table_summary(table: ProfileTable) -> list[dict[str, object]]:
    """Rows as plain dicts with milliseconds, for printing."""
    out = []
    for r in table.rows:
        out.append({
            "kind": r.kind,
            "prefill_tokens": r.prefill_tokens,
            "decode_batch": r.decode_batch,
            "context_per_sequence": int(r.context_per_sequence) if r.decode_batch else 0,
            "context_tokens": r.context_tokens,
            "ms_per_layer": r.seconds_per_layer * 1e3,
        })
    return out


__all__ = [
    "CPU_GRID",
    "CUDA_GRID",
    "DTYPES",
    "DecoderLayer",
    "ProfileGrid",
    "ProfilerWarning",
    "build_layers",
    "count_parameters",
    "device_name",
    "dtype_name",
    "gpu_type_for_device",
    "parse_int_list",
    "profile_model",
    "resolve_device",
    "resolve_dtype",
    "table_summary",
]
