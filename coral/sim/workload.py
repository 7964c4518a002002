"""Workloads for the simulator: seeded request generators and trace readers.

A workload is a list of `Request`s sorted by arrival. Arrivals are Poisson (exponential gaps)
or Gamma (gaps with a chosen coefficient of variation: 1 is Poisson, above 1 is bursty);
lengths are fixed, lognormal around a mean, or sampled from a trace. Two trace formats are
read:

- the Azure LLM inference trace (`TIMESTAMP, ContextTokens, GeneratedTokens`, timestamps as
  date-times or seconds);
- the processed form (`arrived_at, num_prefill_tokens, num_decode_tokens`, seconds from the
  first request), as in `coral/sim/data/`.

`rate_rps` on a reader rescales the arrival times so that the trace runs at that mean rate.
Every generator takes its seed from its arguments; nothing reads global random state.
"""

from __future__ import annotations

import csv
import gc
import math
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Iterator, Literal, NamedTuple, Sequence

import numpy as np

from coral.errors import CoralError

#: Column names of the two trace formats (case-sensitive, as published).
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
PROCESSED_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")

#: A small sample of the processed Azure conversation trace shipped with the package.
SAMPLE_TRACE = Path(__file__).with_name("data") / "azure_conv_sample.csv"


class WorkloadError(CoralError, ValueError):
    """A workload parameter or a trace file is invalid."""


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of small acyclic objects are built
    (requests, or the simulator's per-request state): it would only rescan them, again and
    again as they pile up, which took most of the time. Reference counting still frees
    everything; the collector resumes as it was."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class Request(NamedTuple):
    """One inference request.

    Immutable like a frozen dataclass, but a named tuple: an hour of a large deployment is
    millions of requests, and a frozen dataclass's `__init__` (one `object.__setattr__` per
    field) made building them take longer than simulating them."""

    id: int  # unique within a workload, in arrival order
    model: str
    arrival_s: float  # seconds from the start of the run
    prompt_tokens: int  # >= 1
    output_tokens: int  # >= 1, the first token included


@dataclass(frozen=True)
class TraceRow:
    """One row of a trace: arrival time and lengths."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def _requests(rows: Iterator[tuple[int, str, float, int, int]]) -> list[Request]:
    """`[Request(*row) for row in rows]`, built in C (`Request._make` less its length check,
    as every row has the five fields)."""
    return list(map(tuple.__new__, repeat(Request), rows))


# ---------------------------------------------------------------------------------------------
# Arrivals and lengths
# ---------------------------------------------------------------------------------------------


def arrival_times(rate_rps: float, duration_s: float, *, seed: int,
                  process: Literal["poisson", "gamma"] = "poisson", cv: float = 1.0) -> np.ndarray:
    """Arrival times in [0, duration_s) at mean `rate_rps`.

    Gamma gaps have shape `1 / cv**2` and mean `1 / rate_rps`, so their coefficient of
    variation is `cv` (cv = 1 is Poisson; cv > 1 bursty).
    """
    if not rate_rps > 0:
        raise WorkloadError(f"rate must be > 0 requests/s, got {rate_rps!r}")
    if not duration_s > 0:
        raise WorkloadError(f"duration must be > 0 s, got {duration_s!r}")
    if process not in ("poisson", "gamma"):
        raise WorkloadError(f"unknown arrival process {process!r}; valid: 'poisson', 'gamma'")
    if process == "gamma" and not cv > 0:
        raise WorkloadError(f"cv must be > 0 for Gamma arrivals, got {cv!r}")
    rng = np.random.default_rng(seed)
    mean_gap = 1.0 / rate_rps
    n = max(16, int(rate_rps * duration_s * 1.2 + 10 * math.sqrt(rate_rps * duration_s) + 16))
    times = np.empty(0)
    last = 0.0
    chunks = []
    while last < duration_s:
        if process == "poisson" or cv == 1.0:
            gaps = rng.exponential(mean_gap, n)
        else:
            shape = 1.0 / cv**2
            gaps = rng.gamma(shape, mean_gap / shape, n)
        t = last + np.cumsum(gaps)
        chunks.append(t)
        last = float(t[-1])
    times = np.concatenate(chunks)
    return times[times < duration_s]


def lengths(n: int, *, seed: int, mean: float,
            dist: Literal["fixed", "lognormal"] = "fixed", sigma: float = 0.5,
            max_tokens: int = 32768) -> np.ndarray:
    """`n` token counts: all `mean`, or lognormal with that mean and log-std `sigma`."""
    if not mean >= 1:
        raise WorkloadError(f"mean length must be >= 1 token, got {mean!r}")
    if dist == "fixed":
        return np.full(n, int(round(mean)), dtype=np.int64)
    if dist != "lognormal":
        raise WorkloadError(f"unknown length distribution {dist!r}; valid: 'fixed', 'lognormal'")
    rng = np.random.default_rng(seed)
    mu = math.log(mean) - sigma**2 / 2.0
    x = np.rint(rng.lognormal(mu, sigma, n)).astype(np.int64)
    return np.clip(x, 1, max_tokens)


def synthetic(model: str, *, rate_rps: float, duration_s: float, seed: int,
              prompt_tokens: float = 1024, output_tokens: float = 256,
              length_dist: Literal["fixed", "lognormal"] = "fixed", sigma: float = 0.5,
              process: Literal["poisson", "gamma"] = "poisson", cv: float = 1.0,
              first_id: int = 0) -> list[Request]:
    """Requests for one model with generated arrivals and lengths."""
    t = arrival_times(rate_rps, duration_s, seed=seed, process=process, cv=cv)
    p = lengths(len(t), seed=seed + 1, mean=prompt_tokens, dist=length_dist, sigma=sigma)
    o = lengths(len(t), seed=seed + 2, mean=output_tokens, dist=length_dist, sigma=sigma)
    # tolist() gives the same Python floats and ints as float(t[i]), int(p[i]), in C
    with gc_paused():
        return _requests(zip(range(first_id, first_id + len(t)), repeat(model), t.tolist(),
                             p.tolist(), o.tolist()))


# ---------------------------------------------------------------------------------------------
# Trace files
# ---------------------------------------------------------------------------------------------


def _parse_time(text: str, path: Path, row: int) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = text.strip()
        if "." in stamp:  # Azure writes 7 fractional digits; Python reads at most 6
            head, frac = stamp.split(".", 1)
            stamp = f"{head}.{frac[:6]}"
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        raise WorkloadError(
            f"{path}, row {row}, column TIMESTAMP: {text!r} is neither seconds nor a date-time"
        ) from None


def _parse_int(text: str, path: Path, row: int, column: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError(f"{path}, row {row}, column {column}: {text!r} is not a number") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise WorkloadError(
            f"{path}, row {row}, column {column}: expected a whole number of tokens >= 1, "
            f"got {text!r}")
    return int(value)


def read_trace(path: str | Path, *, limit: int | None = None) -> list[TraceRow]:
    """Rows of an Azure or processed trace, arrival times from 0, sorted by arrival.

    The format is told by the header. Raises `WorkloadError` naming the file, row (1-based,
    header = row 1) and column of the first bad value.
    """
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"trace file {path} does not exist")
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise WorkloadError(f"{path}: empty file (expected a header)") from None
        for cols in (PROCESSED_COLUMNS, AZURE_COLUMNS):
            if all(c in header for c in cols):
                break
        else:
            raise WorkloadError(
                f"{path}: header {header} has neither the processed columns "
                f"{list(PROCESSED_COLUMNS)} nor the Azure columns {list(AZURE_COLUMNS)}")
        it, ip, io = (header.index(c) for c in cols)
        rows: list[TraceRow] = []
        for n, rec in enumerate(reader, start=2):
            if not rec or all(not x.strip() for x in rec):
                continue
            if len(rec) < len(header):
                raise WorkloadError(f"{path}, row {n}: {len(rec)} fields, expected {len(header)}")
            t = _parse_time(rec[it], path, n) if cols is AZURE_COLUMNS else None
            if t is None:
                try:
                    t = float(rec[it])
                except ValueError:
                    raise WorkloadError(
                        f"{path}, row {n}, column {cols[0]}: {rec[it]!r} is not a number") from None
            if not math.isfinite(t):
                raise WorkloadError(f"{path}, row {n}, column {cols[0]}: {rec[it]!r} is not finite")
            rows.append(TraceRow(t, _parse_int(rec[ip], path, n, cols[1]),
                                 _parse_int(rec[io], path, n, cols[2])))
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise WorkloadError(f"{path}: no requests after the header")
    rows.sort(key=lambda r: r.arrival_s)
    t0 = rows[0].arrival_s
    return [TraceRow(r.arrival_s - t0, r.prompt_tokens, r.output_tokens) for r in rows]


def trace_requests(path: str | Path, model: str, *, rate_rps: float | None = None,
                   duration_s: float | None = None, limit: int | None = None,
                   first_id: int = 0, rows: Sequence[TraceRow] | None = None
                   ) -> list[Request]:
    """Requests replayed from a trace file; `rate_rps` rescales arrivals to that mean rate,
    `duration_s` keeps those arriving before it. `rows`: the file already read
    (`read_trace`), for callers replaying one trace for several models."""
    rows = read_trace(path, limit=limit) if rows is None else rows
    scale = _time_scale(rows, rate_rps, path)
    out = []
    for r in rows:
        t = r.arrival_s * scale
        if duration_s is not None and t >= duration_s:
            break
        out.append(Request(first_id + len(out), model, t, r.prompt_tokens, r.output_tokens))
    return out


def _time_scale(rows: Sequence[TraceRow], rate_rps: float | None, path: str | Path) -> float:
    """What `trace_requests` multiplies arrival times by for a mean rate of `rate_rps`."""
    if rate_rps is None:
        return 1.0
    if not rate_rps > 0:
        raise WorkloadError(f"rate must be > 0 requests/s, got {rate_rps!r}")
    span = rows[-1].arrival_s
    if len(rows) < 2 or span <= 0:
        raise WorkloadError(f"{path}: cannot rescale a trace that spans no time")
    return (len(rows) - 1) / span / rate_rps


def trace_span_s(path: str | Path, *, rate_rps: float | None = None,
                 limit: int | None = None, rows: Sequence[TraceRow] | None = None) -> float:
    """Seconds from a trace's first arrival to its last once `trace_requests` rescales it to
    `rate_rps`: a replay longer than this has no requests after it (a trace is replayed once).
    `rows`: the file already read."""
    rows = read_trace(path, limit=limit) if rows is None else rows
    return rows[-1].arrival_s * _time_scale(rows, rate_rps, path)


def merge(*workloads: Sequence[Request]) -> list[Request]:
    """Several models' workloads as one, by (arrival, model, id), with ids renumbered in
    that order. The sort runs in numpy, on columns: model names by their rank, which orders
    them as Python compares strings, and stably, as `sorted` is."""
    allr = [r for w in workloads for r in w]
    n = len(allr)
    if not n:
        return []
    with gc_paused():
        ids, models, times, prompts, outputs = (list(map(itemgetter(k), allr))
                                                for k in range(len(Request._fields)))
        rank = {m: k for k, m in enumerate(sorted(set(models)))}
        order = np.lexsort((np.array(ids, dtype=np.int64),
                            np.fromiter(map(rank.__getitem__, models), np.int64, n),
                            np.array(times, dtype=np.float64))).tolist()
        return _requests(zip(
            range(n), map(models.__getitem__, order), map(times.__getitem__, order),
            map(prompts.__getitem__, order), map(outputs.__getitem__, order)))
