"""Write the BurstGPT stand-in trace shipped as coral/sim/data/burstgpt_standin.csv.

BurstGPT (HPMLL/BurstGPT) keeps its trace CSVs in Git LFS, so no copy is shipped here. The
paper's setups replay it for Qwen3-32B and Llama-3 70B; this script builds a stand-in from
what the BurstGPT publication and its public dataset card state, and every output that uses it
says "stand-in":

- Lengths: the public dataset card (huggingface.co/datasets/lzzmm/BurstGPT, viewer, first rows
  of BurstGPT_1.csv) shows 33 ChatGPT/GPT-4 conversation-log rows, one of them a failure (0
  request and 0 response tokens). `PUBLISHED_ROWS` holds the other 32 (request, response)
  pairs; the stand-in draws lengths from lognormals with their mean and coefficient of
  variation, clipped to [1, 8192] tokens.
- Arrivals: the BurstGPT paper models request inter-arrival times with Gamma distributions
  burstier than Poisson and scales the average rate to the experiment; no fitted shape could be
  read here, so `ARRIVAL_CV` (sqrt 2, Gamma shape 0.5) is our choice, at 1 request/s (a
  scenario rescales the rate to its demand).

Run: `python benchmarks/burstgpt_standin.py` (deterministic: seed 0).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

#: (request tokens, response tokens) of the non-failed rows the dataset card shows.
PUBLISHED_ROWS: tuple[tuple[int, int], ...] = (
    (472, 18), (1087, 230), (417, 276), (1360, 647), (185, 215), (586, 293), (37, 1656),
    (54, 503), (1528, 414), (89, 370), (549, 362), (172, 69), (969, 206), (97, 137),
    (1574, 501), (253, 239), (23, 344), (509, 207), (387, 349), (733, 180), (1305, 477),
    (17, 382), (601, 557), (1327, 239), (1437, 181), (1336, 245), (19, 440), (92, 95),
    (507, 448), (938, 263), (1544, 608), (1840, 378),
)
#: Coefficient of variation of the inter-arrival gaps (Gamma shape 1 / CV^2 = 0.5).
ARRIVAL_CV = math.sqrt(2.0)
REQUESTS = 1800
RATE_RPS = 1.0
MAX_TOKENS = 8192
OUT = Path(__file__).resolve().parents[1] / "coral" / "sim" / "data" / "burstgpt_standin.csv"


def lognormal(rng: np.random.Generator, values: np.ndarray, n: int) -> np.ndarray:
    """`n` draws from the lognormal with the mean and CV of `values`, clipped and rounded."""
    mean, cv = float(values.mean()), float(values.std() / values.mean())
    sigma = math.sqrt(math.log1p(cv * cv))
    mu = math.log(mean) - sigma * sigma / 2
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, MAX_TOKENS).astype(int)


def main() -> None:
    rng = np.random.default_rng(0)
    rows = np.array(PUBLISHED_ROWS, dtype=float)
    prompts = lognormal(rng, rows[:, 0], REQUESTS)
    outputs = lognormal(rng, rows[:, 1], REQUESTS)
    shape = 1.0 / ARRIVAL_CV ** 2
    gaps = rng.gamma(shape, 1.0 / (shape * RATE_RPS), REQUESTS - 1)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps)])
    with OUT.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        for t, p, o in zip(arrivals, prompts, outputs):
            w.writerow([f"{t:.3f}", int(p), int(o)])
    print(f"{OUT}: {REQUESTS} requests over {arrivals[-1]:.0f} s; prompt mean "
          f"{prompts.mean():.0f}, output mean {outputs.mean():.0f}")


if __name__ == "__main__":
    main()
