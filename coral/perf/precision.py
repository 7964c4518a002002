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

The kernels want whole tiles, so `Mxfp4MoEMethod.create_weights` allocates the experts padded
(same file; identical at commits 007d5005 and afdb4a4f): Marlin rounds each GPU's share of the
expert FFN width up to a multiple of 128 and the hidden size up to 256 (GPT-OSS: 2880 -> 2944
and 3072, 9 % more expert bytes on one GPU, 14 % with 2 to 8), OpenAI's Triton kernels on Hopper
round the FFN share up to 64 (2880 / 8 = 360 -> 384). The padded weights are held and streamed,
so they count in the bytes (not in the FLOPs, which the decode batches this matters for do
not bind on).

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

#: (FFN width per GPU, hidden size) multiples the MXFP4 MoE kernel pads expert weights to, by
#: architecture: Marlin below Hopper, OpenAI's Triton kernels on Hopper, FlashInfer on
#: Blackwell (vLLM's defaults).
MXFP4_PADDING: dict[str, tuple[int, int]] = {
    "ampere": (128, 256), "ada": (128, 256), "hopper": (64, 1), "blackwell": (256, 256),
}


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def expert_padding(arch: ModelArch, gpu: GpuType, tp: int) -> float:
    """Bytes the engine holds per checkpoint byte of routed experts on `tp` GPUs of `gpu`'s
    type: the padded expert matrices over the real ones (1.0 when nothing is padded)."""
    if arch.moe is None or arch.expert_weight_format is None \
            or gpu.architecture not in NATIVE_ARCHITECTURES[arch.expert_weight_format]:
        return 1.0
    ffn_multiple, hidden_multiple = MXFP4_PADDING[gpu.architecture]
    ffn, hidden = arch.moe.expert_ffn_size, arch.hidden_size
    share = -(-ffn // tp)
    padded = tp * _round_up(share, ffn_multiple) * _round_up(hidden, hidden_multiple)
    return padded / (ffn * hidden)


def expert_weight_bits(arch: ModelArch, gpu: GpuType, tp: int = 1) -> float:
    """Bits one routed-expert weight of `arch` takes on `tp` GPUs of `gpu`'s type, as held
    and as read: the checkpoint's format where the serving engine runs it, its padding
    counted (`expert_padding`), else the model's `dtype_bytes`."""
    fmt = arch.expert_weight_format
    if fmt is None or gpu.architecture not in NATIVE_ARCHITECTURES[fmt]:
        return 8.0 * arch.dtype_bytes
    return arch.expert_weight_bits * expert_padding(arch, gpu, tp)
