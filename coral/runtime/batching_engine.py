"""The engine: schedule -> execute -> update, with continuous batching.

Each request's prompt runs once (prefill), then one token a step (decode), so requests join and
leave between steps. Over an executor that can keep several micro-batches in flight (a worker
pipeline, `coral.runtime.worker.ZmqPipeline`: `depth`, `launch`, `collect`), the engine runs one
micro-batch per stage, each request in the same one ("slot") for its life, and schedules a
slot's next micro-batch as soon as its tokens are back: every stage always has a micro-batch to
work on, the cyclic pipeline the step model rates (`coral.perf.step`) and the way vLLM runs
pipeline parallelism (one scheduler batch per stage in flight). Over any other executor, steps
run one after the other (`step`).

A prompt that arrives while other requests run is spread over the slots: each micro-batch
launched carries the next of its `depth` chunks (chunked prefill; the chunks follow each other
through every stage, so each finds the one before in the KV caches), and the request decodes
in the slot of its last chunk, whose token is its first (or, if that slot holds two more
requests than another, in the other, so that the micro-batches stay even). That is the step
model's micro-batching (a step's prompt tokens shared by its `min(stages, sequences)`
micro-batches, the first token at the end of that step): one prompt does not hold up the slot
it rides in while the other stages idle. A prompt that finds the engine idle goes whole, to a
slot with the fewest requests (several arriving at once spread over the slots that way).
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from coral.runtime.backend_errors import BackendError, RequestFailedError
from coral.runtime.config import EOS_TOKEN_ID
from coral.runtime.messages import PROMPT_CHUNK_STEP, SamplingParams, TokenResult, WorkItem
from coral.runtime.pipeline import Executor

log = logging.getLogger(__name__)

#: on_token(token_id or None, finished, error): token None with finished=True ends the stream;
#: `error` is a message, or a `BackendError` that says whether the request may run again.
TokenCallback = Callable[[int | None, bool, "str | BaseException | None"], None]

#: How often an idle engine lets its executor check on its workers (drain heartbeats), and
#: the longest a pipelined engine waits for a result before it looks at its queue again.
IDLE_POLL_S = 0.2


class EngineStoppedError(RuntimeError):
    """The engine was stopped; it takes no new requests."""


@dataclass
class _Request:
    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    on_token: TokenCallback
    stop_on_eos: bool
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False


class BatchingEngine:
    """Owns the request queue and drives an executor; `submit` is thread-safe."""

    def __init__(self, executor: Executor, *, max_seq_len: int, max_running: int = 32,
                 eos_token_ids: tuple[int, ...] = (EOS_TOKEN_ID,)):
        """`eos_token_ids`: tokens that end a request submitted with `stop_on_eos`."""
        self.executor = executor
        self.max_seq_len = max_seq_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_running = max_running
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._waiting: list[_Request] = []
        self._running: dict[str, _Request] = {}
        self._releases: list[WorkItem] = []
        # pipelined: each running request's slot, and releases to send with a slot's next
        # micro-batch (after the request's last one, on every node of its route)
        self._slot_of: dict[str, int] = {}
        self._slot_releases: dict[int, list[WorkItem]] = {}
        # pipelined: running requests whose prompt is still going out, in arrival order:
        # request id -> [prompt tokens launched, chunk size]
        self._prefill: dict[str, list[int]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ---- API ----
    def submit(self, prompt_ids: list[int] | tuple[int, ...], max_tokens: int,
               on_token: TokenCallback, sampling: SamplingParams = SamplingParams(),
               stop_on_eos: bool = True) -> str:
        if not prompt_ids:
            raise ValueError("prompt is empty")
        if len(prompt_ids) + max_tokens > self.max_seq_len:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) "
                             f"exceeds the model's context ({self.max_seq_len} tokens)")
        request = _Request(f"req-{next(self._ids)}", tuple(prompt_ids), max_tokens, sampling,
                           on_token, stop_on_eos)
        with self._lock:
            if self._stopping:
                raise EngineStoppedError("the engine was stopped")
            self._waiting.append(request)
            self._lock.notify()
        wake = getattr(self.executor, "wake", None)
        if wake is not None and self._thread is not None:
            wake()  # a pipelined loop waiting for results schedules the prompt now
        return request.request_id

    def cancel(self, request_id: str) -> None:
        with self._lock:
            for r in [*self._waiting, *self._running.values()]:
                if r.request_id == request_id:
                    r.cancelled = True

    def generate(self, prompt_ids: list[int], max_tokens: int,
                 sampling: SamplingParams = SamplingParams(), stop_on_eos: bool = False
                 ) -> list[int]:
        """Blocking helper: run steps in this thread until the request finishes."""
        out: list[int] = []
        self.submit(prompt_ids, max_tokens, lambda t, _f, _e: t is not None and out.append(t),
                    sampling, stop_on_eos)
        while self.has_work():
            self.step()
        return out

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._waiting or self._running or self._releases
                        or any(self._slot_releases.values()))

    # ---- step: schedule -> execute -> update ----
    def step(self) -> int:
        """One engine step; returns how many tokens it produced."""
        items = self._schedule()
        if not items:
            return 0
        try:
            results = self.executor.execute(items)
        except Exception as exc:  # a worker failure fails the step's requests, not the engine
            log.exception("engine step failed")
            self._fail([i.request_id for i in items if not i.release], str(exc))
            return 0
        self._update(results)
        return len(results)

    def _schedule(self) -> list[WorkItem]:
        with self._lock:
            items, self._releases = self._releases, []
            items += self._decode_items(list(self._running.values()))
            items += [WorkItem(r.request_id, 0, r.prompt_ids, r.sampling, step=0)
                      for r in self._admit()]
            items.extend(self._releases)  # releases of cancelled requests, after their peers
            self._releases = []
            return items

    def _admit(self) -> list[_Request]:
        """Waiting requests taken into the running set, first come first served, while it
        has room (under the lock); a cancelled one is finished instead."""
        admitted = []
        while self._waiting and len(self._running) < self.max_running:
            r = self._waiting.pop(0)
            if r.cancelled:
                r.on_token(None, True, None)
                continue
            self._running[r.request_id] = r
            admitted.append(r)
        return admitted

    def _decode_items(self, requests: list[_Request]) -> list[WorkItem]:
        """One decode token of each request (under the lock); cancelled ones are finished."""
        items = []
        for r in requests:
            if r.cancelled:
                self._finish(r, None)
                continue
            pos = len(r.prompt_ids) + len(r.generated) - 1
            items.append(WorkItem(r.request_id, pos, (r.generated[-1],), r.sampling,
                                  step=len(r.generated)))
        return items

    def _update(self, results: list[TokenResult]) -> None:
        with self._lock:
            for res in results:
                r = self._running.get(res.request_id)
                if r is None:
                    continue
                if res.error is not None:  # its step failed: the request ends, not the engine
                    self._finish(r, BackendError(res.error) if res.retry
                                 else RequestFailedError(res.error))
                    continue
                if res.step != len(r.generated):
                    continue
                r.generated.append(res.token_id)
                done = (len(r.generated) >= r.max_tokens or
                        (r.stop_on_eos and res.token_id in self.eos_token_ids) or r.cancelled)
                r.on_token(res.token_id, done, None)
                if done:
                    self._finish(r, None, notify=False)

    def _finish(self, r: _Request, error: str | BaseException | None,
                notify: bool = True) -> None:
        self._running.pop(r.request_id, None)
        self._prefill.pop(r.request_id, None)
        release = WorkItem(r.request_id, 0, (), release=True)
        slot = self._slot_of.pop(r.request_id, None)
        if slot is None:
            self._releases.append(release)
        else:
            self._slot_releases.setdefault(slot, []).append(release)
        if notify:
            r.on_token(None, True, error)

    def _fail(self, request_ids: list[str], error: str) -> None:
        with self._lock:
            for rid in request_ids:
                r = self._running.get(rid)
                if r is not None:
                    self._finish(r, error)

    # ---- pipelined: one micro-batch per slot in flight ----
    def _schedule_slot(self, slot: int, slots: int) -> list[WorkItem]:
        """The next micro-batch of `slot` (whose previous one is back): a token of each of
        its decoding requests, the next chunk of each prompt going out (a whole prompt only
        where the slot has no more requests than any other), and its releases. Waiting
        requests are admitted first: a prompt goes out in `slots` chunks when others run
        beside it, else whole. A request whose first token came back in a slot with more
        requests than another (by two or more) decodes in that other slot from then on."""
        items = self._releases  # releases from steps run before the loop started
        self._releases = []
        counts = [0] * slots
        for s in self._slot_of.values():
            counts[s] += 1
        for r in list(self._running.values()):
            # a request whose first token just came back here moves to a slot with fewer
            # requests (its next token is its first decode: nothing of it is in flight)
            if (self._slot_of.get(r.request_id) == slot and len(r.generated) == 1
                    and counts[slot] > min(counts) + 1):
                to = counts.index(min(counts))
                self._slot_of[r.request_id] = to
                counts[slot] -= 1
                counts[to] += 1
        items += self._decode_items(
            [r for r in self._running.values() if self._slot_of.get(r.request_id) == slot])
        spread = bool(self._running)
        for r in self._admit():
            n = len(r.prompt_ids)
            self._prefill[r.request_id] = [0, -(-n // slots) if spread else n]
        for rid, state in list(self._prefill.items()):
            r = self._running[rid]
            if r.cancelled:
                self._finish(r, None)
                continue
            done, size = state
            end = min(len(r.prompt_ids), done + size)
            last = end == len(r.prompt_ids)
            if last and not done and counts[slot] > min(counts):
                continue  # a whole prompt goes to a slot with the fewest requests
            items.append(WorkItem(rid, done, r.prompt_ids[done:end], r.sampling,
                                  step=0 if last else PROMPT_CHUNK_STEP))
            if last:
                del self._prefill[rid]
                self._slot_of[rid] = slot
                counts[slot] += 1
            else:
                state[0] = end
        items.extend(self._releases)  # releases of requests cancelled while prefilling
        self._releases = []
        items.extend(self._slot_releases.pop(slot, []))
        return items

    def _loop_pipelined(self) -> None:
        ex = self.executor
        slots = max(1, int(ex.depth))
        free = set(range(slots))
        in_flight: dict[int, tuple[int, list[str]]] = {}  # micro-batch -> (slot, requests)
        while True:
            launches = []
            with self._lock:
                if self._stopping:
                    return
                pending = sorted(free)
                while pending:  # again while a pass launches: a request may have moved
                    launched = []  # to a free slot scheduled before its own in the pass
                    for slot in pending:
                        items = self._schedule_slot(slot, slots)
                        if items:
                            launches.append((slot, items))
                            launched.append(slot)
                    pending = [s for s in pending if s not in launched] if launched else []
                if not launches and not in_flight:
                    self._lock.wait(timeout=IDLE_POLL_S)
                    if self._stopping:
                        return
            if not launches and not in_flight:
                if not self.has_work():
                    try:
                        ex.idle()  # e.g. read heartbeats, so silent workers are noticed
                    except Exception:
                        log.exception("executor idle check failed")
                continue
            try:
                for slot, items in launches:
                    batch_id = ex.launch(items)
                    in_flight[batch_id] = (slot, [i.request_id for i in items if not i.release])
                    free.discard(slot)
                done = ex.collect(IDLE_POLL_S)
            except Exception as exc:  # a worker failure fails the requests in flight
                log.exception("pipelined step failed")
                lost = [rid for _, rids in in_flight.values() for rid in rids]
                lost += [i.request_id for slot, items in launches if slot in free
                         for i in items if not i.release]
                with self._lock:  # a prompt partly sent lost its chunks' KV caches
                    lost += [rid for rid, (done, _) in self._prefill.items() if done]
                in_flight.clear()
                free = set(range(slots))
                self._fail(lost, str(exc))
                continue
            for batch_id, results in done:
                entry = in_flight.pop(batch_id, None)
                if entry is not None:
                    free.add(entry[0])
                self._update(results)

    # ---- background loop ----
    def start(self) -> None:
        pipelined = all(hasattr(self.executor, a) for a in ("depth", "launch", "collect"))
        loop = self._loop_pipelined if pipelined else self._loop
        self._thread = threading.Thread(target=loop, name="coral-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        idle = getattr(self.executor, "idle", None)
        while True:
            with self._lock:
                if not (self._stopping or self._waiting or self._running or self._releases):
                    self._lock.wait(timeout=IDLE_POLL_S)
                if self._stopping:
                    return
                busy = bool(self._waiting or self._running or self._releases)
            if not busy:
                if idle is not None:
                    try:
                        idle()  # e.g. read heartbeats, so silent workers are noticed
                    except Exception:
                        log.exception("executor idle check failed")
                continue
            try:
                self.step()
            except Exception:  # keep serving; the step's requests were failed or will retry
                log.exception("engine loop error")

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        abort = getattr(self.executor, "abort", None)
        if abort is not None:  # a step waiting on lost workers ends now, not at its timeout
            abort()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:  # requests still here will never run: end them with an error
            leftovers = [*self._waiting, *self._running.values()]
            self._waiting, self._running = [], {}
        for r in leftovers:
            r.on_token(None, True, "the engine was stopped before the request finished")
        self.executor.close()
