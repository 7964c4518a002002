"""Which catalog GPU type a device name is (torch-free: profile tables record the name)."""

from __future__ import annotations

import re
from typing import Iterable

# Device-name patterns -> catalog GPU type names; first match wins (order matters).
_GPU_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"gh200", "gh200"),
    (r"h200", "h200"),
    (r"h100.*nvl", "h100-nvl"),
    (r"h100.*pcie", "h100-pcie"),
    (r"h100", "h100-sxm"),
    (r"h800", "h800"),
    (r"a100.*80", "a100-80gb"),
    (r"a100.*40", "a100-40gb"),
    (r"a100", "a100-80gb"),
    (r"b200", "b200"),
    (r"l40s", "l40s"),
    (r"l40\b", "l40"),
    (r"a40\b", "a40"),
    (r"a10g", "a10g"),
    (r"a10\b", "a10"),
    (r"\bl4\b", "l4"),
    (r"v100", "v100"),
    (r"\bt4\b", "t4"),
)


def gpu_type_for_device(name: str, known: Iterable[str] | None = None) -> str | None:
    """Catalog GPU type of a CUDA device name ('NVIDIA H100 80GB HBM3' -> 'h100-sxm'), or
    None when it is not recognised (or, given `known`, not in it)."""
    lowered = name.lower()
    for pattern, gpu in _GPU_PATTERNS:
        if re.search(pattern, lowered):
            if known is not None and gpu not in set(known):
                return None
            return gpu
    return None
