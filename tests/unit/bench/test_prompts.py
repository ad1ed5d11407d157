from __future__ import annotations

import json
from pathlib import Path

import pytest

from ucmctl.bench.prompts import FIRST_ID, HEADER, preseed_len, prompt_ids, vocab_from_model
from ucmctl.core.errors import UcmctlError


def test_deterministic_and_measure_extends_preseed() -> None:
    pre = prompt_ids(7, 3, preseed_len(4096, 0.8), 8000)
    full = prompt_ids(7, 3, 4096, 8000)
    assert len(pre) == 3276 and len(full) == 4096
    assert full[:3276] == pre  # the measured prompt begins exactly with its preseed prompt
    assert prompt_ids(7, 3, 4096, 8000) == full  # deterministic


def test_different_seeds_indexes_and_streams_differ_in_the_first_block() -> None:
    base = prompt_ids(1, 0, 16, 8000)
    for other in (
        prompt_ids(2, 0, 16, 8000),
        prompt_ids(1, 1, 16, 8000),
        prompt_ids(1, 0, 16, 8000, stream=1),
    ):
        assert other[:HEADER] != base[:HEADER]
    firsts = {tuple(prompt_ids(s, i, HEADER, 8000)) for s in range(20) for i in range(50)}
    assert len(firsts) == 1000  # every (seed, index) has its own header: no shared prefix


def test_ids_stay_in_the_vocabulary() -> None:
    ids = [t for i in range(20) for t in prompt_ids(5, i, 2000, 300)]
    assert min(ids) >= FIRST_ID and max(ids) < 300
    assert len(set(ids)) > 250  # spread over the vocabulary, not a constant
    with pytest.raises(UcmctlError):
        prompt_ids(0, 0, 10, 100)


def test_vocab_from_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 8192}))
    assert vocab_from_model(tmp_path) == 8192
    other = tmp_path / "tok"
    other.mkdir()
    (other / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1, "c": 2}}}))
    assert vocab_from_model(other) == 3
    with pytest.raises(UcmctlError, match="--vocab"):
        vocab_from_model(tmp_path / "missing")
