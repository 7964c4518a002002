"""Pydantic schema of the catalog: GPU types, node types, regions and models.

Every entry is frozen and refuses unknown fields, so a typo in a user's YAML file is an
error that names the field rather than a silently ignored key. Units live in field names.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

SCHEMA_VERSION = 1

Cloud = Literal["aws", "gcp", "azure", "lambda", "runpod", "other"]
GpuArchitecture = Literal["hopper", "ada", "ampere", "volta", "turing", "blackwell", "other"]


class Entry(BaseModel):
    """Common base: frozen, no unknown fields, finite numbers, lower-case dashed names."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Sourced(Entry):
    """A figure's provenance. `approximate` marks figures that are estimates (`~` in sources)."""

    source: str = Field(min_length=1, description="Where the figure came from (URL or document).")
    date: dt.date | None = Field(default=None, description="When the source was read.")
    approximate: bool = Field(default=False, description="True when the figure is an estimate.")


MemoryKind = Literal["hbm3e", "hbm3", "hbm2e", "hbm2", "gddr6x", "gddr6"]


class SustainedFigures(Sourced):
    """What limits a GPU type under sustained load, beside its datasheet peaks.

    `board_power_w` (TDP) caps the clock a long run of tensor-core work holds; `process` names
    the silicon generation whose energy per tensor FLOP a published measurement fixes;
    `gemm_tflops` is a published dense bf16/fp16 matmul throughput measured under sustained
    load on this GPU type, and `copy_gb_per_s` a measured device-to-device copy bandwidth
    (read + write), when one exists. `coral.perf.sustained` turns them into the fraction of
    each peak the GPU type sustains. `sm_count` (streaming multiprocessors) with the boost clock
    gives the rate at which the SMs can issue element-wise loads and stores, which bounds
    element-wise kernels on HBM cards before DRAM does. `benchmark_gemm_tflops` is one public
    benchmark script's best square-matmul throughput over short runs (tens of ms, as per-layer
    profiles are timed): the ratio of two cards' figures over their peaks carries a donor's
    fitted matmul efficiency to a power-capped borrower like for like.
    """

    board_power_w: float = Field(gt=0, description="Board power (TDP), W.")
    base_clock_mhz: float = Field(gt=0, description="Datasheet base clock, MHz.")
    boost_clock_mhz: float = Field(gt=0, description="Datasheet boost clock, MHz.")
    process: str = Field(min_length=1, description="Silicon process, e.g. 'tsmc-4n'.")
    memory: MemoryKind
    gemm_tflops: float | None = Field(
        default=None, gt=0, description="Measured sustained dense matmul TFLOP/s.")
    copy_gb_per_s: float | None = Field(
        default=None, gt=0, description="Measured device copy bandwidth (read + write), GB/s.")
    sm_count: int | None = Field(
        default=None, gt=0, description="Streaming multiprocessors (datasheet/whitepaper).")
    benchmark_gemm_tflops: float | None = Field(
        default=None, gt=0,
        description="Best dense half-precision matmul TFLOP/s of one public cross-card "
                    "benchmark's short runs; compared only with another card's figure from the "
                    "same benchmark.")


class GpuType(Sourced):
    """One GPU model. Dense (no sparsity) half-precision throughput."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    memory_gb: float = Field(gt=0, description="Device memory, GB (1e9 bytes).")
    bf16_tflops: float = Field(gt=0, description="Dense bf16/fp16 tensor TFLOP/s.")
    mem_bandwidth_gb_per_s: float = Field(gt=0, description="HBM/GDDR bandwidth, GB/s.")
    intra_node_link: Literal["nvlink", "pcie"]
    intra_node_link_gb_per_s: float = Field(gt=0, description="GPU-to-GPU bandwidth per GPU, GB/s.")
    architecture: GpuArchitecture
    sustained: SustainedFigures | None = Field(
        default=None, description="Board power, clocks and measured sustained throughput.")

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


class RegionPrice(Sourced):
    """On-demand price of one node type in one region.

    `spot_usd_per_hour` predates `NodeType.spot_prices` and carries no source of its own;
    `NodeType.spot_price_in` reads it only where `spot_prices` has no entry for the region.
    """

    region: str = Field(min_length=1)
    usd_per_hour: float = Field(gt=0)
    spot_usd_per_hour: float | None = Field(default=None, gt=0)


InterruptionBand = Literal["<5%", "5-10%", "10-15%", "15-20%", ">20%", "5-15%"]
"""Share of spot instances a cloud reclaims per period: the bands of AWS's Spot Instance Advisor
and Azure's eviction rates (per month), and Google Cloud's published 5-15 % (per day)."""

InterruptionPeriod = Literal["month", "day"]
"""The period a band's share is measured over."""

