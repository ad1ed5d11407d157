"""vLLM's KV-cache events read into the proxy's block keys: the same keys the proxy makes of the
same prompt, a removal found by vLLM's hash, a clear, and malformed events one by one."""

from __future__ import annotations

import msgspec
import pytest

from ucmctl.proxy.kv_events import BadEvent, Cleared, Removed, Stored, Translation, decode
from ucmctl.proxy.kv_index import block_keys
from ucmctl.proxy.rewrite import COMPLETIONS

PROMPT = list(range(100, 164))  # 4 blocks of 16


def batch(*events: dict) -> bytes:
    """A batch as vLLM 0.32 writes it (msgspec: an array; each event a map tagged `type`)."""
    return msgspec.msgpack.encode([1.5, list(events), 0])


def stored(hashes: list[bytes], parent: bytes | None, ids: list[int]) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": ids,
            "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None}  # fmt: skip


def test_stored_blocks_get_the_keys_the_proxy_makes_of_the_prompt() -> None:
    h = [bytes([n]) * 32 for n in range(4)]
    events = decode(batch(stored(h[:2], None, PROMPT[:32]), stored(h[2:], h[1], PROMPT[32:])))
    t = Translation("m")
    keys = [k for e in events if isinstance(e, Stored) for k in (t.stored(e) or [])]
    assert keys == list(block_keys({"model": "m", "prompt": PROMPT}, COMPLETIONS, 16))
    (gone,) = decode(batch({"type": "BlockRemoved", "block_hashes": [h[3]], "medium": "GPU"}))
    assert isinstance(gone, Removed) and t.removed(gone) == keys[3:]
    (cleared,) = decode(batch({"type": "AllBlocksCleared"}))
    assert isinstance(cleared, Cleared)


def test_a_block_whose_parent_was_never_seen_has_no_key() -> None:
    (e,) = decode(batch(stored([b"\x09" * 32], b"\x08" * 32, PROMPT[:16])))
    assert isinstance(e, Stored) and Translation("m").stored(e) is None


def test_malformed_events_are_errors_one_by_one() -> None:
    events = decode(batch(
        stored([b"\x01" * 32], None, PROMPT[:15]),  # 15 ids for a block of 16
        {"type": "BlockStored"},  # fields missing
        {"type": "SomethingNew"},
        "not a map",
        {"type": "AllBlocksCleared"},
    ))  # fmt: skip
    assert [type(e) for e in events] == [BadEvent, BadEvent, BadEvent, BadEvent, Cleared]
    with pytest.raises(BadEvent):
        decode(b"\xc1")  # never valid msgpack
    with pytest.raises(BadEvent):
        decode(msgspec.msgpack.encode({"ts": 1}))


def test_vllms_own_batch_reads_the_same() -> None:
    kv = pytest.importorskip("vllm.distributed.kv_events")
    h = [bytes([n]) * 32 for n in range(4)]
    raw = msgspec.msgpack.encode(kv.KVEventBatch(ts=2.0, data_parallel_rank=0, events=[
        kv.BlockStored(block_hashes=h, parent_block_hash=None, token_ids=PROMPT, block_size=16,
                       lora_id=None, medium="GPU", lora_name=None),
        kv.BlockRemoved(block_hashes=h[2:], medium="GPU"),
        kv.AllBlocksCleared(),
    ]))  # fmt: skip
    s, r, c = decode(raw)
    assert isinstance(s, Stored) and s.hashes == tuple(h) and s.medium == "GPU"
    t = Translation("m")
    assert t.stored(s) == list(block_keys({"model": "m", "prompt": PROMPT}, COMPLETIONS, 16))
    assert isinstance(r, Removed) and len(t.removed(r)) == 2 and isinstance(c, Cleared)
