"""The one model router (`coral.routing.SwrrRouter`): its skip rules, its block draws, and the
simulator's and the gateway's routers routing alike."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from coral.routing import LOAD_SLACK, SwrrRouter, overloaded, serving_slots, swrr_pick
from coral.runtime.model_router import GatewayModelRouter
from coral.sim import InstanceSpec, simulate, synthetic
from coral.sim import model_router as sim_model_router
from coral.sim.deployment import stages_from_nodes
from coral.sim.model_router import SWRR_BLOCK, SimModelRouter, instance_slots
from coral.templates.slo import SloSpec


class _RuntimeInstance:
    """What `GatewayModelRouter` reads of an instance: its name, weight, state and load."""

    def __init__(self, name: str, weight: float, slots: int = 0):
        self.spec = SimpleNamespace(weight=weight, slots=slots)
        self.name, self.state, self.in_flight, self.served = name, "active", 0, 0


def _sim_instance(weight: float, batch: int = 0, role: str = "aggregated",
                  prompt_tokens: int | None = None) -> SimpleNamespace:
    """What `SimModelRouter` reads of a simulated instance: its spec (weight, role, SLO) and its
    batch (`max_seqs`: sequences, or a prefill instance's prompt tokens per round)."""
    slo = None if prompt_tokens is None else SimpleNamespace(input_tokens=prompt_tokens)
    return SimpleNamespace(spec=SimpleNamespace(weight=weight, role=role, slo=slo),
                           max_seqs=batch)


def test_equal_weights_and_no_load_is_plain_smooth_round_robin():
    rr = SwrrRouter([3.0, 1.0])
    assert [rr.pick() for _ in range(8)] == [0, 0, 1, 0] * 2  # interleaved, not "0001"


def test_overload_is_judged_per_unit_weight():
    # b (weight 1) holds 2: a's fair count at b's load is 6, so a is skipped only above 12
    assert overloaded([12, 2], [3.0, 1.0], [0, 1], LOAD_SLACK) == []
    assert overloaded([13, 2], [3.0, 1.0], [0, 1], LOAD_SLACK) == [0]
    # equal weights: more than LOAD_SLACK above, and more than twice, the least loaded
    assert overloaded([9, 5], [1.0, 1.0], [0, 1], LOAD_SLACK) == []
    assert overloaded([11, 5], [1.0, 1.0], [0, 1], LOAD_SLACK) == [0]
    assert overloaded([4, 0, 0], [1.0, 1.0, 1.0], [0, 1, 2], LOAD_SLACK) == []
    assert overloaded([5, 0, 0], [1.0, 1.0, 1.0], [0, 1, 2], LOAD_SLACK) == [0]
    # only candidates count: without instance 1, instance 2 is the least loaded
    assert overloaded([5, 0, 3], [1.0, 1.0, 1.0], [0, 2], LOAD_SLACK) == []


def test_the_routers_scans_equal_the_written_out_rule():
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(1, 9)
        weights = [rng.choice((1.0, 2.0, rng.uniform(0.1, 5.0))) for _ in range(n)]
        slots = [rng.choice((0, rng.randint(1, 20))) for _ in range(n)]
        rr = SwrrRouter(weights, slots=slots)
        rr.in_flight[:] = [rng.randint(0, 30) for _ in range(n)]
        queued = [max(f - s, 0) for f, s in zip(rr.in_flight, slots)]
        assert rr.queued() == queued
        assert rr._overloaded_all() == overloaded(queued, weights, range(n), LOAD_SLACK)


def test_requests_a_deep_pipeline_runs_at_once_are_not_overload():
    """A pipeline running 48 sequences at once beside a one-node instance running 8, at
    equal weights: holding its slots full is its share, not an overload; a queue is."""
    rr = SwrrRouter([1.0, 1.0], slots=[48, 8])
    rr.in_flight[:] = [48, 8]
    assert rr._overloaded_all() == []
    assert sorted(rr.pick() for _ in range(2)) == [0, 1]
    rr.in_flight[:] = [48 + LOAD_SLACK + 1, 8]
    assert rr._overloaded_all() == [0]
    # without slots the same loads read as the pipeline overloaded
    assert overloaded([48, 8], [1.0, 1.0], [0, 1], LOAD_SLACK) == [0]


def test_each_kind_of_instance_serves_its_batch_in_requests():
    """Aggregated and decode batches count sequences; a prefill batch counts prompt tokens
    per round, so it serves that many over the prompt length in prompts (at least one) in
    the round in progress and as many in the one forming."""
    assert serving_slots("aggregated", 48, 1024) == 48
    assert serving_slots("decode", 256) == 256
    assert serving_slots("prefill", 3 * 2048, 1024) == 2 * 6
    assert serving_slots("prefill", 2048, 1500) == 2 * 1
    assert serving_slots("prefill", 512, 1024) == 2 * 1  # a prompt longer than a round
    assert serving_slots("prefill", 2048) == 0  # prompt length not known: all queued
    with pytest.raises(ValueError):
        serving_slots("decode", -1)
    # the simulator reads a prefill instance's prompts at its SLO's prompt length
    assert instance_slots(_sim_instance(1.0, 4096, "prefill", 1024)) == 8
    assert instance_slots(_sim_instance(1.0, 64, "decode", 1024)) == 64
    assert instance_slots(_sim_instance(1.0, 4096, "prefill")) == 0


def test_a_prefill_instance_past_its_share_is_skipped():
    """Two prefill instances of 4,096 tokens a round on 1,024-token prompts (4 a round,
    8 at once with the round forming): one holding 5 prompts beyond them while the other
    holds 2 is skipped. Read as sequences (4,096 slots) the same loads were no queue at
    all, and the slow instance kept its share however long its prompts waited."""
    sim = SimModelRouter([_sim_instance(1.0, 4096, "prefill", 1024) for _ in range(2)])
    sim.inflight[:] = [8 + LOAD_SLACK + 1, 2]
    assert sim._rr.queued() == [LOAD_SLACK + 1, 0]
    assert [sim.pick().slot for _ in range(3)] == [1, 1, 1]
    tokens = SwrrRouter([1.0, 1.0], slots=[4096, 4096])
    tokens.in_flight[:] = [8 + LOAD_SLACK + 1, 2]
    assert tokens._overloaded_all() == []


def test_a_prefill_instance_slower_than_its_weight_hands_its_excess_on(cat, perf, monkeypatch):
    """Two identical one-L4 prefill instances of llama-3.1-8b, the first weighted twice its
    speed (as a GPU type slower than modelled leaves it), at 85 % of what the two serve:
    the first is sent 1.13x what it serves, queues, and the router moves what it cannot
    serve to the second, so its prompts wait a few of its prefill rounds, not the ~10 s
    its planned share builds up in a minute when its token batch reads as sequences."""
    model = "llama-3.1-8b"
    round_s = perf.iteration_seconds(model, "1x-l4", 32, 4096, 0, 0, first_stage=True,
                                     last_stage=True)  # one round of 4 prompts
    rps = 4 / round_s  # one instance's prompts/s
    # a few rounds: the one in progress, the one forming, and the queue the overload rule
    # allows
    slo = SloSpec(tpot_s=0.1, ttft_s=3.5 * round_s, percentile=0.9, input_tokens=1024,
                  output_tokens=16)

    def inst(name: str, role: str, node: str, batch: int, weight: float) -> InstanceSpec:
        return InstanceSpec(name, model, stages_from_nodes([(node, 0, 32, batch, 1.0)]),
                            weight, 1.0, slo=slo, role=role, region="r")

    insts = [inst("p0", "prefill", "1x-l4", 4096, 2 * rps),
             inst("p1", "prefill", "1x-l4", 4096, rps),
             inst("d", "decode", "1x-h100-sxm", 256, 100 * rps)]
    reqs = synthetic(model, rate_rps=0.85 * 2 * rps, duration_s=60.0, seed=1,
                     prompt_tokens=1024, output_tokens=16)

    def p0_share_and_ttft_p90() -> tuple[float, float]:
        res = simulate(insts, reqs, perf=perf, catalog=cat)
        ttft = sorted(r.ttft_s for r in res.requests if r.instance == "p0")
        return len(ttft) / len(reqs), ttft[int(0.9 * len(ttft))]

    share, ttft_p90 = p0_share_and_ttft_p90()
    assert share < 1.05 / 1.7 and ttft_p90 < slo.ttft_s  # what it serves, of 1.7 instances'
    monkeypatch.setattr(sim_model_router, "instance_slots", lambda i: i.max_seqs)  # as sequences
    share, ttft_p90 = p0_share_and_ttft_p90()
    assert share > 1.1 / 1.7 and ttft_p90 > 2 * slo.ttft_s


def test_unroutable_and_excluded_instances_take_nothing():
    rr = SwrrRouter([1.0, 1.0, 1.0])
    rr.set_routable(1, False)
    assert set(rr.pick() for _ in range(10)) == {0, 2}
    assert set(rr.pick(exclude={0}) for _ in range(4)) == {2}
    rr.set_routable(0, False)
    assert rr.pick(exclude={2}) is None
    rr.set_routable(2, False)
    assert rr.pick() is None
    rr.set_routable(1, True)
    assert rr.pick() == 1


def test_skipped_instances_take_no_credit():
    rr = SwrrRouter([1.0, 1.0], load_slack=0)
    rr.in_flight[:] = [5, 0]  # 0 overloaded: the picks rotate over instance 1 alone
    assert [rr.pick() for _ in range(3)] == [1, 1, 1]
    assert rr.credits() == [0.0, 0.0]


@pytest.mark.parametrize("seed", range(4))
def test_blocks_give_the_picks_of_one_at_a_time(seed):
    """Drawn ahead in blocks (the simulator) or one at a time (the gateway), the same picks
    and credits, through skips, state changes and weight changes."""
    rng = random.Random(seed)
    n = rng.choice((3, 5, 17))  # 17: the numpy path
    weights = [rng.uniform(0.2, 5.0) for _ in range(n)]
    one, ahead = SwrrRouter(weights), SwrrRouter(weights, block=SWRR_BLOCK)
    picks = ([], [])
    for step in range(3000):
        r = rng.random()
        if r < 0.01:
            k = rng.randrange(n)
            state = rng.random() < 0.6
            one.set_routable(k, state)
            ahead.set_routable(k, state)
        elif r < 0.012:
            new = [rng.uniform(0.2, 5.0) for _ in range(n)]
            one.set_weights(new)
            ahead.set_weights(new)
        elif r < 0.5 and step > 1500:  # the second half under load: skips happen
            k = rng.randrange(n)
            if one.in_flight[k]:
                one.in_flight[k] -= 1
                ahead.in_flight[k] -= 1
        else:
            exclude = {rng.randrange(n)} if r > 0.98 else ()
            a, b = one.pick(exclude), ahead.pick(exclude)
            picks[0].append(a)
            picks[1].append(b)
            if a is not None:
                one.in_flight[a] += 1
            if b is not None:
                ahead.in_flight[b] += 1
    assert picks[0] == picks[1]
    assert one.credits() == ahead.credits()
    assert set(picks[0]) - {None} == set(range(n))


def test_a_block_matches_the_per_pick_rotation():
    weights = [2.653438578656314, 5.802305527480194, 0.3]
    cur, want = [0.0] * 3, []
    for _ in range(1000):
        want.append(swrr_pick(weights, cur))
    rr = SwrrRouter(weights, block=SWRR_BLOCK)
    assert [rr.pick() for _ in range(1000)] == want and rr.credits() == cur


@pytest.mark.parametrize("seed", range(3))
def test_the_simulator_routes_as_the_gateway(seed):
    """The same request sequence, completions and draining marks: the simulator's router
    and the gateway's pick the same instances."""
    rng = random.Random(seed)
    weights = [3.0, 1.0, 2.0, 0.5, 2.0]
    sim_insts = [_sim_instance(3.0, 6), _sim_instance(1.0, 0), _sim_instance(2.0, 512,
                 "prefill", 1024), _sim_instance(0.5, 1, "decode"), _sim_instance(2.0, 3)]
    slots = [instance_slots(i) for i in sim_insts]
    assert slots == [6, 0, 2, 1, 3]
    sim = SimModelRouter(sim_insts)
    gw_insts = [_RuntimeInstance(f"i{k}", w, n) for k, (w, n) in enumerate(zip(weights, slots))]
    gateway = GatewayModelRouter("m")
    gateway.set_active(gw_insts)
    sim_picks, gw_picks = [], []
    for _ in range(4000):
        r = rng.random()
        if r < 0.01:  # a preemption notice, or an instance back
            k = rng.randrange(len(weights))
            draining = rng.random() < 0.5
            sim.set_routable(sim_insts[k], not draining)
            gateway.drain(gw_insts[k], draining)
        elif r < 0.45:  # a request ends
            k = rng.randrange(len(weights))
            if sim.inflight[k]:
                sim.inflight[k] -= 1
                gateway._done(gw_insts[k])
        else:
            inst = sim.pick()
            if inst is not None:
                sim.inflight[inst.slot] += 1  # as the simulator's event loop counts it
            sim_picks.append(None if inst is None else inst.slot)
            chosen = gateway._pick()
            gw_picks.append(None if chosen is None else gw_insts.index(chosen))
        assert sim.inflight == [i.in_flight for i in gw_insts]
    assert sim_picks == gw_picks
    assert max(sim.inflight) > 2 * LOAD_SLACK  # loaded enough for the overload rule to act
    assert set(sim_picks) - {None} == set(range(len(weights)))
