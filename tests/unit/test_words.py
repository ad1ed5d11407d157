from __future__ import annotations

import pytest

from ucmctl.core.words import counted


@pytest.mark.parametrize(
    ("n", "noun", "said"),
    [(1, "node", "1 node"), (0, "node", "0 nodes"), (2, "node", "2 nodes"), (1, "process", "1 process"),
     (3, "process", "3 processes"), (2, "API server", "2 API servers"), (2, "box", "2 boxes"),
     (2, "batch", "2 batches")],
)  # fmt: skip
def test_counted(n: int, noun: str, said: str) -> None:
    assert counted(n, noun) == said
