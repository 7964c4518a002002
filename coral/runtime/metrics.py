"""Gateway metrics in the Prometheus text exposition format.

Written by hand rather than with `prometheus_client`: a handful of counters and two histograms
per model, rendered on request, need no extra dependency or global registry (several gateways
run in one test process).
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from typing import Mapping

#: Histogram bucket upper bounds, seconds.
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last = +Inf
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    """A sample value: integers exactly, other values to full precision."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


#: Failure-handling metrics of a model's router (`ModelRouter.runtime_stats()` keys):
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
    ("unavailable_s", "coral_model_unavailable_seconds_total", "counter",
     "Seconds during which the model had no ready instance."),
    ("ready_instances", "coral_model_ready_instances", "gauge",
     "Instances of the model ready to take requests."),
    ("planned_instances", "coral_model_planned_instances", "gauge",
     "Instances of the model the plan runs."),
)


class GatewayMetrics:
    """Request and token counters and TTFT/TPOT histograms, per model."""

    def __init__(self) -> None:
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

    def render(self, runtime: Mapping[str, Mapping[str, float]] | None = None) -> str:
        """The metrics; `runtime`: each model's router counters (`RUNTIME_METRICS`)."""
        lines: list[str] = []
        runtime = runtime or {}
        with self._lock:
            lines += ["# HELP coral_requests_total Requests by model, endpoint and outcome.",
                      "# TYPE coral_requests_total counter"]
            for (model, endpoint, status), n in sorted(self.requests.items()):
                labels = _labels(model=model, endpoint=endpoint, status=status)
                lines.append(f"coral_requests_total{labels} {n}")
            for name, table, help_ in (
                    ("coral_prompt_tokens_total", self.prompt_tokens, "Prompt tokens processed."),
                    ("coral_generation_tokens_total", self.generation_tokens, "Tokens generated.")):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter"]
                lines += [f"{name}{_labels(model=m)} {n}" for m, n in sorted(table.items())]
            for name, table, help_ in (
                    ("coral_ttft_seconds", self.ttft, "Time to first token."),
                    ("coral_tpot_seconds", self.tpot,
                     "Mean time per output token after the first.")):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
                for model, h in sorted(table.items()):
                    cumulative = 0
                    for bound, count in zip((*h.buckets, float("inf")), h.counts):
                        cumulative += count
                        le = "+Inf" if bound == float("inf") else repr(bound)
                        lines.append(f"{name}_bucket{_labels(model=model, le=le)} {cumulative}")
                    lines.append(f"{name}_sum{_labels(model=model)} {h.total}")
                    lines.append(f"{name}_count{_labels(model=model)} {h.n}")
            reruns = dict(self.reruns)
        # a request is rerun from its prompt by the router (its instance failed before the
        # first token) or by the gateway (after tokens, while nothing had reached the client)
        lines += ["# HELP coral_request_reruns_total Requests run again from their prompt "
                  "after their instance was lost.", "# TYPE coral_request_reruns_total counter"]
        for model in sorted(set(runtime) | set(reruns)):
            before = runtime.get(model, {}).get("retries", 0)
            lines.append(f"coral_request_reruns_total"
                         f"{_labels(model=model, stage='before_first_token')} {_num(before)}")
            lines.append(f"coral_request_reruns_total"
                         f"{_labels(model=model, stage='after_tokens')} {reruns.get(model, 0)}")
        for key, name, kind, help_ in RUNTIME_METRICS:
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{_labels(model=m)} {_num(stats[key])}"
                      for m, stats in sorted(runtime.items()) if key in stats]
        return "\n".join(lines) + "\n"
