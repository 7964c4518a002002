"""Simulating a deployment's models in several processes (`SimConfig.workers`).

Models share no instance and no request, so each group of models runs its own event loop and
the groups' results put together are exactly one process's. Workers are forked
(`concurrent.futures` over the `fork` start method) so that they inherit the built simulator
and the requests rather than receive them pickled; only their results travel back.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Mapping

from coral.sim.results import SimResult, record, request_results_from_records
from coral.sim.workload import Request

#: What a forked worker simulates: (the `coral.sim.event_loop.Simulator`, the requests by arrival,
#: each group's request positions). Set before the workers fork and cleared after, so that
#: they inherit it. (The simulator is typed `Any` here: the engine imports this module.)
_JOB: tuple[Any, list[Request], list[list[int]]] | None = None


def model_groups(routers: Mapping[str, object], workers: int,
                 reqs: list[Request]) -> list[set[str]]:
    """The routed models split into up to `workers` groups of about equal request counts (the
    largest model first into the lightest group); models with no instance go with the first
    group. One group when there is one worker or the OS cannot fork."""
    workers = min(workers, len(routers))
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [set(routers)]
    counts = Counter(r.model for r in reqs)
    groups: list[set[str]] = [set() for _ in range(workers)]
    loads = [0] * workers
    for m in sorted(routers, key=lambda m: (-counts[m], m)):
        g = loads.index(min(loads))
        groups[g].add(m)
        loads[g] += counts[m]
    groups[0] |= set(counts) - set(routers)
    return [g for g in groups if g]


def run_in_processes(sim: Any, reqs: list[Request], groups: list[set[str]],
                     progress: Callable[[float], None] | None) -> SimResult:
    """Simulate each group of models in its own process (this one takes the first) and put
    the results together. The groups' events never interact, so every request, node and count
    comes out as in one process: the end time is the latest group's, the event and step counts
    are sums."""
    global _JOB
    where = {m: g for g, models in enumerate(groups) for m in models}
    parts: list[list[int]] = [[] for _ in groups]  # request positions per group
    for k, r in enumerate(reqs):
        parts[where[r.model]].append(k)
    _JOB = (sim, reqs, parts)
    try:
        with ProcessPoolExecutor(max_workers=len(groups) - 1,
                                 mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_simulate_group, g) for g in range(1, len(groups))]
            seqs, now, events, steps = sim._run([reqs[k] for k in parts[0]], progress)
            records: list[tuple | None] = [None] * len(reqs)
            for k, s in zip(parts[0], seqs):
                records[k] = record(s)
            del seqs
            busy: dict[int, list[float]] = {}
            for g, future in enumerate(futures, start=1):
                try:
                    recs, busy_g, now_g, events_g, steps_g = future.result()
                except Exception as exc:
                    raise RuntimeError(f"simulator worker {g} ({', '.join(sorted(groups[g]))}) "
                                       f"failed: {type(exc).__name__}: {exc}") from exc
                for k, rec in zip(parts[g], recs):
                    records[k] = rec
                busy.update(busy_g)
                now, events, steps = max(now, now_g), events + events_g, steps + steps_g
    finally:
        _JOB = None
    results = request_results_from_records(reqs, records)
    del records
    return SimResult(results, sim.node_usage(busy), [i.spec for i in sim.instances], now,
                     events, steps)


def _simulate_group(g: int) -> tuple:
    """In a forked worker: simulate group `g` of the inherited job and return its records,
    the busy times of its instances, and its end time, event and step counts."""
    assert _JOB is not None, f"worker {os.getpid()} has no job (not forked?)"
    sim, reqs, parts = _JOB
    mine = [reqs[k] for k in parts[g]]
    models = {r.model for r in mine}
    seqs, now, events, steps = sim._run(mine, None)
    busy = {i.index: i.busy for i in sim.instances if i.spec.model in models}
    return [record(s) for s in seqs], busy, now, events, steps
