"""How the profiler times a layer stack on a device: medians over repeats after warm-ups,
replayed as a CUDA graph where asked, and how much memory a grid point needs and the device
has free (so that a point that cannot fit is skipped rather than run out of memory)."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch

from coral.catalog.schema import ModelArch


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
        or "failed to allocate" in text
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int,
                    repeats: int) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    if device.type == "cuda":
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        # One torch thread on a CPU: that thread's CPU time, as the runtime's workers time
        # their steps (`coral.runtime.worker`): time spent waiting for a core another process
        # holds is the host's load, not the layer's cost. Several threads: wall clock.
        clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
        for _ in range(repeats):
            t0 = clock()
            fn()
            times.append(clock() - t0)
    return statistics.median(times)


def capture_cuda_graph(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """Capture `fn` into a CUDA graph (after warming it up on a side stream)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    sync(device)
    return graph.replay


def device_free_bytes(device: torch.device) -> float | None:
    """Memory the profiler may still use on `device` (None when unknown)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        # Blocks torch's caching allocator holds but does not use are free to us too.
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return float(free + max(cached, 0))
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def prefill_bytes(arch: ModelArch, tokens: int, elem: int) -> float:
    """Rough peak activation memory of one layer's prefill (attention by a fused kernel)."""
    ffn = arch.ffn_size if arch.moe is None else max(
        arch.moe.expert_ffn_size * arch.moe.experts_per_token,
        arch.moe.shared_experts * arch.moe.shared_expert_ffn_size,
    )
    per_token = 4 * arch.hidden_size + 2 * (arch.q_dim + 2 * arch.kv_dim) + 3 * ffn
    return float(tokens * per_token * max(elem, 4))


def decode_bytes(arch: ModelArch, layers: int, batch: int, context: int, elem: int) -> float:
    kv = layers * 2 * batch * (context + 1) * arch.kv_dim * elem
    return float(kv) + prefill_bytes(arch, batch, elem)


def timed(run: Callable[[], object], dev: torch.device, warmup: int, repeats: int,
           use_graphs: bool) -> tuple[float, str]:
    """Median seconds of `run`, replayed as a CUDA graph when asked (serving engines launch a
    step's kernels from a graph, so eager launch gaps would overstate small steps), and why
    capture failed ('' if it did not)."""
    fn: Callable[[], object] = run
    failed = ""
    if use_graphs:
        try:
            fn = capture_cuda_graph(run, dev)
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager
            if is_oom(exc):
                raise
            failed = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            fn = run
    try:
        return median_seconds(fn, dev, warmup, repeats), failed
    finally:
        del fn
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # release the graph's pool and this point's buffers
