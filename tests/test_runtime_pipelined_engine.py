"""The engine over an executor that keeps micro-batches in flight (`depth`, `launch`,
`collect`): one micro-batch per stage, each request in one slot for its life, a slot's next
micro-batch scheduled as soon as its tokens are back (the cyclic pipeline of the step model).

The executor here is a fake pipeline of `depth` stages in which every micro-batch takes one
tick per stage and a stage works on one micro-batch at a time: its completion order, the
number in flight and the items it saw are what the engine decided, with no clock involved."""

from __future__ import annotations

import threading
from collections import deque

from coral.runtime.batching_engine import BatchingEngine
from coral.runtime.messages import PROMPT_CHUNK_STEP, TokenResult, WorkItem


class FakePipeline:
    """Micro-batches come back oldest first, one per `collect`; the token of an item is its
    position + 1, so that a request's tokens say which steps ran. `fail_at_collect`: that
    call raises as a lost worker does, dropping what is in flight."""

    def __init__(self, depth: int, fail_at_collect: int | None = None):
        self.depth = depth
        self.launched: list[list[WorkItem]] = []
        self.max_in_flight = 0
        self.shared_in_flight = False  # a request in two micro-batches in flight at once
        self.fail_at_collect = fail_at_collect
        self.collects = 0
        self._queue: deque[tuple[int, list[WorkItem]]] = deque()
        self._lock = threading.Lock()

    def launch(self, items):
        with self._lock:
            ids = {i.request_id for i in items if not i.release}
            if any(ids & {i.request_id for i in mb if not i.release} for _, mb in self._queue):
                self.shared_in_flight = True
            self.launched.append(list(items))
            self._queue.append((len(self.launched), list(items)))
            self.max_in_flight = max(self.max_in_flight, len(self._queue))
            return len(self.launched)

    def collect(self, timeout_s):
        with self._lock:
            self.collects += 1
            if self.collects == self.fail_at_collect:
                self._queue.clear()
                raise RuntimeError("micro-batch(es) [1]: worker(s) s0n0 exited")
            if not self._queue:
                return []
            batch_id, items = self._queue.popleft()
        tokens = [TokenResult(i.request_id, i.step, i.start_pos + len(i.token_ids))
                  for i in items if not i.release]
        return [(batch_id, tokens)]

    def wake(self):
        pass

    def idle(self):
        pass

    def close(self):
        pass


def _run(engine: BatchingEngine, prompts: list[tuple[int, ...]], max_tokens: int
         ) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {k: [] for k in range(len(prompts))}
    done = threading.Semaphore(0)

    def on_token(k):
        def cb(token, finished, error):
            assert error is None, error
            if token is not None:
                out[k].append(token)
            if finished:
                done.release()
        return cb

    for k, p in enumerate(prompts):  # all queued before the loop starts: no race
        engine.submit(p, max_tokens, on_token(k), stop_on_eos=False)
    engine.start()
    for _ in prompts:
        assert done.acquire(timeout=30)
    engine.stop()
    return out


def test_each_request_runs_in_one_slot_and_the_slots_overlap():
    pipe = FakePipeline(depth=3)
    engine = BatchingEngine(pipe, max_seq_len=256)
    prompts = [tuple(range(5 + k)) for k in range(6)]
    out = _run(engine, prompts, max_tokens=4)
    # every request got its 4 tokens in order: the prefill's, then one per decode step
    for k, p in enumerate(prompts):
        assert out[k] == [len(p) + j for j in range(4)]
    # one micro-batch per slot in flight: the pipeline is kept full, never over-full, and a
    # request waits for its token before its next micro-batch goes
    assert pipe.max_in_flight == 3
    assert not pipe.shared_in_flight
    # every release follows its request's last token
    for k in range(len(prompts)):
        rid_batches = [n for n, mb in enumerate(pipe.launched)
                       for i in mb if i.request_id.endswith(f"-{k}") and not i.release]
        rel = [n for n, mb in enumerate(pipe.launched)
               for i in mb if i.request_id.endswith(f"-{k}") and i.release]
        assert len(rel) == 1 and rel[0] > max(rid_batches)


