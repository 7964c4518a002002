"""The perf model's memory queries: what a stage's weights take, what a token of context takes
in the KV cache, and how many tokens of it fit beside the weights.

A mixin of `coral.perf.model.PerfModel`: the queries read the same per-(model, node) constants
as its iteration times (`_consts`), so that a template's memory and its times describe one
deployment (tensor-parallel KV heads, the GPU type's expert precision, sliding windows).
"""

from __future__ import annotations

from typing import Any

from coral.catalog.schema import ModelArch, NodeType
from coral.perf.sliding import WINDOW_SEQUENCES, window_capacity_tokens

#: Fraction of a node's memory kept free for activations, workspace and allocator slack
#: (vLLM's default gpu_memory_utilization is 0.9).
MEMORY_RESERVE_FRACTION = 0.10


class MemoryQueries:
    """Memory of model layers on node types; needs `catalog` and `_consts(model, node)`."""

    catalog: Any

    def _consts(self, model: str | ModelArch, node: str | NodeType) -> Any:
        """The per-(model, node) constants (`coral.perf.model.PerfModel._consts`)."""
        raise NotImplementedError("MemoryQueries is mixed into a class that defines _consts")

    def stage_weight_bytes(
        self,
        model: str | ModelArch,
        layers: int,
        *,
        first_stage: bool = False,
        last_stage: bool = False,
        node: str | NodeType | None = None,
    ) -> float:
        """Bytes of weights a stage of `layers` layers holds (every expert of an MoE counts),
        plus the input embedding on the first stage and the final norm + LM head on the last.
        Routed experts stored in a 4-bit format count as the checkpoint holds them, or, given
        `node`, as its GPU type serves them (`coral.perf.precision`)."""
        arch = self.catalog.model(model) if isinstance(model, str) else model
        if node is not None and arch.expert_weight_format is not None:
            bits = self._consts(arch, node).expert_bits
            total = float(layers * arch.weight_bytes_per_layer_at(bits))
        else:
            total = float(layers * arch.weight_bytes_per_layer)
        if first_stage:
            total += arch.vocab_size * arch.hidden_size * arch.dtype_bytes
        if last_stage:
            lm = 0 if arch.tied_embeddings and first_stage else arch.vocab_size * arch.hidden_size
            total += (lm + arch.hidden_size) * arch.dtype_bytes
        return total

    def kv_bytes_per_token(
        self, model: str | ModelArch, node: str | NodeType, layers: int
    ) -> float:
        """KV-cache bytes one more token of context takes over `layers` layers on the whole
        node (KV heads are replicated when the node has more GPUs than the model has KV
        heads). Sliding-window layers keep at most their window of each sequence, so past it
        only the full-attention layers (the model's share of them) grow; the windows are held
        aside (`window_kv_bytes`)."""
        k = self._consts(model, node)
        per_token = layers * k.tp * 2.0 * k.coef.kv_dim_per_gpu * k.dt
        if k.coef.sliding_share:
            return per_token * (1.0 - k.coef.sliding_share)
        return per_token

    def window_kv_bytes(
        self, model: str | ModelArch, node: str | NodeType, layers: int
    ) -> float:
        """KV-cache bytes of one sequence's full windows in the sliding layers among `layers`
        layers on the whole node (0 for a model without them)."""
        k = self._consts(model, node)
        return (layers * k.coef.sliding_share * k.tp * 2.0 * k.coef.kv_dim_per_gpu * k.dt
                * k.coef.window)

    def max_kv_tokens(
        self,
        model: str | ModelArch,
        node: str | NodeType,
        layers: int,
        *,
        first_stage: bool = False,
        last_stage: bool = False,
    ) -> int:
        """KV-cache tokens that fit on the node after `layers` layers of weights, keeping
        MEMORY_RESERVE_FRACTION of its memory for activations and workspace (0 if none fit).

        With sliding-window layers the windows of WINDOW_SEQUENCES sequences are held aside
        (`coral.perf.sliding.window_capacity_tokens`)."""
        k = self._consts(model, node)
        usable = self.catalog.node_memory_bytes(k.node) * (1.0 - MEMORY_RESERVE_FRACTION)
        free = usable - self.stage_weight_bytes(
            k.model, layers, first_stage=first_stage, last_stage=last_stage, node=k.node
        )
        if free <= 0:
            return 0
        if not k.coef.sliding_share:
            return int(free // self.kv_bytes_per_token(model, node, layers))
        return window_capacity_tokens(free, self.kv_bytes_per_token(model, node, layers),
                                      self.window_kv_bytes(model, node, layers),
                                      k.coef.window, WINDOW_SEQUENCES)

    def fits(
        self,
        model: str | ModelArch,
        node: str | NodeType,
        layers: int,
        *,
        first_stage: bool = False,
        last_stage: bool = False,
    ) -> bool:
        """True when `layers` layers' weights fit with the reserve and room for >= 1 KV token."""
        return (
            self.max_kv_tokens(
                model, node, layers, first_stage=first_stage, last_stage=last_stage
            )
            >= 1
        )

    def max_layers(
        self,
        model: str | ModelArch,
        node: str | NodeType,
        *,
        first_stage: bool = False,
        last_stage: bool = False,
    ) -> int:
        """Most layers of `model` that fit on the node (0 when not even one does)."""
        k = self._consts(model, node)
        lo, hi = 0, k.num_layers
        while lo < hi:  # fits() is monotone in layers
            mid = (lo + hi + 1) // 2
            if self.fits(model, node, mid, first_stage=first_stage, last_stage=last_stage):
                lo = mid
            else:
                hi = mid - 1
        return lo
