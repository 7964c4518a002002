"""Chaos on the tiny deployment (one instance, 3 worker processes, random weights): clients
load it while a random worker is SIGKILLed every few seconds. Every answer is correct (the
unsplit model's greedy text) or retriable, none is wrong, and the model answers again soon
after the last kill."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from coral.runtime.chaos import ChaosConfig, reference_texts, run_chaos  # noqa: E402
from coral.runtime.controller import Controller, RuntimeInstanceSpec  # noqa: E402
from coral.runtime.tiny import TinyDeployment  # noqa: E402
from coral.runtime.gateway import create_app  # noqa: E402
from coral.runtime.gateway_server import ServerThread  # noqa: E402
from coral.runtime.tokenizer import ByteTokenizer  # noqa: E402

PROMPTS = ["The quick brown fox", "Hello", "0123456789", "pipeline", "zz", "a b c d e"]
#: The stated recovery bound: after the last kill, the model answers within this (generous for
#: a loaded 2-core machine; a restart of the tiny instance takes a few seconds).
RECOVERY_S = 60.0
CONFIG = ChaosConfig(clients=4, chaos_s=20.0, kill_every_s=4.0, max_tokens=8,
                     recovery_timeout_s=RECOVERY_S, seed=1)


def test_killing_workers_under_load_gives_no_wrong_answer_and_the_model_recovers():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    deployment = TinyDeployment(random_weights=True)
    model, _ = deployment.model()
    expected = reference_texts(model, ByteTokenizer(), PROMPTS, CONFIG.max_tokens)
    try:
        with Controller("local") as controller:
            name = deployment.instance(model).name
            controller.deploy([RuntimeInstanceSpec(name, deployment.spec(model))])

            def workers() -> list[int]:
                return [pid for inst in controller.instances.values()
                        if inst.state == "active" for pid in inst.pids if pid]

            with ServerThread(create_app(controller.models)) as server:
                report = run_chaos(server.url, model.name, expected, workers, CONFIG)
                print(f"\n{report.summary()}; examples {report.examples}; "
                      f"instances {controller.status()}")
                health = httpx.get(server.url + "/health").json()
                metrics = httpx.get(server.url + "/metrics").text
    finally:
        torch.set_num_threads(before)

    assert len(report.kills) >= 2, "the chaos killed too little to test anything"
    assert report.outcomes["wrong"] == 0, report.examples
    assert report.outcomes["failed"] == 0, report.examples
    assert report.outcomes["correct"] > 0
    assert report.recovery_s is not None and report.recovery_s <= RECOVERY_S
    assert health["status"] == "ok", health
    deaths = next(line for line in metrics.splitlines()
                  if line.startswith("coral_worker_deaths_total"))
    restarts = next(line for line in metrics.splitlines()
                    if line.startswith("coral_instance_restarts_total"))
    assert float(deaths.split()[-1]) >= 1 and float(restarts.split()[-1]) >= 1
