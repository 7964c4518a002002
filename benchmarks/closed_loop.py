"""Closed-loop calibration: an injected slowdown of one worker, recovered from /metrics.

Two data-parallel twins of one pipeline stage run on this CPU in worker processes; the test
hook (`CORAL_INJECT_SLOWDOWN=s1n1=F`) makes one of them take F times its own step time (it
sleeps the extra and reports it). The gateway's metrics text is fed to
`coral perf calibrate --from-metrics`, and the slowed twin's fitted scale over its twin's is
the recovered factor. Requests alternate between the twins, so both run the same step shapes:
what separates their scales is F and the run-to-run spread of a worker's CPU time, which
shrinks as steps grow. Prints one JSON line per run and a summary.

    python benchmarks/closed_loop.py [--factor 1.5] [--runs 3] [--hidden 512] [--requests 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from typer.testing import CliRunner

from coral.cli.main import app
from coral.runtime.config import ModelConfig, PipelineSpec, StageSpec
from coral.runtime.batching_engine import BatchingEngine
from coral.runtime.metrics import GatewayMetrics
from coral.runtime.step_times import INJECT_SLOWDOWN_ENV
from coral.runtime.worker import ZmqPipeline

#: The catalog entry of the model the workers serve (random weights; shape from the flags).
CATALOG = """
schema_version: 1
models:
  - name: closed-loop
    hf_id: none/closed-loop
    num_layers: {layers}
    hidden_size: {hidden}
    ffn_size: {ffn}
    num_heads: {heads}
    num_kv_heads: {kv_heads}
    head_dim: 64
    vocab_size: 260
    source: "benchmarks/closed_loop.py (random weights, the shape of its flags)"
"""


def one_run(args: argparse.Namespace, folder: Path, seed: int) -> dict:
    heads = args.hidden // 64
    cfg = ModelConfig(name="closed-loop", num_layers=args.layers, hidden_size=args.hidden,
                      ffn_size=3 * args.hidden, num_heads=heads, num_kv_heads=max(1, heads // 4),
                      head_dim=64, max_seq_len=1024, seed=seed)
    half = args.layers // 2
    spec = PipelineSpec(cfg, (StageSpec(0, half), StageSpec(half, args.layers, (1.0, 1.0))))
    os.environ[INJECT_SLOWDOWN_ENV] = f"s1n1={args.factor}"
    t0 = time.perf_counter()
    pipeline = ZmqPipeline(spec)
    try:
        engine = BatchingEngine(pipeline, max_seq_len=cfg.max_seq_len)
        prompt = list(b"The quick brown fox jumps over the lazy dog. " * args.prompt_repeats)
        for _ in range(args.requests):  # requests alternate between the twins
            engine.submit(prompt, args.output_tokens, lambda t, f, e: None, stop_on_eos=False)
        while engine.has_work():
            engine.step()
        pipeline.idle()
        rows = pipeline.step_times.rows()
    finally:
        pipeline.close()
    wall = time.perf_counter() - t0
    metrics = folder / f"metrics-{seed}.txt"
    metrics.write_text(GatewayMetrics().render({}, rows))
    catalog = folder / "catalog.yaml"
    catalog.write_text(CATALOG.format(layers=args.layers, hidden=args.hidden,
                                      ffn=3 * args.hidden, heads=heads,
                                      kv_heads=max(1, heads // 4)))
    res = CliRunner().invoke(app, ["perf", "calibrate", "--from-metrics", str(metrics),
                                   "--node-type", args.node_type, "--catalog", str(catalog),
                                   "--json"])
    if res.exit_code != 0:
        raise SystemExit(res.output)
    workers = {w["node"]: w for w in json.loads(res.stdout)["workers"]}
    twin, slowed = workers["s1n0"], workers["s1n1"]
    return {"seed": seed, "wall_s": round(wall, 1), "steps": slowed["steps"],
            "twin_measured_s": round(twin["measured_s"], 3),
            "slowed_measured_s": round(slowed["measured_s"], 3),
            "recovered": slowed["scale"] / twin["scale"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-repeats", type=int, default=4, help="45-token sentence repeats")
    ap.add_argument("--output-tokens", type=int, default=96)
    ap.add_argument("--node-type", default="1x-l4",
                    help="the node type the fit is read against (the ratio does not depend on it)")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.runs):
            runs.append(one_run(args, Path(tmp), seed))
            print(json.dumps(runs[-1]), flush=True)
    rec = [r["recovered"] for r in runs]
    err = [abs(r / args.factor - 1) for r in rec]
    print(json.dumps({"factor": args.factor, "hidden": args.hidden, "layers": args.layers,
                      "requests": args.requests, "recovered": [round(r, 4) for r in rec],
                      "median_error": round(statistics.median(err), 4),
                      "max_error": round(max(err), 4)}))


if __name__ == "__main__":
    main()
