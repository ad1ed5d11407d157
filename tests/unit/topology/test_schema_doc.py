from __future__ import annotations

import json
from pathlib import Path

from ucmctl.topology.model import Model, Mooncake, Node, PeerParallel, Side, Storage, Topology
from ucmctl.topology.proxy import Proxy
from ucmctl.topology.schema_doc import json_schema, markdown

DOC = Path(__file__).resolve().parents[3] / "docs" / "topology.md"


def test_checked_in_reference_is_the_generated_one() -> None:
    assert DOC.read_text() == markdown(), "regenerate: ucmctl schema > docs/topology.md"


def test_reference_covers_every_key_of_every_model() -> None:
    text = markdown()
    for model in (Topology, Node, Model, Storage, Mooncake, Proxy, Side, PeerParallel):
        for name in model.model_fields:
            assert f"| `{name}` |" in text
    for section in ("## Node (in `nodes`)", "## Side (in `prefill`)", "## Storage (in `storage`)",
                    "## Mooncake (in `mooncake`)", "## PeerParallel (in `kv_peer`)"):  # fmt: skip
        assert section in text
    assert json.loads(json_schema())["title"] == "Topology"
