"""Chaos: load a deployment through its gateway while killing its workers, and judge every
answer.

Clients send greedy completions (every `stream_every`-th one streamed) through the `openai`
client, which does not retry here, so that every answer the server gives is seen. Meanwhile a
random worker process of a ready instance is SIGKILLed every `kill_every_s` (jittered) for
`chaos_s` seconds. Each answer is one of:

- `correct`: the text the unsplit model produces for the prompt (greedy decoding is exact);
- `retriable`: an error that tells the client to send the request again: HTTP 429/502/503/504,
  or a stream that ends with an error event saying so;
- `wrong`: any other text, including a stream that stops without its final chunk;
- `failed`: any other error (a 4xx, a 500, a timeout, a broken connection).

A failure-tolerant deployment gives only the first two. After the last kill, requests go on
until one is answered correctly: `recovery_s` is the time from the last kill to that answer.

`run_preemptions` loads the gateway the same way while, instead of killing a worker, it has a
ready instance preempted every `kill_every_s`: a notice first, then its workers killed after
the notice (`LocalProvisioner.preempt`), as a cloud reclaims a spot node.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

#: HTTP statuses that mean "try again later", not "this request is wrong".
RETRIABLE_STATUSES = (429, 502, 503, 504)
#: Error codes of stream error events that mean the same.
RETRIABLE_CODES = ("instance_lost", "model_unavailable", "backend_unavailable")
OUTCOMES = ("correct", "retriable", "wrong", "failed")


@dataclass(frozen=True)
class ChaosConfig:
    clients: int = 4
    """Concurrent clients."""
    chaos_s: float = 20.0
    """How long workers are killed."""
    kill_every_s: float = 4.0
    """Mean time between kills (each drawn uniformly from half to one and a half times it)."""
    max_tokens: int = 8
    """Tokens per completion."""
    stream_every: int = 3
    """Every n-th request is streamed."""
    recovery_timeout_s: float = 60.0
    """Longest wait after the last kill for a correct answer."""
    request_timeout_s: float = 60.0
    """Client timeout of one request."""
    seed: int = 0
    """Seed of the kill times and victims."""


@dataclass
class ChaosReport:
    outcomes: Counter = field(default_factory=Counter)
    kills: list[tuple[float, int | str]] = field(default_factory=list)
    """(seconds since the start, victim) of every kill: a worker's pid, or the name of an
    instance preempted."""
    recovery_s: float | None = None
    """From the last kill to the first correct answer to a request sent after it."""
    duration_s: float = 0.0
    examples: dict[str, list[str]] = field(default_factory=dict)
    """A few answers per outcome other than correct, for the reader."""

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    @property
    def availability(self) -> float:
        """Share of the requests answered correctly."""
        return self.outcomes["correct"] / self.requests if self.requests else 0.0

    def summary(self) -> str:
        counts = ", ".join(f"{k} {self.outcomes[k]}" for k in OUTCOMES)
        recovery = "never" if self.recovery_s is None else f"{self.recovery_s:.1f} s"
        return (f"{self.requests} requests in {self.duration_s:.0f} s, {len(self.kills)} "
                f"workers killed: {counts}; availability {self.availability:.1%}; recovery "
                f"after the last kill {recovery}")


def reference_texts(model, tokenizer, prompts: Sequence[str], max_tokens: int
                    ) -> dict[str, str]:
    """Greedy completions of the unsplit model, as the gateway decodes them."""
    from coral.runtime.config import PipelineSpec
    from coral.runtime.batching_engine import BatchingEngine
    from coral.runtime.messages import SamplingParams
    from coral.runtime.pipeline import LocalPipeline

    engine = BatchingEngine(LocalPipeline(PipelineSpec.even(model, 1)),
                            max_seq_len=model.max_seq_len, eos_token_ids=model.eos_token_ids)
    return {p: tokenizer.decode(engine.generate(tokenizer.encode(p), max_tokens,
                                                SamplingParams(), stop_on_eos=True))
            for p in prompts}


def _ask(client, model: str, prompt: str, max_tokens: int, stream: bool) -> str | None:
    """The completion's text, or None for a stream that ended without its final chunk."""
    if not stream:
        return client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                          temperature=0).choices[0].text
    parts, finished = [], False
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                           temperature=0, stream=True):
        parts.append(chunk.choices[0].text)
        finished = finished or chunk.choices[0].finish_reason is not None
    return "".join(parts) if finished else None


