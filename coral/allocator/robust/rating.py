"""What a template column delivers when one GPU type is slower than modelled (`--robust R`).

Scenario "g slow": every iteration on a node of GPU type `g` takes `F = 1 + R` times what the
perf model says, or under `--robust auto` its prefill and decode each their own factor
(`coral.perf.slowdown.SlowedPerf`, the wrapper `coral simulate --slowdown` runs). A column
is re-rated on the **same placement** — same stages, layer ranges and batches, as the plan
deploys it and the simulator runs it — with the rating the planner gives it
nominally (`Scenario.planned_capacity`: `coral.allocator.scenario.headroom.planned_capacity` fed
with the step model's figures at full occupancy, `coral.perf.step.saturation`):

- the step model is run twice on the placement, with the perf model as it is and slowed:
  full-occupancy rate, step (the TPOT every sequence sees) and the step a prompt rides in
  (its TTFT: the step of most prompts for an aggregated instance, the prefill step for a
  prefill half, none for a decode half);
- the template's own figures (throughput, TPOT, TTFT) are scaled by the ratio of the two, and
  the slowed saturation is handed to the same `planned_capacity`. At `F = 1` this is the
  nominal planned capacity exactly, whatever version of the search produced the template's
  figures; slowed, every comparison the rating makes (template against step model) stays as
  it was, and only the slowdown moves the result.

What the slowed instance delivers within the SLO: a TTFT that grows eats into the queueing
slack, so the rating's utilisation drops (to 0 once the prompt's step alone exceeds the TTFT
target). A busy step beyond the TPOT target would rate it at 0 (the rating's own rule).

**The instance a robust plan deploys is the instance rated.** Neither the gateway nor the
simulator knows which GPU type is slow: both route by the plan's weights and fill an instance
up to the batch it deploys (`coral.routing`), so an instance whose slowed busy step at its
own batch misses TPOT keeps taking its share and runs full, past TPOT. Where that happens for
any of a template's GPU types, the robust plan deploys the template with a smaller batch
(`robust_columns`): the largest micro-batch (sequences per stage, every stage's node batch
cut to it) at which the instance, run full, meets TPOT with each of its GPU types slowed
(`busy_tpot`: the busy step, and for a decode half its KV transfer and the backlog the router
lets build, spread over the output), found by bisection (the step grows with the batch).
Such an instance cannot run past TPOT when its GPU type is slow; what it cannot take queues,
and the router's overload rule moves it to the model's other instances. Its nominal capacity and its capacity in every scenario are rated on that
smaller batch, with the same step model the simulator runs (`SlowedPerf` in both): one
placement, one rating. Only when one sequence per stage already misses TPOT is it rated 0
in that scenario (and not cut). Prefill halves are not cut to a smaller chunk: their step
only sets TTFT, which the queueing slack already prices.

The ratings depend only on the template and the perf model, so they are stored beside each
template library (`robust.json`, keyed by the library's digest, which covers the catalog and
the perf model's version) and in memory: a re-plan, or another `R`, recomputes nothing it has
already rated.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from coral.allocator.scenario.headroom import planned_capacity
from coral.allocator.scenario.load import Scenario
from coral.perf.pipeline import PipelineShape
from coral.perf.slowdown import PhaseSlowdown, SlowedPerf, Slowdown
from coral.routing import LOAD_SLACK
from coral.perf.step import Saturation, build_step_model, busy_steps, saturation, stages_from_shape
from coral.templates.builder.store import MANIFEST, TemplateLibrary
from coral.templates.template import Template

log = logging.getLogger(__name__)

#: The ratings of a library's templates, stored beside it.
RATINGS_FILE = "robust.json"
#: 5: per template key, per rating key ("nominal" or "GPU=F", "/as-deployed" when not cut to a
#: smaller batch, "@N" at N sequences per stage), the `StepRating` fields.
#: 7: a prefill instance rated by the rounds its KV cache lets it run (`busy_prefill`).
RATINGS_FORMAT = 7

@dataclass(frozen=True)
class StepRating:
    """One instance of a template at full occupancy under the step model, as rated."""

    rps: float  # requests/s of the workload mix
    step_s: float  # one busy step: the TPOT every sequence sees
    ttft_step_s: float  # the step a prompt rides in (0 for a decode half)
    sequences: int
    kv_transfer_s: float
    micro_batch: int = 0  # sequences per stage it was rated at (0: the template's own)
    chunked_step_s: float | None = None  # `Saturation.chunked_step_s`
    chunked_rps: float | None = None  # `Saturation.chunked_rps`

    def saturation(self) -> Saturation:
        return Saturation(rps=self.rps, step_s=self.step_s, sequences=self.sequences,
                          kv_transfer_s=self.kv_transfer_s, chunked_step_s=self.chunked_step_s,
                          chunked_rps=self.chunked_rps)


def with_micro_batch(shape: PipelineShape, micro_batch: int) -> PipelineShape:
    """`shape` with every stage's node batch cut so that a stage holds at most about
    `micro_batch` sequences (`ceil(micro_batch / nodes)` a node)."""
    return PipelineShape(tuple(
        replace(st, batch=max(1, min(st.batch, -(-micro_batch // st.count))))
        for st in shape.stages))


def own_micro_batch(shape: PipelineShape) -> int:
    """Sequences per stage of `shape` busy: its smallest stage batch."""
    return min(st.count * st.batch for st in shape.stages)


def step_rating(template: Template, perf: Any, catalog: Any, *, micro_batch: int = 0
                ) -> StepRating:
    """`coral.perf.step.saturation` of one instance of `template` on `perf` (at
    `micro_batch` sequences per stage when given), and the step its prompts ride in (the last
    of `busy_steps`, the one of most prompts)."""
    slo = template.slo
    shape = template.shape if not micro_batch else with_micro_batch(template.shape,
                                                                      micro_batch)
    sat = saturation(template.model, template.mode, shape,
                     input_tokens=slo.input_tokens, output_tokens=slo.output_tokens,
                     perf=perf, catalog=catalog)
    if template.mode == "aggregated":
        layout = build_step_model(template.model, stages_from_shape(shape), perf, catalog)
        steps = busy_steps("aggregated", layout.n_stages, layout.max_seqs, slo.input_tokens,
                           slo.output_tokens)
        ttft = layout.step_cost(*steps[-1][1])[0]
    elif template.mode == "prefill":
        ttft = sat.step_s
    else:
        ttft = 0.0
    return StepRating(rps=sat.rps, step_s=sat.step_s, ttft_step_s=ttft,
                      sequences=sat.sequences, kv_transfer_s=sat.kv_transfer_s,
                      micro_batch=micro_batch, chunked_step_s=sat.chunked_step_s,
                      chunked_rps=sat.chunked_rps)


def busy_tpot(template: Template, rating: StepRating) -> float:
    """TPOT a request sees on one instance of `template` that runs full, as `rating` rates
    it: the busy step; for a decode half also, spread over the tokens after the first, its
    KV transfer and the wait of the backlog the router lets build before it moves prompts
    elsewhere (`LOAD_SLACK` + 1 requests, `coral.routing`, served at the full instance's
    rate). A slowed instance that its planned share overloads runs like this: full, with
    that backlog (`coral.sim.pd`, "Back-pressure")."""
    step = rating.saturation().tail_step_s
    if template.mode != "decode":
        return step
    tokens = max(1, template.slo.output_tokens - 1)
    wait = (LOAD_SLACK + 1) / rating.rps if rating.rps > 0 else math.inf
    return step + (rating.kv_transfer_s + wait) / tokens


def within_tpot(template: Template, perf: Any, catalog: Any) -> StepRating:
    """The rating of `template` on `perf`; where running full misses TPOT (`busy_tpot`;
    aggregated and decode), at the largest micro-batch that meets it (the full-batch rating
    when none does)."""
    full = step_rating(template, perf, catalog)
    target = template.slo.tpot_s * (1.0 + 1e-9)
    if template.mode == "prefill" or busy_tpot(template, full) <= target:
        return full
    lo, hi = 0, own_micro_batch(template.shape)  # meets at lo (0: none yet), misses at hi
    best = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = step_rating(template, perf, catalog, micro_batch=mid)
        if busy_tpot(template, r) <= target:
            lo, best = mid, r
        else:
            hi = mid
    if best is None and lo == 0:
        r = step_rating(template, perf, catalog, micro_batch=1)
        best = r if busy_tpot(template, r) <= target else None
    return full if best is None else best


def _ratio(slowed: float, nominal: float) -> float:
    return slowed / nominal if nominal > 0 else 1.0


def rescaled(template: Template, nominal: StepRating, rating: StepRating) -> Template:
    """`template` with its own figures (throughput, TTFT, TPOT) scaled by what the step model
    says of `rating` against `nominal` (its own placement on the nominal perf model)."""
    q_rps = _ratio(rating.rps, nominal.rps)
    q_step = _ratio(rating.step_s, nominal.step_s)
    q_ttft = _ratio(rating.ttft_step_s, nominal.ttft_step_s)
    return replace(
        template,
        throughput=template.throughput * q_rps,
        throughput_rps=template.throughput_rps * q_rps,
        throughput_tokens_per_s=template.throughput_tokens_per_s * q_rps,
        ttft_s=None if template.ttft_s is None else template.ttft_s * q_ttft,
        tpot_s=None if template.tpot_s is None else template.tpot_s * q_step,
    )


def rerated_capacity(template: Template, scenario: Scenario, nominal: StepRating,
                     slowed: StepRating) -> float:
    """Planned capacity (the template's unit) of one instance whose step-model figures are
    `slowed` where they were `nominal`: the template's own figures scaled by the ratios, the
    slowed saturation handed to `planned_capacity` (see the module docstring)."""
    spec = scenario.model_spec(template.model)
    return planned_capacity(rescaled(template, nominal, slowed), arrival_cv=spec.arrival_cv,
                            output_cv=spec.output_tokens_cv, saturation=slowed.saturation())


def with_batch_cut(template: Template, micro_batch: int, nominal: StepRating,
                   cut: StepRating, why: str) -> Template:
    """`template` deployed at `micro_batch` sequences per stage (each node's batch cut as
    `with_micro_batch` cuts a shape), its figures those of `cut` (its nominal step-model
    rating) against `nominal` (the template's own), and `why` in its notes."""
    stage_nodes: dict[tuple[int, int], int] = {}
    for node in template.nodes:
        key = (node.first_layer, node.layers)
        stage_nodes[key] = stage_nodes.get(key, 0) + 1
    nodes = tuple(
        replace(node, batch=max(1, min(node.batch,
                                       -(-micro_batch // stage_nodes[(node.first_layer,
                                                                      node.layers)]))))
        for node in template.nodes)
    out = replace(rescaled(template, nominal, cut), nodes=nodes,
                  notes=(*template.notes, why))
    assert out.shape == with_micro_batch(template.shape, micro_batch)
    return out


