"""A byte-level tokenizer: enough for random-weight models, whose output is noise anyway.

Ids 0-255 are the UTF-8 bytes of the text, then BOS and EOS. Decoding skips ids that are not
bytes and replaces invalid UTF-8. Real checkpoints need their own tokenizer (not wired yet).
"""

from __future__ import annotations

from coral.runtime.config import BOS_TOKEN_ID, EOS_TOKEN_ID


class ByteTokenizer:
    bos_token_id = BOS_TOKEN_ID
    eos_token_id = EOS_TOKEN_ID

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return ([BOS_TOKEN_ID] if add_bos else []) + list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[tuple[str, str]]) -> str:
        """`role: content` lines, then `assistant:` to prompt the reply."""
        return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"
