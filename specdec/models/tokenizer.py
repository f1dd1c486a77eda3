"""A byte-level tokenizer for `dummy:` targets, which have random weights and no tokenizer of their own.

It gives benchmarks on dummy targets real prompts of realistic length: one token per UTF-8 byte.
"""

from __future__ import annotations


class ByteTokenizer:
    chat_template = None

    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...] = ()) -> None:
        if vocab_size < 260:
            raise ValueError("a byte tokenizer needs a vocabulary of at least 260 tokens")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else None
        self.offset = 4  # ids 0..3 stay free for special tokens (bos, eos, ...)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        data = bytes(i - self.offset for i in ids if self.offset <= i < 256 + self.offset)
        return data.decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return self.vocab_size