def judge(client, model: str, prompt: str, expected: str, max_tokens: int, stream: bool
          ) -> tuple[str, str]:
    """(outcome, what the client got) of one request."""
    import openai

    try:
        text = _ask(client, model, prompt, max_tokens, stream)
    except openai.APIStatusError as exc:
        outcome = "retriable" if exc.status_code in RETRIABLE_STATUSES else "failed"
        return outcome, f"HTTP {exc.status_code}: {exc.message[:160]}"
    except openai.APIConnectionError as exc:  # timeouts too
        return "failed", f"{type(exc).__name__}: {exc}"
    except openai.APIError as exc:  # an error event inside a stream
        code = (exc.body or {}).get("code") if isinstance(exc.body, dict) else None
        return ("retriable" if code in RETRIABLE_CODES else "failed"), f"stream error {code}"
    if text is None:
        return "wrong", "a stream that ended without its final chunk"
    return ("correct" if text == expected else "wrong"), repr(text)


def run_chaos(url: str, model: str, expected: Mapping[str, str],
              worker_pids: Callable[[], Sequence[int]], config: ChaosConfig = ChaosConfig()
              ) -> ChaosReport:
    """Load `url`'s gateway with `expected`'s prompts while killing one of `worker_pids()`
    (workers of ready instances) every few seconds; see the module docstring."""

    def kill(rng: random.Random) -> int | None:
        pids = [p for p in worker_pids() if p]
        if not pids:
            return None
        victim = rng.choice(pids)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return victim

    return _under_load(url, model, expected, kill, config)


def run_preemptions(url: str, model: str, expected: Mapping[str, str],
                    preempt: Callable[[random.Random], str | None],
                    config: ChaosConfig = ChaosConfig()) -> ChaosReport:
    """Load `url`'s gateway with `expected`'s prompts while `preempt(rng)` preempts a ready
    instance every few seconds (e.g. `LocalProvisioner.preempt`: a notice, then the kill),
    returning its name (None: none is ready to preempt now)."""
    return _under_load(url, model, expected, preempt, config)


def _under_load(url: str, model: str, expected: Mapping[str, str],
                strike: Callable[[random.Random], int | str | None], config: ChaosConfig
                ) -> ChaosReport:
    """Clients judge every answer while `strike(rng)` hits the deployment every
    `kill_every_s` (jittered) for `chaos_s`; then requests go on until one is correct."""
    import openai

    rng = random.Random(config.seed)
    report = ChaosReport()
    prompts = list(expected)
    lock = threading.Lock()
    stop_load = threading.Event()
    numbers = itertools.count()
    recovered = threading.Event()
    last_kill: list[float] = []  # monotonic time of the last kill, once the chaos is over
    t0 = time.monotonic()

    def client_loop() -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key="chaos", max_retries=0,
                               timeout=config.request_timeout_s)
        while not stop_load.is_set():
            k = next(numbers)
            prompt = prompts[k % len(prompts)]
            sent = time.monotonic()
            outcome, got = judge(client, model, prompt, expected[prompt], config.max_tokens,
                                 stream=k % config.stream_every == 0)
            done = time.monotonic()
            with lock:
                report.outcomes[outcome] += 1
                if outcome != "correct":
                    report.examples.setdefault(outcome, [])
                    if len(report.examples[outcome]) < 5:
                        report.examples[outcome].append(got)
                if (outcome == "correct" and last_kill and sent >= last_kill[0]
                        and report.recovery_s is None):
                    report.recovery_s = done - last_kill[0]
                    recovered.set()
            if outcome != "correct":
                time.sleep(0.2)  # as a client backing off would

    clients = [threading.Thread(target=client_loop, name=f"chaos-client-{i}", daemon=True)
               for i in range(config.clients)]
    for c in clients:
        c.start()
    end = t0 + config.chaos_s
    killed_at = t0
    try:
        while True:
            wait = config.kill_every_s * rng.uniform(0.5, 1.5)
            if time.monotonic() + wait > end:
                break
            time.sleep(wait)
            victim = strike(rng)
            while victim is None and time.monotonic() < end:
                time.sleep(0.05)  # nothing ready to hit: wait for the replacement
                victim = strike(rng)
            if victim is None:
                break
            killed_at = time.monotonic()
            report.kills.append((killed_at - t0, victim))
            log.info("chaos: hit %s at %.1f s", victim, killed_at - t0)
        with lock:
            last_kill.append(killed_at)
        recovered.wait(config.recovery_timeout_s)
    finally:
        stop_load.set()
        for c in clients:
            c.join(timeout=config.request_timeout_s + 5)
    report.duration_s = time.monotonic() - t0
    return report