#: Hours in each period: a month is 365 * 24 / 12 hours.
PERIOD_HOURS: dict[str, float] = {"month": 730.0, "day": 24.0}

#: Share each band stands for: its midpoint; the open top band is read as 20-30 %, so its
#: midpoint is 25 %.
BAND_MIDPOINT: dict[str, float] = {
    "<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25,
    "5-15%": 0.10,
}


class Interruption(Sourced):
    """How often a cloud reclaims spot capacity of one pool: a published band, or a stated
    default (`approximate: true`) where the cloud publishes none.

    A band is the share `f` of spot instances reclaimed within one `per` period, not a count
    of events: read as a constant (Poisson) hazard `rate` per node-hour over a period of
    `T` hours, `1 - exp(-rate * T) = f`, so `rate = -ln(1 - f) / T` (`rate_per_hour`). The
    share is the band's midpoint (`BAND_MIDPOINT`).
    """

    band: InterruptionBand
    per: InterruptionPeriod = "month"

    @property
    def share(self) -> float:
        """Share of instances reclaimed within one period (the band's midpoint)."""
        return BAND_MIDPOINT[self.band]

    def rate_per_hour(self) -> float:
        """Preemptions per node-hour that reclaim `share` of the nodes within one period."""
        return -math.log1p(-self.share) / PERIOD_HOURS[self.per]


class SpotPrice(Sourced):
    """Spot (preemptible) price of one node type in one region, with its interruption band
    where one is known for this instance family (else the cloud's default applies)."""

    region: str = Field(min_length=1)
    usd_per_hour: float = Field(gt=0)
    interruption: Interruption | None = None


class CloudSpotTerms(Entry):
    """What a cloud promises about its spot capacity: the notice before it reclaims a node,
    and the interruption band assumed for a pool that has no figure of its own."""

    name: Cloud
    notice_s: float = Field(gt=0, description="Seconds of notice before a spot node is reclaimed.")
    notice_source: str = Field(min_length=1, description="Documentation page of the notice.")
    notice_date: dt.date | None = None
    default_interruption: Interruption


class NodeType(Entry):
    """A rentable GPU configuration: `count` GPUs of one type in one machine."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    gpu: str = Field(min_length=1, description="Name of a GpuType.")
    gpu_count: Literal[1, 2, 4, 8]
    nic_gbps: float = Field(gt=0, description="Network bandwidth to other nodes, Gbit/s.")
    instances: dict[Cloud, str] = Field(
        min_length=1, description="Instance / VM name of this configuration on each cloud."
    )
    prices: list[RegionPrice] = Field(default_factory=list)
    spot_prices: list[SpotPrice] = Field(default_factory=list)

    @field_validator("prices", "spot_prices")
    @classmethod
    def _unique_regions(cls, prices: list[RegionPrice] | list[SpotPrice]
                        ) -> list[RegionPrice] | list[SpotPrice]:
        seen: set[str] = set()
        for price in prices:
            if price.region in seen:
                raise ValueError(f"region {price.region!r} is priced twice")
            seen.add(price.region)
        return prices

    @field_validator("spot_prices")
    @classmethod
    def _spot_below_on_demand(cls, spot_prices: list[SpotPrice], info: ValidationInfo
                              ) -> list[SpotPrice]:
        prices = info.data.get("prices")  # absent when `prices` itself is invalid
        if prices is None:
            return spot_prices
        on_demand = {p.region: p.usd_per_hour for p in prices}
        for i, spot in enumerate(spot_prices):
            if spot.region not in on_demand:
                raise ValueError(
                    f"entry {i}: region {spot.region!r} has a spot price but no on-demand "
                    f"price in 'prices'"
                )
            if spot.usd_per_hour > on_demand[spot.region]:
                raise ValueError(
                    f"entry {i}: {spot.usd_per_hour} $/hour in {spot.region!r} exceeds the "
                    f"on-demand {on_demand[spot.region]} $/hour"
                )
        return spot_prices

    def price_in(self, region: str) -> float | None:
        """$/hour in `region`, or None when the node type is not offered there."""
        for price in self.prices:
            if price.region == region:
                return price.usd_per_hour
        return None

    def spot_price_in(self, region: str) -> float | None:
        """Spot $/hour of the whole node in `region`, or None when no spot price is known."""
        for spot in self.spot_prices:
            if spot.region == region:
                return spot.usd_per_hour
        for price in self.prices:
            if price.region == region:
                return price.spot_usd_per_hour
        return None

    def spot_entry(self, region: str) -> SpotPrice | None:
        """The sourced spot price in `region` (None where there is none)."""
        for spot in self.spot_prices:
            if spot.region == region:
                return spot
        return None


class Region(Entry):
    """A cloud region. Availability is per scenario, not part of the catalog."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    cloud: Cloud
    location: str = Field(min_length=1, description="Human-readable place, e.g. 'N. Virginia'.")


