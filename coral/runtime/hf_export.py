"""Write a GGUF checkpoint out as a Hugging Face folder (float32), for engines that read those.

vLLM's CPU build has no GGUF kernels; given this folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) it loads a plain float32 Llama with exactly the weights
Coral's own workers use, tokenizer and chat template included, without network access.

The safetensors file is written directly (an 8-byte header length, a JSON header, raw
little-endian tensors), so the runtime needs no extra package for it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from coral.runtime.config import ModelConfig

#: Files that make a folder an exported checkpoint (written last: `config.json`).
EXPORT_MARKER = "config.json"


def _hf_tensors(model: ModelConfig):
    """(Hugging Face name, float32 array) of every tensor, in file order."""
    from coral.runtime.checkpoint import GgufWeights

    source = GgufWeights(model)
    yield "model.embed_tokens.weight", source.embedding().numpy()
    hf_names = {"attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj",
                "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
                "o_proj": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm",
                "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                "down_proj": "mlp.down_proj"}
    for i in range(model.num_layers):
        layer = source.layer(i)
        for ours, theirs in hf_names.items():
            yield f"model.layers.{i}.{theirs}.weight", layer[ours].numpy()
    yield "model.norm.weight", source.final_norm().numpy()
    if not model.tied_embeddings:
        yield "lm_head.weight", source.lm_head().numpy()


def write_safetensors(path: Path, tensors) -> None:
    """Write (name, float32 array) pairs as one safetensors file."""
    header: dict = {"__metadata__": {"format": "pt"}}
    arrays = []
    offset = 0
    for name, array in tensors:
        a = np.ascontiguousarray(array, dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for a in arrays:
            fh.write(a.tobytes())


def hf_config(model: ModelConfig, tokenizer) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": model.max_seq_len,
        "rms_norm_eps": model.norm_eps,
        "rope_theta": model.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": model.tied_embeddings,
        "vocab_size": model.vocab_size,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.eos_token_id,
        "torch_dtype": "float32",
    }


def export_hf(model: ModelConfig, out_dir: str | Path) -> Path:
    """Write `model`'s GGUF checkpoint to `out_dir` as a Hugging Face folder; returns it.

    A folder already holding an export of the same file (same config) is reused.
    """
    from coral.runtime.tokenizer import GgufTokenizer

    if model.weights is None:
        raise ValueError(f"{model.name} has random weights: there is no checkpoint to export")
    out = Path(out_dir)
    tok = GgufTokenizer(model.weights)
    config = hf_config(model, tok)
    marker = out / EXPORT_MARKER
    if marker.is_file() and json.loads(marker.read_text()) == config:
        return out
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", _hf_tensors(model))
    tok.save_hf(out / "tokenizer.json")
    token = tok.token
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None if tok.bos_token_id is None else token(tok.bos_token_id),
        "eos_token": token(tok.eos_token_id),
        "pad_token": token(tok.eos_token_id),
        "add_bos_token": tok.add_bos,
        "model_max_length": model.max_seq_len,
        "chat_template": tok.chat_template,
    }, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}, indent=2) + "\n")
    marker.write_text(json.dumps(config, indent=2) + "\n")  # last: marks a complete export
    return out
