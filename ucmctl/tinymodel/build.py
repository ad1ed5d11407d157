"""Build a random-weight Llama and a locally trained tokenizer: no model hub is needed."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ModelSize = Literal["tiny", "medium"]

VOCAB_SIZE = 8192
MAX_POSITIONS = 16384
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


# Shapes measured in shared/docs/vllm-on-cpu.md: tiny starts fast for correctness tests,
# medium makes prefill cost dominate so TTFT benchmarks measure the cache, not overhead.
SIZES: dict[str, Shape] = {
    "tiny": Shape(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=1024),
    "medium": Shape(hidden=1024, layers=8, heads=16, kv_heads=8, intermediate=2816),
}

_SYLLABLES = [
    "ka",
    "ne",
    "ri",
    "to",
    "mu",
    "sa",
    "lo",
    "vi",
    "de",
    "pa",
    "ch",
    "or",
    "an",
    "el",
    "is",
    "um",
    "th",
    "qu",
    "st",
    "re",
    "en",
    "at",
    "on",
    "ar",
    "in",
    "er",
    "es",
]


def _corpus(seed: int, lines: int = 20000) -> list[str]:
    """Seeded pseudo-text: the tokenizer then depends on the seed alone, not on local files."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(3000)]
    punct = [" ", " ", " ", " ", ", ", ". ", "\n", " (", ") ", " = ", ": "]
    out = []
    for _ in range(lines):
        n = rng.randint(4, 16)
        out.append("".join(rng.choice(words) + rng.choice(punct) for _ in range(n)))
    return out


def _train_tokenizer(seed: int, out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.model_max_length = MAX_POSITIONS
    fast.save_pretrained(out_dir)


def make_model(out_dir: str | Path, size: ModelSize = "tiny", seed: int = 0) -> Path:
    """Write a `size` Llama with seeded random bf16 weights and its tokenizer to `out_dir`.

    The same (size, seed) gives byte-identical weights, so every instance in a test or a
    cluster serves the same model and computes the same KV bytes.
    """
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; valid sizes: {', '.join(SIZES)}")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = SIZES[size]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(seed, out)

    config = LlamaConfig(  # type: ignore[call-arg]  # transformers types lag its kwargs
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        # A wider init than the default 0.02 gives peaked next-token distributions, so greedy
        # choices do not hinge on last-bit differences between equal computations.
        initializer_range=0.08,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]
    model.save_pretrained(out, safe_serialization=True)
    (out / "ucmctl-model.json").write_text(
        json.dumps({"size": size, "seed": seed, "vocab_size": VOCAB_SIZE}, indent=2) + "\n"
    )
    return out
