"""Gateway metrics in the Prometheus text exposition format, through `prometheus_client`.

Each gateway keeps its own counts and its own registry (several gateways run in one test
process, so the library's global registry is not used); a collector turns the counts into
metric families when /metrics is read.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from coral.runtime.step_times import StepRow
from coral.runtime.step_times import families as step_families

if TYPE_CHECKING:
    from coral.templates.slo import SloSpec

#: Histogram bucket upper bounds, seconds.
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class _Histogram:
    """Observations of one model: counts per bucket (the last is +Inf), their sum."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts):
            acc += count
            out.append((floatToGoString(bound), acc))
        return out


#: Failure-handling metrics of a model's router (`GatewayModelRouter.runtime_stats()` keys):
#: (key, metric name, type, help).
RUNTIME_METRICS = (
    ("worker_deaths", "coral_worker_deaths_total", "counter",
     "Worker processes found dead or silent."),
    ("instance_deaths", "coral_instance_deaths_total", "counter",
     "Instances taken out of routing because a worker was lost."),
    ("restarts", "coral_instance_restarts_total", "counter",
     "Replacement instances started and ready."),
    ("restart_failures", "coral_instance_restart_failures_total", "counter",
     "Replacement instances that failed to start."),
    ("unavailable", "coral_requests_unavailable_total", "counter",
     "Requests answered 503 because the model had no ready instance."),
    ("retriable_errors", "coral_requests_cut_total", "counter",
     "Requests whose instance was lost after it produced tokens."),
    ("poison_requests", "coral_requests_poison_total", "counter",
     "Requests refused as the cause of repeated worker crashes."),
    ("unavailable_s", "coral_model_unavailable_seconds_total", "counter",
     "Seconds during which the model had no ready instance."),
    ("ready_instances", "coral_model_ready_instances", "gauge",
     "Instances of the model ready to take requests."),
    ("planned_instances", "coral_model_planned_instances", "gauge",
     "Instances of the model the plan runs."),
)


