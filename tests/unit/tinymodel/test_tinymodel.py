"""The small-model tool (ucmctl.tinymodel): deterministic for a seed, loadable, and a typer sub-app."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ucmctl.tinymodel import SIZES, app, make_model


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = digests(make_model(tmp_path / "a", "tiny", seed=3))
    b = digests(make_model(tmp_path / "b", "tiny", seed=3))
    c = digests(make_model(tmp_path / "c", "tiny", seed=4))
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["tokenizer.json"] != c["tokenizer.json"]


def test_tiny_model_shape_and_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    out = make_model(tmp_path / "m", "tiny", seed=0)
    cfg = AutoConfig.from_pretrained(out)
    shape = SIZES["tiny"]
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
    ) == (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.intermediate)
    assert str(cfg.dtype).endswith("bfloat16")
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("def main(): return 42")["input_ids"]
    assert tok.decode(ids) == "def main(): return 42"
    assert max(ids) < cfg.vocab_size
    assert json.loads((out / "ucmctl-model.json").read_text())["size"] == "tiny"


def test_cli_builds_and_rejects_unknown_size(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["make-tiny", str(tmp_path / "m"), "--seed", "1"])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "m" / "model.safetensors").exists()
    bad = runner.invoke(app, ["make-tiny", str(tmp_path / "x"), "--size", "huge"])
    assert bad.exit_code != 0
    assert "huge" in bad.output


def test_unknown_size_in_api() -> None:
    with pytest.raises(ValueError, match="valid sizes: tiny, medium"):
        make_model("/nonexistent", "huge")  # type: ignore[arg-type]