def gpu_types_of(template: Template, catalog: Any) -> tuple[str, ...]:
    """The GPU types of a template's nodes, sorted."""
    return tuple(sorted({catalog.gpu_of(n).name for n in template.combo}))


def slowdown_key(gpu: str, factor: Slowdown) -> str:
    """A slowed rating's key: 'l4=1.2', or 'l4=prefill:1.08;decode:1.07' per phase."""
    s = PhaseSlowdown.of(factor)
    if s.uniform:
        return f"{gpu}={s.prefill:.12g}"
    return f"{gpu}=prefill:{s.prefill:.12g};decode:{s.decode:.12g}"


def _slowdown_of_key(key: str) -> tuple[str, Slowdown]:
    """`slowdown_key`'s (gpu, factor) back from its key."""
    gpu, _, text = key.partition("=")
    if ";" not in text:
        return gpu, float(text)
    phases = dict(part.split(":") for part in text.split(";"))
    return gpu, PhaseSlowdown(float(phases["prefill"]), float(phases["decode"]))


def template_key(template: Template) -> str:
    """A template's identity in a ratings file: model, mode and its deployed stages."""
    stages = [s.to_dict() for s in template.shape.stages]
    return json.dumps([template.model, template.mode, stages], sort_keys=True,
                      separators=(",", ":"))


