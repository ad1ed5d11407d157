"""Prompts as token ids, deterministic from (seed, index).

Every prompt opens with a header of `HEADER` tokens that spells its index, seed and stream in
base `vocab - FIRST_ID`, so two prompts of different seeds (or indexes, or streams: one per
benchmark cell) differ in their first token block: no prompt can hit another's cached prefix.
The rest comes from a PRNG seeded by (seed, stream, index). The measured prompt i is the
preseed prompt i continued, because both are prefixes of the same stream.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ucmctl.core.errors import UcmctlError

FIRST_ID = 10  # ids below this are left alone: special tokens sit there in most vocabularies
HEADER = 6  # two digits each of index, seed and stream
MIN_VOCAB = 256


def preseed_len(input_len: int, prefix_ratio: float) -> int:
    """Tokens of the preseed prompt: input_len * prefix_ratio, as the guides compute it."""
    return int(input_len * prefix_ratio)


def _digits(value: int, base: int) -> list[int]:
    return [(value // base) % base, value % base]


def prompt_ids(seed: int, index: int, length: int, vocab: int, stream: int = 0) -> list[int]:
    """The first `length` tokens of prompt `index` of (`seed`, `stream`), ids in [FIRST_ID, vocab)."""
    if vocab < MIN_VOCAB:
        raise UcmctlError.one(
            f"vocabulary of {vocab} tokens is too small", key="--vocab", fix=f"use at least {MIN_VOCAB}"
        )
    base = vocab - FIRST_ID
    if index >= base * base:
        raise UcmctlError.one(f"at most {base * base} prompts with a vocabulary of {vocab}")
    square = base * base
    digits = (*_digits(index, base), *_digits(seed % square, base), *_digits(stream % square, base))
    header = [FIRST_ID + d for d in digits]
    if length <= HEADER:
        return header[:length]
    rng = np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, stream & 0xFFFFFFFF, index]))
    body = rng.integers(FIRST_ID, vocab, size=length - HEADER, dtype=np.int64)
    return header + body.tolist()


def vocab_from_model(model_dir: Path) -> int:
    """Ids valid for a model folder: below both config.json's vocab_size and the tokenizer's size
    (servers such as vLLM refuse ids the tokenizer does not know, even when the model has room)."""
    sizes = []
    config = model_dir / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        size = data.get("vocab_size") or data.get("text_config", {}).get("vocab_size")
        if isinstance(size, int) and size > 0:
            sizes.append(size)
    tokenizer = model_dir / "tokenizer.json"
    if tokenizer.is_file():
        tok = json.loads(tokenizer.read_text())
        ids = list((tok.get("model") or {}).get("vocab", {}).values())
        ids += [t.get("id", 0) for t in tok.get("added_tokens") or []]
        if ids:
            sizes.append(max(ids) + 1)
    if not sizes:
        raise UcmctlError.one(
            f"no vocab_size in {config} and no vocabulary in {tokenizer}",
            key="--model-dir",
            fix="pass --vocab N instead",
        )
    return min(sizes)
