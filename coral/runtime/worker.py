"""Pipeline workers over ZeroMQ: one process per node, and the executor that drives them.

Addresses (`PipelineAddresses`): every worker binds a PULL socket; it PUSHes activations to
the nodes of the next stage (one PUSH socket each, the node chosen by weight and kept per
request, since that node holds the request's KV cache), and the last stage PUSHes sampled
tokens to the driver's PULL socket. Every worker also sends a heartbeat to the driver each
`heartbeat_s`, from a thread of its own, so that a long step does not read as a dead worker.

Messages are pickled dataclasses (`coral.runtime.messages`): bind to loopback or a trusted
private network only.

Lifetime: a worker belongs to the process that started it. It ignores SIGINT (a terminal's
Ctrl-C reaches the whole process group; the parent decides how to stop, by `Shutdown`), and a
watchdog thread ends it once its parent is gone (the parent's pid is no longer its parent's,
e.g. after `kill -9` of `coral serve`), so that no worker outlives the server that owns it.
`prctl(PR_SET_PDEATHSIG)` is not used: it fires when the *thread* that started the worker ends,
and instances are started from short-lived threads.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from coral.runtime.config import PipelineSpec
from coral.runtime.messages import (
    Batch,
    Heartbeat,
    Results,
    Shutdown,
    StageTiming,
    StepFailed,
    TokenResult,
    Wake,
    WorkItem,
)
from coral.runtime.step_times import StepTimes, injected_slowdown

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
#: A node silent for this long is reported lost.
HEARTBEAT_TIMEOUT_S = 5.0
#: Longest wait for one micro-batch's tokens before it fails.
STEP_TIMEOUT_S = 60.0
#: How long closing waits for workers to exit after Shutdown (and again after SIGTERM).
SHUTDOWN_GRACE_S = 3.0
#: How often a worker checks that the process that started it is still there.
PARENT_WATCH_S = 0.5


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port free right now (another process could take it before we bind; fine on loopback)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class NodeAddress:
    node_id: str  # "s{stage}n{index}"
    stage: int
    index: int  # among the stage's data-parallel nodes
    address: str  # where the node's PULL socket binds, e.g. tcp://127.0.0.1:5555


@dataclass(frozen=True)
class PipelineAddresses:
    """Where a worker pipeline's sockets bind: each node's, and the driver's."""

    spec: PipelineSpec
    nodes: tuple[tuple[NodeAddress, ...], ...]  # per stage
    driver_address: str  # the driver's PULL socket (tokens, step times)
    heartbeat_address: str = ""  # the driver's heartbeat PULL socket ("": driver_address)

    @classmethod
    def on_loopback(cls, spec: PipelineSpec, host: str = "127.0.0.1") -> "PipelineAddresses":
        nodes = tuple(
            tuple(NodeAddress(f"s{s}n{i}", s, i, f"tcp://{host}:{free_tcp_port(host)}")
                  for i in range(len(stage.node_weights)))
            for s, stage in enumerate(spec.stages))
        return cls(spec, nodes, f"tcp://{host}:{free_tcp_port(host)}",
                   f"tcp://{host}:{free_tcp_port(host)}")


def exit_with_parent(parent_pid: int, period_s: float = PARENT_WATCH_S) -> threading.Thread:
    """End this process soon after `parent_pid` stops being its parent (the parent died and the
    process was re-parented). A thread, so that it also fires while the worker loads weights or
    runs a long step."""
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)  # nothing to flush: the worker's state dies with its parent
            time.sleep(period_s)

    thread = threading.Thread(target=watch, name="coral-parent-watchdog", daemon=True)
    thread.start()
    return thread