class RatingStore:
    """`StepRating`s of templates, nominal and under single-GPU slowdowns, kept in memory and
    in each library's `robust.json` (written by `save`)."""

    def __init__(self, perf: Any, catalog: Any,
                 template_dirs: Mapping[str, str] | None = None) -> None:
        self.perf, self.catalog = perf, catalog
        self.template_dirs = dict(template_dirs or {})
        self._perfs: dict[str, Any] = {}
        self._tables: dict[str, dict[str, dict[str, list[float]]]] = {}  # dir -> key -> ...
        self._keys: dict[str, str] = {}  # dir -> library digest
        self._dirty: set[str] = set()
        self.computed = 0  # ratings computed (not read back) since this store was made

    def _perf_for(self, slowdown: str) -> Any:
        p = self._perfs.get(slowdown)
        if p is None:
            if slowdown == "nominal":
                p = self.perf
            else:
                gpu, factor = _slowdown_of_key(slowdown)
                p = SlowedPerf(self.perf, self.catalog, {gpu: factor})
            self._perfs[slowdown] = p
        return p

    def _table(self, template: Template) -> dict[str, dict[str, list[float]]]:
        folder = self.template_dirs.get(f"{template.model}/{template.mode}", "")
        table = self._tables.get(folder)
        if table is None:
            table = self._tables[folder] = self._read(folder)
        return table

    def _read(self, folder: str) -> dict[str, dict[str, list[float]]]:
        if not folder or not (Path(folder) / MANIFEST).exists():
            return {}
        digest = TemplateLibrary.open(folder).digest
        self._keys[folder] = digest
        path = Path(folder) / RATINGS_FILE
        if not path.exists():
            return {}
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") == RATINGS_FORMAT and doc.get("library_digest") == digest:
                return {k: dict(v) for k, v in doc["ratings"].items()}
            log.info("%s: written for another library; rating again", path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("%s: unreadable (%s); rating again", path, exc)
        return {}

    def rating(self, template: Template, slowdown: str, *, micro_batch: int = 0,
               cut_batch: bool = True) -> StepRating:
        """The template's rating under `slowdown` ("nominal" or `slowdown_key(gpu, F)`): at
        `micro_batch` sequences per stage when given; slowed, at the largest micro-batch
        that meets TPOT (`within_tpot`) unless `cut_batch` is false (then at its own batch,
        as deployed)."""
        table = self._table(template)
        per = table.setdefault(template_key(template), {})
        key = slowdown
        if slowdown != "nominal" and not cut_batch:
            key += "/as-deployed"
        if micro_batch:
            key += f"@{micro_batch}"
        hit = per.get(key)
        if hit is not None:
            rps, step, ttft, seqs, kv, micro, chunked_step, chunked_rps = hit
            return StepRating(rps, step, ttft, int(seqs), kv, int(micro), chunked_step,
                              chunked_rps)
        perf = self._perf_for(slowdown)
        r = (within_tpot(template, perf, self.catalog)
             if slowdown != "nominal" and cut_batch and not micro_batch
             else step_rating(template, perf, self.catalog, micro_batch=micro_batch))
        per[key] = [r.rps, r.step_s, r.ttft_step_s, r.sequences, r.kv_transfer_s,
                    r.micro_batch, r.chunked_step_s, r.chunked_rps]
        self.computed += 1
        self._dirty.add(self.template_dirs.get(f"{template.model}/{template.mode}", ""))
        return r

    def save(self) -> None:
        """Write every library's ratings that grew since it was read."""
        for folder in sorted(self._dirty):
            digest = self._keys.get(folder)
            if not folder or digest is None or not Path(folder).is_dir():
                continue
            path = Path(folder) / RATINGS_FILE
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps({"format": RATINGS_FORMAT, "library_digest": digest,
                                       "ratings": self._tables[folder]}))
            os.replace(tmp, path)
        self._dirty.clear()