class GatewayMetrics:
    """Request and token counters and TTFT/TPOT histograms, per model; and, for the models
    given an SLO (`slos`: model -> the `SloSpec` of the plan file, whose TTFT and TPOT
    bounds it judges), how many answered requests met both bounds, as the simulator counts
    SLO attainment."""

    def __init__(self, slos: Mapping[str, SloSpec] | None = None) -> None:
        self.slos = dict(slos or {})
        self.slo_judged: dict[str, int] = defaultdict(int)
        self.slo_met: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        # (model, endpoint, status) -> count
        self.requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self.prompt_tokens: dict[str, int] = defaultdict(int)
        self.generation_tokens: dict[str, int] = defaultdict(int)
        self.ttft: dict[str, _Histogram] = {}
        self.tpot: dict[str, _Histogram] = {}
        self.reruns: dict[str, int] = defaultdict(int)  # reruns after tokens were produced

    def count_rerun(self, model: str) -> None:
        with self._lock:
            self.reruns[model] += 1

    def count_request(self, model: str, endpoint: str, status: str) -> None:
        with self._lock:
            self.requests[(model, endpoint, status)] += 1

    def observe_request(self, model: str, prompt_tokens: int, generation_tokens: int,
                        ttft_s: float | None, tpot_s: float | None) -> None:
        with self._lock:
            self.prompt_tokens[model] += prompt_tokens
            self.generation_tokens[model] += generation_tokens
            if ttft_s is not None:
                self.ttft.setdefault(model, _Histogram(TTFT_BUCKETS_S)).observe(ttft_s)
            if tpot_s is not None:
                self.tpot.setdefault(model, _Histogram(TPOT_BUCKETS_S)).observe(tpot_s)
            if model in self.slos and ttft_s is not None:
                slo = self.slos[model]
                self.slo_judged[model] += 1
                # one generated token has no TPOT: it is judged on its TTFT alone
                if ttft_s <= slo.ttft_s and (tpot_s is None or tpot_s <= slo.tpot_s):
                    self.slo_met[model] += 1

    def slo_attainment(self) -> dict[str, float]:
        """Per model with an SLO and answered requests: the share that met it."""
        with self._lock:
            return {m: self.slo_met[m] / n for m, n in self.slo_judged.items() if n}

    def render(self, runtime: Mapping[str, Mapping[str, float]] | None = None,
               steps: Sequence[StepRow] = ()) -> str:
        """The metrics; `runtime`: each model's router counters (`RUNTIME_METRICS`); `steps`:
        the workers' measured step times (`coral.runtime.step_times`)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self, runtime or {}, steps))
        return generate_latest(registry).decode()

    def families(self, runtime: Mapping[str, Mapping[str, float]]) -> Iterator[Metric]:
        """The metric families of the counts now, and of the routers' `runtime` counters."""
        with self._lock:
            requests = CounterMetricFamily(
                "coral_requests_total", "Requests by model, endpoint and outcome.",
                labels=["model", "endpoint", "status"])
            for key, n in sorted(self.requests.items()):
                requests.add_metric(list(key), n)
            out: list[Metric] = [requests]
            for name, table, help_ in (
                    ("coral_prompt_tokens_total", self.prompt_tokens, "Prompt tokens processed."),
                    ("coral_generation_tokens_total", self.generation_tokens, "Tokens generated.")):
                family = CounterMetricFamily(name, help_, labels=["model"])
                for m, n in sorted(table.items()):
                    family.add_metric([m], n)
                out.append(family)
            for name, hists, help_ in (
                    ("coral_ttft_seconds", self.ttft, "Time to first token."),
                    ("coral_tpot_seconds", self.tpot,
                     "Mean time per output token after the first.")):
                family = HistogramMetricFamily(name, help_, labels=["model"])
                for m, h in sorted(hists.items()):
                    family.add_metric([m], h.cumulative(), h.total)
                out.append(family)
            out.extend(self._slo_families())
            reruns = dict(self.reruns)
        # a request is rerun from its prompt by the router (its instance failed before the
        # first token) or by the gateway (after tokens, while nothing had reached the client)
        family = CounterMetricFamily(
            "coral_request_reruns_total",
            "Requests run again from their prompt after their instance was lost.",
            labels=["model", "stage"])
        for model in sorted(set(runtime) | set(reruns)):
            family.add_metric([model, "before_first_token"],
                              runtime.get(model, {}).get("retries", 0))
            family.add_metric([model, "after_tokens"], reruns.get(model, 0))
        out.append(family)
        for key, name, kind, help_ in RUNTIME_METRICS:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = cls(name, help_, labels=["model"])
            for m, stats in sorted(runtime.items()):
                if key in stats:
                    family.add_metric([m], stats[key])
            out.append(family)
        yield from out


    def _slo_families(self) -> list[Metric]:
        """The SLO each model was planned for and how many answered requests met it (caller
        holds the lock)."""
        bounds = GaugeMetricFamily("coral_slo_bound_seconds",
                                   "The SLO the model was planned for: TTFT and TPOT bounds.",
                                   labels=["model", "bound"])
        judged = CounterMetricFamily("coral_slo_requests_total",
                                     "Answered requests judged against the model's SLO.",
                                     labels=["model"])
        met = CounterMetricFamily("coral_slo_met_total",
                                  "Answered requests within both the TTFT and TPOT bounds.",
                                  labels=["model"])
        share = GaugeMetricFamily("coral_slo_attainment",
                                  "Share of the judged requests that met the SLO.",
                                  labels=["model"])
        for m, slo in sorted(self.slos.items()):
            bounds.add_metric([m, "ttft"], slo.ttft_s)
            bounds.add_metric([m, "tpot"], slo.tpot_s)
            n = self.slo_judged.get(m, 0)
            judged.add_metric([m], n)
            met.add_metric([m], self.slo_met.get(m, 0))
            if n:
                share.add_metric([m], self.slo_met.get(m, 0) / n)
        return [bounds, judged, met, share]


class _Collector:
    """One rendering's view of a gateway's metrics (see `GatewayMetrics.render`)."""

    def __init__(self, metrics: GatewayMetrics, runtime: Mapping[str, Mapping[str, float]],
                 steps: Sequence[StepRow] = ()):
        self.metrics, self.runtime, self.steps = metrics, runtime, steps

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics.families(self.runtime)
        yield from step_families(self.steps)
