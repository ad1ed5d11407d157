"""Token ids the server accepts: `bench` reads the vocabulary from the model folder the server
names (/v1/models' root) when this machine can read it, and otherwise checks its fallback with
one request: a vocabulary too large stops the run on one line, before any phase."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.processes import sim_server
from tests.unit.bench.helpers import invoke
from ucmctl.core.errors import ExitStatus

VOCAB = 4868  # the embedded default's medium model: ids 0..4867, below bench's fallback 8000
SHORT = ("--input-len", "256", "--num-prompts", "2", "--output-len", "4", "-q")


def small_vocab_model(folder: Path, vocab: int = VOCAB) -> Path:
    """A model folder the simulator serves: a word-level tokenizer of `vocab` ids and a config."""
    from tokenizers import Tokenizer, models

    folder.mkdir(parents=True)
    words = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab)}}
    Tokenizer(models.WordLevel(words, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"vocab_size": vocab, "model_type": "llama"}))
    return folder


def test_vocabulary_from_the_servers_model_folder(tmp_path: Path) -> None:
    model = small_vocab_model(tmp_path / "model")
    with sim_server(tmp_path, model=str(model)) as sim:
        code, text = invoke("--url", sim.url, *SHORT)
    assert code == 0, text
    assert f"vocabulary {VOCAB} ids, from {model}" in " ".join(text.split())


def test_a_vocabulary_too_large_stops_on_one_line(tmp_path: Path) -> None:
    model = small_vocab_model(tmp_path / "model")
    with sim_server(tmp_path, model=str(model)) as sim:
        code, text = invoke("--url", sim.url, "--vocab", "8000", *SHORT)
        code_ok, text_ok = invoke("--url", sim.url, "--vocab", str(VOCAB), *SHORT)
    assert code == ExitStatus.BAD_INPUT
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text  # no phase ran: no table, no progress
    assert "the server refuses token id 7999" in lines[0] and "out of vocabulary" in lines[0]
    assert "--model-dir" in lines[0] and "--vocab" in lines[0]
    assert code_ok == 0, text_ok
