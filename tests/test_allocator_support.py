"""Shared factories of the allocator tests: hand-made columns and random tiny problems.

The random problems are small enough for the exhaustive oracle (`solve_bruteforce`): at most
two regions, four templates and a handful of nodes of each type. Figures have two decimals, so
that a plan either meets a demand or misses it by far more than any solver tolerance.
"""

from __future__ import annotations

import random

from coral.allocator.problem import AllocationProblem, ModelDemand, TemplateColumn

NODE_TYPES = ("g1", "g2", "g3")
REGIONS = ("r1", "r2")


def column(tid: str, model: str, nodes: dict[str, int], capacity: float,
           prices: dict[str, float], mode: str = "aggregated") -> TemplateColumn:
    return TemplateColumn(tid, model, mode, nodes, capacity, prices)  # type: ignore[arg-type]


def _random_nodes(rng: random.Random) -> dict[str, int]:
    kinds = rng.sample(NODE_TYPES, rng.choice((1, 1, 2)))
    return {g: rng.choice((1, 1, 2)) for g in kinds}


def _price(rng: random.Random, nodes: dict[str, int], node_price: dict[tuple[str, str], float],
           regions: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for r in regions:
        if all((g, r) in node_price for g in nodes):
            out[r] = round(sum(n * node_price[(g, r)] for g, n in nodes.items()), 4)
    return out


def random_problem(
    seed: int,
    *,
    pd: bool = False,
    with_current: bool = False,
    startup_s: float = 0.0,
    n_templates: int = 4,
) -> AllocationProblem:
    """A random tiny problem: 1-2 regions, `n_templates` templates over 1-2 models.

    With `pd`, the last model is served by prefill and decode templates (at least one each).
    With `with_current`, a random current deployment is added.
    """
    rng = random.Random(seed)
    regions = REGIONS[: rng.choice((1, 2))]
    node_price = {
        (g, r): round(rng.uniform(0.5, 4.0), 2)
        for g in NODE_TYPES
        for r in regions
        if rng.random() < (0.95 if pd else 0.85)
    }
    models = ["m1", "m2"][: rng.choice((1, 2)) if not pd else 2]
    templates: list[TemplateColumn] = []
    for i in range(n_templates):
        if pd:  # m1 aggregated, then prefill, decode and a random half of m2
            model, mode = ("m1", "aggregated") if i == 0 else (
                "m2", ("prefill", "decode")[i - 1] if i < 3 else rng.choice(("prefill", "decode")))
        else:
            model, mode = models[i % len(models)], "aggregated"
        nodes = _random_nodes(rng)
        prices = _price(rng, nodes, node_price, regions)
        unit = {"aggregated": 1.0, "prefill": 1000.0, "decode": 100.0}[mode]
        capacity = round(round(rng.uniform(1.0, 6.0), 2) * unit, 6)
        if pd and rng.random() < 0.3:  # spread the halves over both regions
            prices = {r: p for r, p in prices.items() if r == regions[-1] or i != 3}
        templates.append(column(f"t{i}", model, nodes, capacity, prices, mode))
    availability = {
        (g, r): rng.randint(1, 5) if pd else rng.randint(0, 4)
        for g in NODE_TYPES
        for r in regions
        if rng.random() < 0.9
    }
    demands = []
    for model in models:
        is_pd = pd and model == models[-1]
        demands.append(ModelDemand(
            model,
            round(rng.uniform(0.5, 4.0 if pd else 12.0), 3),
            input_tokens=1000.0 if is_pd else 1.0,
            output_tokens=100.0 if is_pd else 1.0,
            priority=rng.choice((1.0, 1.0, 2.0, 0.5)),
        ))
    current: dict[tuple[str, str], int] = {}
    if with_current:
        for t in templates:
            for r in t.price_usd_per_hour:
                if rng.random() < 0.4:
                    current[(t.id, r)] = rng.randint(1, 2)
    return AllocationProblem(
        demands=tuple(demands),
        templates=tuple(templates),
        regions=regions,
        availability=availability,
        current=current,
        startup_s=startup_s,
        time_limit_s=20.0,
        mip_gap=0.0,
    )
