"""The precision a GPU type serves a model's routed-expert weights in.

A checkpoint whose experts are stored in a block-scaled 4-bit format (GPT-OSS: MXFP4,
`ModelArch.expert_weight_format`) is served as stored where vLLM has a kernel for it, and from a
bf16 copy elsewhere. What vLLM supports (vllm-project/vllm,
vllm/model_executor/layers/quantization/mxfp4.py, read 2026-12-06): `Mxfp4Config` needs compute
capability 8.0 (`get_min_capability() == 80`); its MoE backend is FlashInfer on Blackwell (SM100),
OpenAI's Triton kernels or FlashInfer's MXFP4 x BF16 on Hopper (SM90), and the Marlin MXFP4 kernel
(weight-only: 4-bit weights, bf16 activations) below SM90, i.e. Ampere (A100 SM80, A10G SM86)
and Ada (L4, L40S SM89). vLLM's GPT-OSS recipe (vllm-project/recipes, OpenAI/GPT-OSS.md) says
the same of Ampere: "GPT-OSS works on Ampere devices by default, using the TRITON_ATTN attention
backend and Marlin MXFP4 MoE". Volta and Turing (SM70, SM75) are below the minimum: there the
experts are counted at the model's `dtype_bytes` (a dequantised bf16 copy).

Every backend on these GPU types multiplies bf16 activations (Marlin and Triton dequantise the
weights in the kernel; Blackwell's optional MXFP8 activations are not modelled), so the matmuls'
compute runs at the bf16 rate and only the bytes held and read shrink. Attention, router,
embeddings and LM head stay bf16 (the checkpoint's `modules_to_not_convert`).
"""

from __future__ import annotations

from coral.catalog.schema import GpuType, ModelArch

#: GPU architectures on which vLLM serves MXFP4 experts as stored (compute capability >= 8.0).
MXFP4_ARCHITECTURES: frozenset[str] = frozenset({"ampere", "ada", "hopper", "blackwell"})

#: Architectures that hold each stored expert format as is.
NATIVE_ARCHITECTURES: dict[str, frozenset[str]] = {"mxfp4": MXFP4_ARCHITECTURES}


def expert_weight_bits(arch: ModelArch, gpu: GpuType) -> float:
    """Bits one routed-expert weight of `arch` takes on `gpu`, as held and as read: the
    checkpoint's format where the serving engine runs it, else the model's `dtype_bytes`."""
    fmt = arch.expert_weight_format
    if fmt is None or gpu.architecture not in NATIVE_ARCHITECTURES[fmt]:
        return 8.0 * arch.dtype_bytes
    return arch.expert_weight_bits
