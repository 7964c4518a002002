"""One kernel's time from its work: the smoothed roofline plus the fixed cost every kernel has.

    kernel_seconds(compute, memory, fixed) = (compute^p + memory^p)^(1/p) + fixed

`compute` and `memory` are the kernel's FLOPs and bytes at the GPU's achieved rates; `fixed`
is the per-kernel time (`Efficiencies.kernel_overhead_s`). `p` (`ROOFLINE_P`) smooths the
maximum of compute and memory: measured matmuls run slower than either bound near the ridge
point. An element-wise kernel has no FLOPs worth counting: its time is its bytes over the
element-wise bandwidth plus the fixed time.

The fixed time is added, not overlapped with the work (a smoothed maximum of the three): the
overlap model fits the profiles worse (benchmarks/results/history.md, "Perf model 5"), because the
element-wise kernels' floors differ by kernel (Vidur's residual add holds 1-2 µs at a few
tokens, its RMSNorm 4-8 µs) while one fixed time per GPU type stands for all of them.

The calibration (`coral.perf.calibration`), the hold-out (`coral.perf.holdout`) and the perf
model (`coral.perf.model.PerfModel.profiled_ops_seconds`) time kernels through these two
functions; the perf model's layer formula writes the same arithmetic out on the template
builder's hot path.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

#: Exponent of the smoothed maximum of compute and memory time per kernel. Chosen once on
#: the A100-80GB and H100 profiles together with the efficiencies (in-sample squared log
#: error over p in 1.5..4 with tile-padded matmuls: lowest at 2.5) and fixed, so each GPU type
#: has four fitted figures.
ROOFLINE_P = 2.5
_INV_P = 1.0 / ROOFLINE_P

Seconds = TypeVar("Seconds", float, np.ndarray)


def kernel_seconds(compute: Seconds, memory: Seconds, fixed: float) -> Seconds:
    """A kernel's time: smoothed maximum of compute and memory time, plus the fixed time."""
    return (compute**ROOFLINE_P + memory**ROOFLINE_P) ** _INV_P + fixed


def elementwise_seconds(memory: Seconds, fixed: float) -> Seconds:
    """Time of an element-wise kernel of `memory` seconds of traffic."""
    return memory + fixed