@dataclass(frozen=True)
class RobustColumn:
    """One column as a robust plan deploys it: the template (its batch cut where a slow GPU
    type of it would run it past TPOT), its nominal capacity and its capacity with each of
    its GPU types slowed (the template's unit)."""

    deployed: Template
    nominal: float
    slowed: Mapping[str, float]  # GPU type -> capacity with that type slowed
    micro_batch: int = 0  # sequences per stage it was cut to (0: its own batch)


#: Slowdown of each GPU type, one factor or one per phase (or one for all): what
#: `robust_columns` plans against.
Factors = float | Mapping[str, Slowdown]


def factor_of(factors: Factors, gpu: str) -> PhaseSlowdown:
    """The slowdown `factors` give `gpu` (1: not slowed)."""
    return PhaseSlowdown.of(factors if isinstance(factors, (int, float))
                            else factors.get(gpu, 1.0))


def robust_column(template: Template, scenario: Scenario, factors: Factors, store: RatingStore
                  ) -> RobustColumn:
    """`template` as a robust plan deploys it with any one of its GPU types slower than
    modelled by its factor (see the module docstring)."""
    nominal = store.rating(template, "nominal")
    slow = {g: factor_of(factors, g) for g in gpu_types_of(template, store.catalog)}
    own = own_micro_batch(template.shape)
    # a GPU type at its modelled speed overloads nothing: only a slowdown calls for a cut
    cuts = [r.micro_batch for r in (store.rating(template, slowdown_key(g, f))
                                    for g, f in slow.items() if f.worst > 1.0)
            if 0 < r.micro_batch < own]
    deployed, micro, own_rating = template, 0, nominal
    if cuts:
        micro = min(cuts)
        # the deployed shape's nominal rating: `with_batch_cut` deploys exactly this cut
        own_rating = store.rating(template, "nominal", micro_batch=micro)
        deployed = with_batch_cut(
            template, micro, nominal, own_rating,
            f"batch cut to {micro} sequences per stage so that TPOT holds with any one of its "
            "GPU types as slow as --robust plans for")
    as_planned = rerated_capacity(template, scenario, nominal, own_rating)
    slowed = {}
    for gpu, f in slow.items():
        rated = rerated_capacity(template, scenario, nominal,
                                 store.rating(deployed, slowdown_key(gpu, f), cut_batch=False))
        # never above nominal: the rating rounds its slot count down, so a longer service
        # time can add a slot and rate a slower instance higher; a slower GPU serves no more
        slowed[gpu] = min(rated, as_planned)
    return RobustColumn(deployed=deployed, nominal=as_planned, slowed=slowed,
                        micro_batch=micro)


def robust_columns(scenario: Scenario, chosen: Mapping[str, Template], factors: Factors,
                   store: RatingStore) -> dict[str, RobustColumn]:
    """Column id -> `robust_column` of the template behind it (`chosen`); `factors`: one
    slowdown for every GPU type, or one per type (absent: not slowed)."""
    values = [factors] if isinstance(factors, (int, float)) else list(factors.values())
    for value in values:
        s = PhaseSlowdown.of(value)
        if not all(math.isfinite(f) and f >= 1.0 for f in (s.prefill, s.decode)):
            raise ValueError(f"slowdown factor must be a finite number >= 1, got {value!r}")
    return {cid: robust_column(t, scenario, factors, store) for cid, t in sorted(chosen.items())}


def scenario_capacities(columns: Mapping[str, RobustColumn]) -> dict[str, dict[str, float]]:
    """GPU type `g` -> column id -> capacity of that column when `g` is slow, for every
    column whose nodes include a `g` GPU (the others keep their nominal capacity)."""
    out: dict[str, dict[str, float]] = {}
    for cid, col in columns.items():
        for gpu, cap in col.slowed.items():
            out.setdefault(gpu, {})[cid] = cap
    return out