def run_worker(addresses: PipelineAddresses, stage_index: int, node_index: int,
               heartbeat_s: float = HEARTBEAT_S, torch_threads: int = 1,
               device: str = "cpu", parent_pid: int | None = None) -> None:
    """Process entry point of one node: receive batches, run the stage, pass results on.

    `parent_pid`: the process that owns this worker; the worker exits once it is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    import torch
    import zmq

    from coral.runtime.model import Stage
    from coral.runtime.pipeline import group_by_node
    from coral.runtime.stage_router import StageNodeRouter

    torch.set_num_threads(torch_threads)
    me = addresses.nodes[stage_index][node_index]
    spec = addresses.spec.stages[stage_index]
    stage = Stage(addresses.spec.model, spec.first_layer, spec.end_layer, device)
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(me.address)
    driver = ctx.socket(zmq.PUSH)
    driver.connect(addresses.driver_address)
    downstream = []
    router = None
    if not stage.is_last:
        nxt = addresses.spec.stages[stage_index + 1]
        router = StageNodeRouter(nxt.node_weights)
        for node in addresses.nodes[stage_index + 1]:
            sock = ctx.socket(zmq.PUSH)
            sock.connect(node.address)
            downstream.append(sock)
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    slowdown = injected_slowdown(me.node_id)
    # A CPU worker's step time is its thread's CPU time (torch runs on this thread): time spent
    # waiting for a core another process holds is the host's load, not the node's speed. An
    # accelerator's is wall time (its results come back to the host within the step).
    clock = time.thread_time if str(device).startswith("cpu") else time.perf_counter
    stop = threading.Event()
    beats = threading.Thread(target=_send_heartbeats, name="coral-heartbeat", daemon=True,
                             args=(ctx, addresses.heartbeat_address or addresses.driver_address,
                                   me.node_id, stage_index,
                                   stage, heartbeat_s, stop))
    beats.start()
    try:
        while True:
            if not poller.poll(timeout=int(heartbeat_s * 1000)):
                continue
            msg = inbox.recv_pyobj()
            if isinstance(msg, Shutdown):
                return
            assert isinstance(msg, Batch), f"unexpected message {type(msg).__name__}"
            t0 = clock()
            try:
                out = stage.forward(msg.items)
            except Exception as exc:  # noqa: BLE001 - the micro-batch fails, not the worker
                log.exception("node %s: micro-batch %d failed", me.node_id, msg.batch_id)
                driver.send_pyobj(_step_failed(stage, me.node_id, msg, exc))
                continue
            seconds = clock() - t0
            if slowdown != 1.0:  # test hook: a known slowdown to recover from the metrics
                time.sleep((slowdown - 1.0) * seconds)
                seconds *= slowdown
            if stage.is_last:
                driver.send_pyobj(Results(tuple(out), msg.batch_id, me.node_id))
            else:
                for node, group in group_by_node(out, router).items():
                    downstream[node].send_pyobj(Batch(tuple(group), msg.batch_id))
            driver.send_pyobj(_timing(me.node_id, stage_index, msg.items, seconds))
    finally:
        stop.set()
        beats.join(timeout=2 * heartbeat_s)
        ctx.destroy(linger=0)


def _step_failed(stage: object, node_id: str, batch: Batch, exc: Exception) -> StepFailed:
    """The failure of a micro-batch's step on this node. Its requests' KV caches here may be
    half-written, so they are dropped; their releases come later, as for any failed request."""
    failed = tuple((i.request_id, i.step) for i in batch.items if not i.release)
    for request_id, _ in failed:
        stage.release(request_id)  # type: ignore[attr-defined]
    return StepFailed(batch.batch_id, node_id, f"{type(exc).__name__}: {exc}", failed)


def _send_heartbeats(ctx: object, driver_address: str, node_id: str, stage_index: int,
                     stage: object, heartbeat_s: float, stop: threading.Event) -> None:
    """A worker's heartbeats, from their own thread and socket (a ZeroMQ socket belongs to
    one thread): a step longer than the driver's heartbeat timeout (a long prompt on a slow
    node) must not read as a dead worker. The process dying or stopping still silences them;
    a step that never ends is the driver's step timeout's to catch."""
    import zmq

    sock = ctx.socket(zmq.PUSH)  # type: ignore[attr-defined]
    sock.connect(driver_address)
    try:
        while True:
            sock.send_pyobj(Heartbeat(node_id, stage_index, time.time(),
                                      len(stage.caches)))  # type: ignore[attr-defined]
            if stop.wait(heartbeat_s):
                return
    finally:
        sock.close(linger=0)


def _timing(node_id: str, stage: int, items: Sequence[WorkItem], seconds: float) -> StageTiming:
    """A step's time with its shape: prompt chunks' tokens, decode sequences, their context."""
    prefill = decode = context = 0
    for item in items:
        if item.release:
            continue
        if item.step <= 0:  # a prompt, or a chunk of one
            prefill += len(item.token_ids)
        else:
            decode += 1
            context += item.start_pos + len(item.token_ids)
    return StageTiming(node_id, stage, prefill, decode, context, seconds)


@dataclass
class _Pending:
    """A micro-batch in flight: how many tokens it owes, those back so far, its deadline."""

    expected: int
    deadline: float
    tokens: list[TokenResult] = field(default_factory=list)


class WorkerLostError(RuntimeError):
    pass


class ZmqPipeline:
    """Executor over worker processes: micro-batches go to the first stage (`launch`) and
    their tokens come back from the last (`collect`); `execute` runs one whole step."""

    def __init__(self, spec: PipelineSpec, *, addresses: PipelineAddresses | None = None,
                 start_timeout_s: float = 60.0, device: str = "cpu"):
        """`device`: torch device of every worker ("cuda:0" puts all stages on one GPU)."""
        import zmq

        from coral.runtime.stage_router import StageNodeRouter

        self.addresses = addresses or PipelineAddresses.on_loopback(spec)
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._inbox = self._ctx.socket(zmq.PULL)
        try:
            self._inbox.bind(self.addresses.driver_address)
        except zmq.ZMQError:
            self._ctx.destroy(linger=0)
            raise
        self.last_seen_s: dict[str, float] = {}
        self._beats_stop = threading.Event()
        self._beats: threading.Thread | None = None
        if self.addresses.heartbeat_address:
            # heartbeats are read by a thread of their own: a driver thread busy elsewhere
            # (a long step, a loaded event loop) does not make its workers look silent
            beats = self._ctx.socket(zmq.PULL)
            try:
                beats.bind(self.addresses.heartbeat_address)
            except zmq.ZMQError:
                self._ctx.destroy(linger=0)
                raise
            self._beats = threading.Thread(target=self._read_heartbeats, args=(beats,),
                                           name="coral-heartbeats", daemon=True)
            self._beats.start()
        self._first = []
        for node in self.addresses.nodes[0]:
            sock = self._ctx.socket(zmq.PUSH)
            sock.connect(node.address)
            self._first.append(sock)
        self._router = StageNodeRouter(spec.stages[0].node_weights)
        self.step_times = StepTimes(spec.model.name, [(st.first_layer, st.end_layer)
                                                      for st in spec.stages],
                                    [st.node_type for st in spec.stages])
        self._batch_ids = 0
        self._pending: dict[int, _Pending] = {}
        self._wake_lock = threading.Lock()
        self._wake_socket = None
        # set by abort() from another thread: a step in progress gives up at its next poll
        self._aborted = threading.Event()
        mp_ctx = mp.get_context("spawn")
        self.processes = [
            mp_ctx.Process(target=run_worker, args=(self.addresses, n.stage, n.index),
                           kwargs={"device": device, "parent_pid": os.getpid()},
                           name=f"coral-worker-{n.node_id}", daemon=True)
            for stage in self.addresses.nodes for n in stage]
        for p in self.processes:
            p.start()
        self._wait_for_heartbeats(start_timeout_s)

    @property
    def node_ids(self) -> list[str]:
        return [n.node_id for stage in self.addresses.nodes for n in stage]

    def _read_heartbeats(self, sock: object) -> None:
        """Record every worker's heartbeats until the pipeline closes (this thread owns
        `sock`)."""
        try:
            while not self._beats_stop.is_set():
                if not sock.poll(timeout=int(HEARTBEAT_S * 1000)):  # type: ignore[attr-defined]
                    continue
                msg = sock.recv_pyobj()  # type: ignore[attr-defined]
                if isinstance(msg, Heartbeat):
                    self.last_seen_s[msg.node_id] = time.time()
        except self._zmq.ZMQError:  # the context is being destroyed
            pass
        finally:
            sock.close(linger=0)  # type: ignore[attr-defined]

    def _receive(self, timeout_s: float):
        if not self._inbox.poll(timeout=int(timeout_s * 1000)):
            return None
        msg = self._inbox.recv_pyobj()
        if isinstance(msg, Heartbeat):
            self.last_seen_s[msg.node_id] = time.time()
        elif isinstance(msg, StageTiming):
            self.step_times.record(msg.node_id, msg.stage, msg.prefill_tokens, msg.decode_batch,
                                   msg.context_tokens, msg.seconds)
        return msg

    def _wait_for_heartbeats(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while set(self.last_seen_s) != set(self.node_ids):
            exited = self.dead_nodes()
            if exited:
                self.close()
                raise WorkerLostError(f"workers {exited} exited while starting")
            if time.time() > deadline:
                missing = sorted(set(self.node_ids) - set(self.last_seen_s))
                self.close()
                raise WorkerLostError(f"workers {missing} did not start within {timeout_s} s")
            self._receive(0.1)

    def stale_nodes(self, timeout_s: float = HEARTBEAT_TIMEOUT_S) -> list[str]:
        now = time.time()
        return [n for n in self.node_ids if now - self.last_seen_s.get(n, 0.0) > timeout_s]

    def crashed_nodes(self) -> list[str]:
        """Nodes whose process ended on its own (an error exit or a fatal signal such as
        SIGSEGV), not killed from outside (SIGKILL: an operator, a reclaimed node, the
        kernel's out-of-memory killer): only those may be blamed on what they ran."""
        return [nid for nid, p in zip(self.node_ids, self.processes)
                if p.exitcode not in (None, 0, -signal.SIGKILL)]

    def dead_nodes(self) -> list[str]:
        """Nodes whose process has exited (found at once, without waiting for heartbeats)."""
        return [nid for nid, p in zip(self.node_ids, self.processes) if not p.is_alive()]

    def failed_nodes(self, timeout_s: float = HEARTBEAT_TIMEOUT_S) -> list[str]:
        """Nodes whose process exited or whose heartbeats stopped."""
        dead = self.dead_nodes()
        return dead + [n for n in self.stale_nodes(timeout_s) if n not in dead]

    def idle(self) -> None:
        """Between steps: read pending heartbeats (and drop late results of failed steps)."""
        while self._receive(0) is not None:
            pass

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self.processes]

    @property
    def depth(self) -> int:
        """Micro-batches the engine keeps in flight: one per stage, so that every stage has
        one to work on (the step model's cyclic pipeline, `coral.perf.step`)."""
        return len(self.addresses.nodes)

    def launch(self, items: Sequence[WorkItem]) -> int:
        """Send one micro-batch into the pipeline without waiting; returns its id, which
        `collect` reports once every token of it is back."""
        from coral.runtime.pipeline import group_by_node

        self._batch_ids += 1
        batch_id = self._batch_ids
        expected = sum(1 for i in items if not i.release)
        self._pending[batch_id] = _Pending(expected, time.time() + STEP_TIMEOUT_S)
        for node, group in group_by_node(items, self._router).items():
            self._first[node].send_pyobj(Batch(tuple(group), batch_id))
        return batch_id

    def collect(self, timeout_s: float) -> list[tuple[int, list[TokenResult]]]:
        """Micro-batches whose tokens are all back, waiting up to `timeout_s` for the first
        (a `wake` ends the wait early). Raises `WorkerLostError` when a worker is lost or a
        micro-batch outlives `STEP_TIMEOUT_S`; every micro-batch in flight is then dropped."""
        done = [(b, p.tokens) for b, p in self._pending.items() if p.expected == 0]
        end = time.time() + timeout_s
        while not done:
            msg = self._receive(min(0.2, max(0.0, end - time.time())))
            if isinstance(msg, (Results, StepFailed)):
                pending = self._pending.get(msg.batch_id)
                if pending is not None:  # else a late reply of a micro-batch already failed
                    pending.tokens.extend(msg.tokens if isinstance(msg, Results) else [
                        TokenResult(rid, step, -1, error=f"node {msg.node_id}: {msg.error}",
                                    retry=True) for rid, step in msg.items])
                    if len(pending.tokens) >= pending.expected:
                        done.append((msg.batch_id, pending.tokens))
            self._check_in_flight()
            if isinstance(msg, Wake) or time.time() >= end:
                break
        for batch_id, _ in done:
            del self._pending[batch_id]
        return done

    def _check_in_flight(self) -> None:
        failure = None
        if self._aborted.is_set():
            failure = "the pipeline is closing"
        else:
            dead = self.dead_nodes()
            stale = dead or self.stale_nodes()
            if stale:
                failure = (f"worker(s) {', '.join(stale)} "
                           f"{'exited' if dead else 'stopped sending heartbeats'}")
            elif self._pending and time.time() > min(p.deadline for p in self._pending.values()):
                failure = f"a micro-batch timed out after {STEP_TIMEOUT_S} s"
        if failure is not None:
            batches = sorted(self._pending)
            self._pending.clear()
            raise WorkerLostError(f"micro-batch(es) {batches}: {failure}")

    def wake(self) -> None:
        """End a `collect` waiting in another thread (thread-safe): new work has come."""
        with self._wake_lock:
            try:
                if self._wake_socket is None:
                    self._wake_socket = self._ctx.socket(self._zmq.PUSH)
                    self._wake_socket.setsockopt(self._zmq.LINGER, 0)
                    self._wake_socket.connect(self.addresses.driver_address)
                self._wake_socket.send_pyobj(Wake(), flags=self._zmq.NOBLOCK)
            except self._zmq.ZMQError:  # closed, or a wake already queued: nothing to do
                pass

    def execute(self, items: Sequence[WorkItem]) -> list[TokenResult]:
        """One whole step, as `min(stages, requests)` micro-batches sent at once: the first
        stage takes them in order, and each later stage starts on one as soon as the stage
        before hands it over."""
        from coral.runtime.pipeline import micro_batches

        launched = {self.launch(micro) for micro in micro_batches(items, self.depth)}
        tokens: list[TokenResult] = []
        while launched:
            for batch_id, got in self.collect(0.2):
                if batch_id in launched:
                    launched.discard(batch_id)
                    tokens.extend(got)
        return tokens

    def abort(self) -> None:
        """Make a step in progress (in another thread) fail at once instead of waiting for
        tokens that will not come; called before close()."""
        self._aborted.set()

    def kill(self) -> None:
        """SIGKILL every worker still running: for an instance found dead or hung, whose
        workers need no graceful stop (a stopped or wedged worker would not read Shutdown)."""
        self._aborted.set()
        for p in self.processes:
            if p.is_alive():
                p.kill()
        for p in self.processes:
            p.join(timeout=SHUTDOWN_GRACE_S)

    def close(self) -> None:
        self._aborted.set()
        for stage in self.addresses.nodes:
            for node in stage:
                sock = self._ctx.socket(self._zmq.PUSH)
                sock.setsockopt(self._zmq.LINGER, 500)
                sock.connect(node.address)
                sock.send_pyobj(Shutdown())
                sock.close()
        # A Shutdown can be dropped (its socket lingers 500 ms; a loaded machine may not have
        # connected by then): workers still running are terminated, and waited for, so that
        # close() returns with every worker gone.
        deadline = time.time() + SHUTDOWN_GRACE_S
        for p in self.processes:
            p.join(timeout=max(0.0, deadline - time.time()))
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(timeout=SHUTDOWN_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join()
        self._beats_stop.set()
        if self._beats is not None:
            self._beats.join(timeout=2 * HEARTBEAT_S + 1.0)
        self._ctx.destroy(linger=0)
