"""Tokenizers: a byte-level one for random-weight models, and a checkpoint's own BPE.

`ByteTokenizer`: ids 0-255 are the UTF-8 bytes of the text, then BOS and EOS. Decoding skips
ids that are not bytes and replaces invalid UTF-8. Enough for random weights, whose output is
noise anyway.

`GgufTokenizer`: the byte-level BPE vocabulary, merges and special tokens stored in a GGUF
checkpoint (llama.cpp's `gpt2` tokenizer model, as SmolLM2 uses), run by the `tokenizers`
library, plus the checkpoint's chat template (Jinja, rendered in a sandbox).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from coral.runtime.config import BOS_TOKEN_ID, EOS_TOKEN_ID, ModelConfig

#: llama.cpp token types (`tokenizer.ggml.token_type`).
_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 1, 3, 4
#: Pre-tokenizers (`tokenizer.ggml.pre`) whose splitting rules are known here, with the
#: `tokenizers` pre-tokenizer that reproduces Hugging Face's tokenizer.json for them.
KNOWN_PRE_TOKENIZERS = ("smollm", "gpt2", "default")


class Tokenizer(Protocol):
    eos_token_id: int

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def apply_chat_template(self, messages: list[tuple[str, str]]) -> str: ...


def fewest_tokens(tokenizer: Tokenizer, text: str) -> int:
    """A lower bound on the tokens of `text`, found without tokenizing it (0 when the
    tokenizer does not tell how many bytes its longest token covers): a prompt far longer
    than the context is refused before any work is spent on it."""
    widest = getattr(tokenizer, "max_token_bytes", None)
    if not widest:
        return 0
    return -(-len(text.encode("utf-8", errors="surrogatepass")) // int(widest))


class ByteTokenizer:
    bos_token_id = BOS_TOKEN_ID
    eos_token_id = EOS_TOKEN_ID
    #: Every token is one byte of the text.
    max_token_bytes = 1

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return ([BOS_TOKEN_ID] if add_bos else []) + list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[tuple[str, str]]) -> str:
        """`role: content` lines, then `assistant:` to prompt the reply."""
        return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"


class GgufTokenizer:
    """A GGUF checkpoint's byte-level BPE tokenizer and chat template."""

    def __init__(self, path: str | Path):
        from tokenizers import AddedToken, Tokenizer as HfTokenizer
        from tokenizers import decoders, models, pre_tokenizers

        from coral.runtime.gguf_file import GgufError, open_gguf

        f = open_gguf(str(Path(path).resolve()))
        kind = f.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise GgufError(f"{f.path}: tokenizer model '{kind}' is not supported (supported: "
                            "'gpt2', byte-level BPE)")
        pre = f.get("tokenizer.ggml.pre", "default")
        if pre not in KNOWN_PRE_TOKENIZERS:
            raise GgufError(f"{f.path}: pre-tokenizer '{pre}' is not supported (supported: "
                            f"{', '.join(KNOWN_PRE_TOKENIZERS)})")
        tokens = list(f.require("tokenizer.ggml.tokens"))
        types = f.get("tokenizer.ggml.token_type")
        merges = [tuple(m.split(" ", 1)) for m in f.require("tokenizer.ggml.merges")]
        model = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                           fuse_unk=False, byte_fallback=False)
        tok = HfTokenizer(model)
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre == "smollm":  # digits one by one, then GPT-2's byte-level split
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
        if types is not None:
            special = [AddedToken(tokens[i], special=True, normalized=False)
                       for i, t in enumerate(types) if int(t) == _TOKEN_CONTROL]
            user = [AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(types) if int(t) == _TOKEN_USER_DEFINED]
            tok.add_special_tokens(special)
            tok.add_tokens(user)
        self._tok = tok
        self.path = f.path
        self.vocab_size = len(tokens)
        self.eos_token_id = int(f.require("tokenizer.ggml.eos_token_id"))
        bos = f.get("tokenizer.ggml.bos_token_id")
        self.bos_token_id = None if bos is None else int(bos)
        self.add_bos = bool(f.get("tokenizer.ggml.add_bos_token", False))
        self.chat_template: str | None = f.get("tokenizer.chat_template")
        self._tokens = tokens
        # byte-level BPE: each character of a token's string stands for one byte of text
        self.max_token_bytes = max((len(t) for t in tokens), default=1)

    def token(self, token_id: int) -> str:
        return self._tokens[token_id]

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. `<|im_start|>`) are
        recognised. A BOS id is prepended only when the checkpoint asks for it."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos and self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: list[int]) -> str:
        """Text of the ids, special tokens (end of turn, ...) left out."""
        return self._tok.decode(list(token_ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: list[tuple[str, str]]) -> str:
        """The checkpoint's chat template over (role, content) messages, ready for the reply."""
        if not self.chat_template:
            raise ValueError(f"{self.path} has no chat template; use /v1/completions")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        template = env.from_string(self.chat_template)
        return template.render(messages=[{"role": r, "content": c} for r, c in messages],
                               add_generation_prompt=True, bos_token="", eos_token="")

    def save_hf(self, path: str | Path) -> None:
        """Write the tokenizer as a Hugging Face `tokenizer.json`."""
        self._tok.save(str(path))


def tokenizer_for(model: ModelConfig) -> Tokenizer:
    """The tokenizer of a model: its checkpoint's, or the byte tokenizer for random weights."""
    if model.weights is None:
        return ByteTokenizer()
    return GgufTokenizer(model.weights)
