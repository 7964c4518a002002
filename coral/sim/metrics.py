"""Summaries of a simulation: latency percentiles, SLO attainment, goodput, utilisation, $.

A request meets its SLO when it finished with TTFT <= the model's `ttft_s` and TPOT <=
`tpot_s`; unfinished and rejected requests meet nothing. The planner states its targets at a
percentile (`SloSpec.percentile`), so `slo_met` per model asks whether the TTFT and TPOT at
that percentile (over every request of the model, unfinished ones counting as infinitely
late) are within the targets.

Prefill/decode-disaggregated requests are measured as `coral.sim.pd` says (TTFT at the
prefill instance; the KV transfer and the wait for a decode slot inside TPOT); the summary
adds their transfer times and the mean utilisation of each role's nodes.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from coral.sim.results import RequestResult, SimResult
from coral.templates.slo import SloSpec

PERCENTILES = (50, 90, 99)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = float(np.percentile(np.asarray(values, dtype=float), q, method="higher"))
    return v if math.isfinite(v) else None


def _meets(r: RequestResult, slo: SloSpec | None) -> bool:
    if r.status != "done":
        return False
    if slo is None:
        return True
    return r.ttft_s <= slo.ttft_s + 1e-12 and r.tpot_s <= slo.tpot_s + 1e-12


def summarize(result: SimResult, slos: Mapping[str, SloSpec], *,
              duration_s: float | None = None) -> dict[str, Any]:
    """The run's figures as plain JSON values.

    Rates divide by `duration_s` when given, else by the time of the last completion.
    """
    reqs = result.requests
    ends = [r.end_s for r in reqs if r.end_s is not None]
    span = duration_s if duration_s is not None else (max(ends) if ends else 0.0)
    span = span if span > 0 else float("nan")
    done = [r for r in reqs if r.status == "done"]
    good = [r for r in reqs if _meets(r, slos.get(r.model))]

    def lat(rs: list[RequestResult], attr: str) -> list[float]:
        return [getattr(r, attr) if r.status == "done" else math.inf for r in rs]

    out: dict[str, Any] = {
        "requests": len(reqs),
        "completed": len(done),
        "unfinished": sum(r.status == "unfinished" for r in reqs),
        "rejected": sum(r.status == "rejected" for r in reqs),
        "span_s": span,
        "slo_attainment": len(good) / len(reqs) if reqs else None,
        "goodput_tokens_per_s": sum(r.output_tokens for r in good) / span,
        "goodput_rps": len(good) / span,
        "throughput_tokens_per_s": sum(r.output_tokens for r in done) / span,
        "throughput_rps": len(done) / span,
        "cost_per_hour": sum(i.usd_per_hour for i in result.instances),
    }
    for name in ("ttft", "tpot"):
        vals = lat(reqs, f"{name}_s")
        for q in PERCENTILES:
            out[f"{name}_p{q}"] = _pct(vals, q)
    models: dict[str, Any] = {}
    for m in sorted({r.model for r in reqs}):
        rs = [r for r in reqs if r.model == m]
        slo = slos.get(m)
        q = 100.0 * (slo.percentile if slo else 0.9)
        ttft_q, tpot_q = _pct(lat(rs, "ttft_s"), q), _pct(lat(rs, "tpot_s"), q)
        models[m] = {
            "requests": len(rs),
            "percentile": q,
            "ttft_s_at_percentile": ttft_q,
            "tpot_s_at_percentile": tpot_q,
            "ttft_target_s": slo.ttft_s if slo else None,
            "tpot_target_s": slo.tpot_s if slo else None,
            "slo_met": bool(slo is not None and ttft_q is not None and tpot_q is not None
                            and ttft_q <= slo.ttft_s and tpot_q <= slo.tpot_s),
            "slo_attainment": sum(_meets(r, slo) for r in rs) / len(rs),
            "goodput_tokens_per_s": sum(r.output_tokens for r in rs if _meets(r, slo)) / span,
        }
    out["models"] = models
    util: dict[str, float] = {}
    by_role: dict[str, list[float]] = {}
    for n in result.nodes:
        u = util[f"{n.instance}/stage{n.stage}/{n.node_type}"] = n.busy_s / span
        by_role.setdefault(n.role, []).append(u)
    out["utilisation"] = util
    out["mean_utilisation"] = float(np.mean(list(util.values()))) if util else None
    out["mean_utilisation_by_role"] = {r: float(np.mean(v)) for r, v in sorted(by_role.items())}
    transfers = [r.transfer_s for r in reqs if r.transfer_s is not None]
    out["kv_transfers"] = len(transfers)
    for q in PERCENTILES:
        out[f"kv_transfer_s_p{q}"] = _pct(transfers, q)
    out["events"] = result.events
    out["steps"] = result.steps
    return out


REQUEST_COLUMNS = ("id", "model", "instance", "status", "arrival_s", "first_token_s", "ttft_s",
                   "tpot_s", "end_s", "prompt_tokens", "output_tokens", "preemptions",
                   "decode_instance", "transfer_s")


def request_rows(result: SimResult) -> list[tuple[Any, ...]]:
    """One row per request, in REQUEST_COLUMNS order (`instance` is where the prompt ran;
    `decode_instance` and `transfer_s` are empty / None unless it was handed to one)."""
    return [(r.id, r.model, r.instance, r.status, r.arrival_s, r.first_token_s, r.ttft_s,
             r.tpot_s, r.end_s, r.prompt_tokens, r.output_tokens, r.preemptions,
             r.decode_instance, r.transfer_s)
            for r in result.requests]
