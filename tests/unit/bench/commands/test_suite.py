"""`ucmctl bench suite`'s vocabulary: --vocab, else the suite's, else the model folder's, else 8000."""

from __future__ import annotations

import json
from pathlib import Path

from ucmctl.bench.commands.suite import _vocab


def test_the_vocabulary_in_order_of_precedence(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    assert _vocab(None, None, model) == 8000  # no config.json
    (model / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    assert _vocab(None, None, model) == 32000
    assert _vocab(None, 1000, model) == 1000
    assert _vocab(500, 1000, model) == 500
