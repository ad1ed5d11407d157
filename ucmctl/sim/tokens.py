"""Text <-> token ids for the simulator: the model's own tokenizer when it has one."""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Protocol

WORD_VOCAB = 32000


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class WordTokenizer:
    """Stand-in for a model without a tokenizer file: one token per whitespace-separated word."""

    vocab_size = WORD_VOCAB

    def encode(self, text: str) -> list[int]:
        return [zlib.crc32(w.encode()) % WORD_VOCAB for w in re.findall(r"\S+", text)]

    def decode(self, ids: list[int]) -> str:
        return "".join(f" w{i}" for i in ids)


class FileTokenizer:
    """A `tokenizer.json` read with the `tokenizers` library (what vLLM's tokenizer wraps)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self._tok = HFTokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def load_tokenizer(model: str) -> Tokenizer:
    path = Path(model) / "tokenizer.json"
    if path.is_file():
        try:
            return FileTokenizer(path)
        except ImportError:
            pass
    return WordTokenizer()