def test_a_lost_worker_fails_the_requests_in_flight_and_the_engine_keeps_serving():
    pipe = FakePipeline(depth=2, fail_at_collect=3)
    engine = BatchingEngine(pipe, max_seq_len=256)
    errors: list[str] = []
    finished = threading.Semaphore(0)

    def cb(token, done, error):
        if error is not None:
            errors.append(error)
        if done:
            finished.release()

    for k in range(2):
        engine.submit(tuple(range(4)), 6, cb, stop_on_eos=False)
    engine.start()
    for _ in range(2):
        assert finished.acquire(timeout=30)
    assert errors and all("s0n0" in e for e in errors)
    # the next request runs on the (recovered) executor
    later: list[int] = []
    got = threading.Event()
    engine.submit((1, 2, 3), 2, lambda t, d, e: (t is not None and later.append(t),
                                                 d and got.set()), stop_on_eos=False)
    assert got.wait(30)
    engine.stop()
    assert later == [3, 4]


def test_a_prompt_arriving_beside_running_requests_is_spread_over_the_slots():
    """While another request decodes, a new prompt goes out in `depth` chunks, one per
    micro-batch, in order (each chunk's KV before the next), and only its last chunk is
    sampled; a prompt that finds the engine idle goes whole."""
    pipe = FakePipeline(depth=3)
    engine = BatchingEngine(pipe, max_seq_len=256)
    out: dict[int, list[int]] = {0: [], 1: []}
    done = threading.Semaphore(0)
    second = tuple(range(100, 109))  # 9 tokens: chunks of 3

    def on_token(k):
        def cb(token, finished, error):
            assert error is None, error
            if token is not None:
                out[k].append(token)
                if k == 0 and len(out[0]) == 2:  # the first decodes: the second arrives
                    engine.submit(second, 3, on_token(1), stop_on_eos=False)
            if finished:
                done.release()
        return cb

    engine.submit(tuple(range(5)), 12, on_token(0), stop_on_eos=False)
    engine.start()
    for _ in range(2):
        assert done.acquire(timeout=30)
    engine.stop()
    assert out[0] == [5 + j for j in range(12)]
    assert out[1] == [9, 10, 11]  # the first token is the last chunk's, then one a step
    first = [(n, i) for n, mb in enumerate(pipe.launched) for i in mb
             if i.request_id == "req-0" and not i.release and i.step == 0]
    assert len(first) == 1 and len(first[0][1].token_ids) == 5  # alone: whole
    chunks = [(n, i) for n, mb in enumerate(pipe.launched) for i in mb
              if i.request_id == "req-1" and not i.release and i.step <= 0]
    assert [i.start_pos for _, i in chunks] == [0, 3, 6]
    assert [i.token_ids for _, i in chunks] == [second[:3], second[3:6], second[6:]]
    assert [i.step for _, i in chunks] == [PROMPT_CHUNK_STEP, PROMPT_CHUNK_STEP, 0]
    assert [n for n, _ in chunks] == sorted({n for n, _ in chunks})  # one per micro-batch
    # its decodes start after the last chunk, each after the token before it is back
    decodes = [n for n, mb in enumerate(pipe.launched) for i in mb
               if i.request_id == "req-1" and not i.release and i.step > 0]
    assert decodes and min(decodes) > chunks[-1][0]


def test_a_request_whose_first_token_lands_in_the_fuller_slot_moves_to_the_emptier():
    """Two slots: a request decoding in slot 0, and another whose first token has just come
    back in slot 0 too (its last prompt chunk rode there). Slot 0's next micro-batch leaves
    the newcomer out, and slot 1's carries its first decode: the two decode as a pipelined
    pair, not as one micro-batch of two with a stage idle."""
    engine = BatchingEngine(FakePipeline(depth=2), max_seq_len=256)
    for k in range(2):
        engine.submit(tuple(range(4)), 8, lambda *a: None, stop_on_eos=False)
    old, new = engine._waiting
    engine._waiting.clear()
    for r, generated in ((old, [4, 5, 6]), (new, [4])):
        engine._running[r.request_id] = r
        engine._slot_of[r.request_id] = 0
        r.generated.extend(generated)
    first = engine._schedule_slot(0, 2)
    assert [i.request_id for i in first] == [old.request_id]
    second = engine._schedule_slot(1, 2)
    assert [(i.request_id, i.step) for i in second] == [(new.request_id, 1)]
    # a request further on does not move (nothing to gain from it; it would wait a slot)
    engine._slot_of[new.request_id] = 0
    new.generated.append(5)
    assert {i.request_id for i in engine._schedule_slot(0, 2)} == {old.request_id,
                                                                     new.request_id}