class MoeConfig(Entry):
    """Mixture-of-experts feed-forward layer (every layer is MoE when present)."""

    num_experts: int = Field(gt=0)
    experts_per_token: int = Field(gt=0)
    expert_ffn_size: int = Field(gt=0)
    shared_experts: int = Field(default=0, ge=0)
    shared_expert_ffn_size: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "MoeConfig":
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) exceeds num_experts "
                f"({self.num_experts})"
            )
        if self.shared_experts and not self.shared_expert_ffn_size:
            raise ValueError("shared_experts > 0 needs shared_expert_ffn_size > 0")
        return self


AttentionKind = Literal["full", "sliding"]
"""A layer's attention: over the whole context, or over the last `sliding_window` tokens."""

#: Bits one stored routed-expert weight takes in each checkpoint format, block scales included:
#: MXFP4 (OCP Microscaling) packs 32 4-bit E2M1 values with one 8-bit E8M0 scale,
#: (32 x 4 + 8) / 32 = 4.25 bits.
EXPERT_WEIGHT_BITS: dict[str, float] = {"mxfp4": 4.25}
ExpertWeightFormat = Literal["mxfp4"]


class ModelArch(Sourced):
    """A model's architecture, as in its published config.json.

    Attention layers follow `attention_pattern`, repeated from layer 0 (config.json
    `layer_types`): a `sliding` layer attends to, reads and stores at most the last
    `sliding_window` tokens of each sequence. `attention_sinks` adds one learned logit per
    head to each layer's softmax (GPT-OSS): `num_heads` parameters a layer and one more column
    in the softmax, which no cost here counts. `expert_weight_format` names how a checkpoint
    stores its routed experts' weights when not in `dtype_bytes` (GPT-OSS: MXFP4); every other
    weight, and the KV cache, stay at `dtype_bytes`.
    """

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    hf_id: str = Field(min_length=1, description="Hugging Face repository id.")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    ffn_size: int = Field(gt=0, description="Dense MLP intermediate size (unused when MoE).")
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    gated_mlp: bool = True
    tied_embeddings: bool = False
    moe: MoeConfig | None = None
    dtype_bytes: int = Field(default=2, gt=0)
    sliding_window: int | None = Field(
        default=None, gt=0, description="Tokens a sliding-window layer attends to.")
    attention_pattern: tuple[AttentionKind, ...] = Field(
        default=("full",), min_length=1,
        description="Attention kind of layers 0, 1, ..., repeated over the layers.")
    attention_sinks: bool = False
    expert_weight_format: ExpertWeightFormat | None = Field(
        default=None, description="Storage format of the routed experts' weights (MoE only).")

    @model_validator(mode="after")
    def _check_attention(self) -> "ModelArch":
        slides = "sliding" in self.attention_pattern
        if slides and self.sliding_window is None:
            raise ValueError(
                "attention_pattern has 'sliding' layers but sliding_window is not set; give "
                "sliding_window (config.json 'sliding_window')")
        if self.sliding_window is not None and not slides:
            raise ValueError(
                f"sliding_window ({self.sliding_window}) is set but attention_pattern has no "
                "'sliding' layer; add them to attention_pattern or drop sliding_window")
        if self.expert_weight_format is not None and self.moe is None:
            raise ValueError("expert_weight_format applies to MoE models only (no 'moe' block)")
        return self

    @field_validator("num_kv_heads")
    @classmethod
    def _check_heads(cls, num_kv_heads: int, info: ValidationInfo) -> int:
        num_heads = info.data.get("num_heads")  # absent when num_heads itself is invalid
        if num_heads is not None and num_heads % num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})"
            )
        return num_kv_heads

    # ---- derived sizes (parameters per layer, elements) ----
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h

    @property
    def _mlp_mats(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def dense_mlp_params_per_layer(self) -> int:
        return self._mlp_mats * self.hidden_size * self.ffn_size

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (0 for dense models)."""
        return self._mlp_mats * self.hidden_size * self.moe.expert_ffn_size if self.moe else 0

    @property
    def mlp_params_per_layer(self) -> int:
        """All feed-forward parameters stored in one layer (every expert)."""
        if self.moe is None:
            return self.dense_mlp_params_per_layer
        m = self.moe
        shared = m.shared_experts * self._mlp_mats * self.hidden_size * m.shared_expert_ffn_size
        router = self.hidden_size * m.num_experts
        return m.num_experts * self.expert_params + shared + router

    @property
    def active_mlp_params_per_layer(self) -> int:
        """Feed-forward parameters one token passes through (active experts only)."""
        if self.moe is None:
            return self.dense_mlp_params_per_layer
        m = self.moe
        shared = m.shared_experts * self._mlp_mats * self.hidden_size * m.shared_expert_ffn_size
        return m.experts_per_token * self.expert_params + shared + self.hidden_size * m.num_experts

    @property
    def sink_params_per_layer(self) -> int:
        """Attention sinks: one learned logit per head (0 without sinks)."""
        return self.num_heads if self.attention_sinks else 0

    @property
    def params_per_layer(self) -> int:
        return (self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden_size
                + self.sink_params_per_layer)

    @property
    def active_params_per_layer(self) -> int:
        return (self.attn_params_per_layer + self.active_mlp_params_per_layer
                + 2 * self.hidden_size + self.sink_params_per_layer)

    # ---- attention pattern ----
    def layer_is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) attends over a sliding window."""
        return self.attention_pattern[layer % len(self.attention_pattern)] == "sliding"

    def sliding_layers_in(self, first_layer: int, layers: int) -> int:
        """Sliding-window layers among `layers` consecutive layers from `first_layer`."""
        return sum(self.layer_is_sliding(i) for i in range(first_layer, first_layer + layers))

    @property
    def sliding_layer_share(self) -> float:
        """Fraction of the model's layers that slide (0.0 when none do)."""
        if "sliding" not in self.attention_pattern:
            return 0.0
        return self.sliding_layers_in(0, self.num_layers) / self.num_layers

    def kv_tokens_stored(self, layer: int, context_tokens: int) -> int:
        """KV-cache tokens layer `layer` keeps for one sequence of `context_tokens` tokens."""
        if self.sliding_window is not None and self.layer_is_sliding(layer):
            return min(context_tokens, self.sliding_window)
        return context_tokens

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied) plus the final norm."""
        mats = 1 if self.tied_embeddings else 2
        return mats * self.vocab_size * self.hidden_size + self.hidden_size

    @property
    def total_params(self) -> int:
        return self.num_layers * self.params_per_layer + self.embedding_params

    @property
    def active_params(self) -> int:
        return self.num_layers * self.active_params_per_layer + self.embedding_params

    # ---- derived bytes ----
    @property
    def expert_weight_bits(self) -> float:
        """Bits one routed-expert weight takes as the checkpoint stores it."""
        if self.expert_weight_format is None:
            return 8.0 * self.dtype_bytes
        return EXPERT_WEIGHT_BITS[self.expert_weight_format]

    @property
    def routed_expert_params_per_layer(self) -> int:
        """Parameters of one layer's routed experts, all of them (0 for dense models)."""
        return self.moe.num_experts * self.expert_params if self.moe else 0

    def weight_bytes_per_layer_at(self, expert_bits: float) -> float:
        """Bytes of one layer's weights with routed experts held at `expert_bits` bits each."""
        routed = self.routed_expert_params_per_layer
        return ((self.params_per_layer - routed) * self.dtype_bytes
                + routed * expert_bits / 8.0)

    @property
    def weight_bytes_per_layer(self) -> int | float:
        """Bytes of one layer's weights as the checkpoint stores them."""
        if self.expert_weight_format is None:
            return self.params_per_layer * self.dtype_bytes
        return self.weight_bytes_per_layer_at(self.expert_weight_bits)

    @property
    def embedding_bytes(self) -> int:
        return self.embedding_params * self.dtype_bytes

    @property
    def weight_bytes(self) -> int | float:
        if self.expert_weight_format is None:
            return self.total_params * self.dtype_bytes
        return self.num_layers * self.weight_bytes_per_layer + self.embedding_bytes

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return 2 * self.kv_dim * self.dtype_bytes

    @property
    def activation_bytes_per_token(self) -> int:
        """Hidden state passed between pipeline stages, per token."""
        return self.hidden_size * self.dtype_bytes
