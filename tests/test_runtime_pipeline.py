"""The pipeline split is exact: split stages reproduce the whole model token for token."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from coral.runtime.config import ModelConfig, PipelineSpec, StageSpec  # noqa: E402
from coral.runtime.batching_engine import BatchingEngine  # noqa: E402
from coral.runtime.messages import SamplingParams  # noqa: E402
from coral.runtime.pipeline import LocalPipeline  # noqa: E402
from coral.runtime.stage_router import StageNodeRouter  # noqa: E402

TINY = ModelConfig(num_layers=6, max_seq_len=128, seed=7)
PROMPT = list(b"The quick brown fox")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # Tiny matmuls are slower with several threads on a busy machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def generate(spec: PipelineSpec, prompt=PROMPT, max_tokens=12, sampling=SamplingParams()):
    engine = BatchingEngine(LocalPipeline(spec), max_seq_len=spec.model.max_seq_len)
    return engine.generate(prompt, max_tokens, sampling)


@pytest.fixture(scope="module")
def reference() -> list[int]:
    return generate(PipelineSpec.even(TINY, 1))


@pytest.mark.parametrize("stages", [
    ((0, 3), (3, 6)),
    ((0, 1), (1, 4), (4, 6)),
    ((0, 5), (5, 6)),
])
def test_split_matches_unsplit_model(reference, stages):
    spec = PipelineSpec(TINY, tuple(StageSpec(a, b) for a, b in stages))
    assert generate(spec) == reference


def test_data_parallel_nodes_in_a_stage_match(reference):
    spec = PipelineSpec(TINY, (StageSpec(0, 2), StageSpec(2, 4, (1.0, 2.0)), StageSpec(4, 6)))
    engine = BatchingEngine(LocalPipeline(spec), max_seq_len=TINY.max_seq_len)
    outputs: dict[str, list[int]] = {}
    for k in range(3):  # concurrent requests spread over both middle nodes
        rid = engine.submit(PROMPT, 12, lambda t, f, e, k=k: t is not None
                            and outputs.setdefault(k, []).append(t), stop_on_eos=False)
        assert rid
    while engine.has_work():
        engine.step()
    assert all(outputs[k] == reference for k in range(3))
    middle = engine.executor.nodes[1]
    assert all(not node.caches for node in middle), "released requests keep no KV cache"


def test_continuous_batching_matches_one_at_a_time():
    spec = PipelineSpec.even(TINY, 3)
    prompts = [list(b"a"), list(b"hello there"), list(b"xyz" * 5)]
    alone = [generate(PipelineSpec.even(TINY, 1), p, 8) for p in prompts]
    engine = BatchingEngine(LocalPipeline(spec), max_seq_len=TINY.max_seq_len)
    out: dict[int, list[int]] = {i: [] for i in range(3)}
    engine.submit(prompts[0], 8, lambda t, f, e: t is not None and out[0].append(t),
                  stop_on_eos=False)
    engine.step()
    engine.step()  # request 1 joins while request 0 is decoding
    for i in (1, 2):
        engine.submit(prompts[i], 8, lambda t, f, e, i=i: t is not None and out[i].append(t),
                      stop_on_eos=False)
    while engine.has_work():
        engine.step()
    assert [out[i] for i in range(3)] == alone


def test_temperature_sampling_is_reproducible_across_splits():
    sampling = SamplingParams(temperature=0.8, seed=3)
    whole = generate(PipelineSpec.even(TINY, 1), sampling=sampling)
    assert generate(PipelineSpec.even(TINY, 3), sampling=sampling) == whole
    assert whole != generate(PipelineSpec.even(TINY, 1), sampling=SamplingParams(0.8, seed=4))


def test_stage_from_catalog_architecture():
    """A middle stage (no embeddings) of a catalog model runs one layer on its real shape."""
    import numpy as np

    from coral.catalog import default_catalog
    from coral.runtime.messages import WorkItem
    from coral.runtime.model import Stage

    catalog = default_catalog()
    arch = min(catalog.models.values(), key=lambda m: m.hidden_size * (m.ffn_size + m.hidden_size))
    cfg = ModelConfig.from_arch(arch, num_layers=3, max_seq_len=16)
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim)
    stage = Stage(cfg, 1, 2)
    assert not stage.is_first and not stage.is_last and stage.embed is None
    hidden = np.random.default_rng(0).standard_normal((2, cfg.hidden_size)).astype(np.float32)
    (out,) = stage.forward([WorkItem("r", 0, (1, 2), hidden=hidden)])
    assert out.hidden.shape == (2, cfg.hidden_size) and np.isfinite(out.hidden).all()


def test_pipeline_spec_rejects_gaps_and_wrong_cover():
    with pytest.raises(ValueError, match="contiguous"):
        PipelineSpec(TINY, (StageSpec(0, 2), StageSpec(3, 6)))
    with pytest.raises(ValueError, match="has 6 layers"):
        PipelineSpec(TINY, (StageSpec(0, 4),))
    with pytest.raises(ValueError, match="must divide"):
        ModelConfig(num_heads=4, num_kv_heads=3)


def test_engine_rejects_too_long_request():
    engine = BatchingEngine(LocalPipeline(PipelineSpec.even(TINY, 1)), max_seq_len=TINY.max_seq_len)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        engine.submit([1] * 120, 20, lambda *a: None)


def test_router_is_weighted_and_sticky():
    router = StageNodeRouter((1.0, 3.0))
    picks = [router.route(f"r{i}") for i in range(8)]
    assert picks.count(1) == 6 and picks.count(0) == 2
    assert router.route("r0") == picks[0]  # sticky until released
    router.release("r0")
    assert router.active == 7


def test_split_over_zeromq_worker_processes(reference):
    pytest.importorskip("zmq")
    from coral.runtime.worker import ZmqPipeline

    spec = PipelineSpec(TINY, (StageSpec(0, 2), StageSpec(2, 4, (1.0, 1.0)), StageSpec(4, 6)))
    pipeline = ZmqPipeline(spec)
    try:
        engine = BatchingEngine(pipeline, max_seq_len=TINY.max_seq_len)
        assert engine.generate(PROMPT, 12) == reference
        outs: dict[int, list[int]] = {0: [], 1: []}
        for k in (0, 1):  # two requests at once: one per middle node
            engine.submit(PROMPT, 12, lambda t, f, e, k=k: t is not None and outs[k].append(t),
                          stop_on_eos=False)
        while engine.has_work():
            engine.step()
        assert outs[0] == outs[1] == reference
        assert pipeline.stale_nodes() == []

        # A lost worker fails the requests it held with a clear error, not a hang.
        pipeline.processes[pipeline.node_ids.index("s2n0")].kill()
        errors: list[str] = []
        engine.submit(PROMPT, 4, lambda t, f, e: e is not None and errors.append(e))
        engine.step()
        assert errors and "s2n0" in errors[0] and "exited" in errors[0]
        assert not engine.has_work() or engine.step() == 0
    finally:
        pipeline.close()


def _template(ranges, edges=()):
    from types import SimpleNamespace

    nodes = tuple(SimpleNamespace(first_layer=a, layers=b - a, capacity=c) for a, b, c in ranges)
    return SimpleNamespace(model="tiny-random", nodes=nodes, edges=tuple(edges))


def test_template_with_data_parallel_stage_becomes_a_pipeline(reference):
    from coral.runtime.instance import pipeline_spec_from_template

    template = _template([(0, 2, 5.0), (2, 6, 2.0), (2, 6, 3.0)],
                         edges=[(-1, 0, 5.0), (0, 1, 2.0), (0, 2, 3.0), (1, -2, 2.0),
                                (2, -2, 3.0)])
    spec = pipeline_spec_from_template(template, TINY)
    assert [(s.first_layer, s.end_layer, s.node_weights) for s in spec.stages] == [
        (0, 2, (5.0,)), (2, 6, (2.0, 3.0))]
    assert generate(spec) == reference


def test_template_whose_paths_split_differently_is_refused():
    from coral.runtime.instance import TemplateNotServableError, pipeline_spec_from_template

    with pytest.raises(TemplateNotServableError, match="do not tile"):
        pipeline_spec_from_template(_template([(0, 2, 1.0), (0, 3, 1.0), (2, 6, 1.0)]), TINY)


def test_a_prompt_spread_over_the_worker_pipeline_matches_the_whole_model(reference):
    """Over worker processes the engine keeps a micro-batch per stage in flight; a prompt that
    arrives while another request decodes goes out in chunks, one per micro-batch, each
    stage finding the chunk before it in its KV cache: the tokens are the whole model's."""
    pytest.importorskip("zmq")
    import threading

    from coral.runtime.worker import ZmqPipeline

    spec = PipelineSpec(TINY, (StageSpec(0, 2), StageSpec(2, 4), StageSpec(4, 6)))
    pipeline = ZmqPipeline(spec)
    engine = BatchingEngine(pipeline, max_seq_len=TINY.max_seq_len)
    outs: dict[int, list[int]] = {0: [], 1: []}
    done = threading.Semaphore(0)

    def on_token(k):
        def cb(token, finished, error):
            assert error is None, error
            if token is not None:
                outs[k].append(token)
                if k == 0 and len(outs[0]) == 2:  # the second arrives while the first decodes
                    engine.submit(PROMPT, 12, on_token(1), stop_on_eos=False)
            if finished:
                done.release()
        return cb

    try:
        engine.submit(PROMPT, 12, on_token(0), stop_on_eos=False)
        engine.start()
        for _ in range(2):
            assert done.acquire(timeout=60)
        assert outs[0] == outs[1] == reference
        chunked = [t for t in pipeline.step_times.rows() if t.kind in ("prefill", "mixed")]
        assert sum(r.prefill_tokens for r in chunked if r.stage == 0) == 2 * len(PROMPT)
        # the first prompt in one step, the second in three (a chunk a micro-batch)
        assert sum(r.steps for r in chunked if r.stage == 0) == 1 + 3
    finally:
        engine.stop()
