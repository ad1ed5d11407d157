"""`pack_refs`, the one maker of pack references: the store's tests, the connector and the
simulator all take theirs from it."""

from __future__ import annotations

from ucmctl.core.pack_heads import pack_refs

KEYS = [bytes([i]) * 16 for i in range(10)]


def test_without_packs_on_disk_a_block_is_in_the_pack_of_its_ranges_first_block() -> None:
    assert pack_refs(KEYS, range(3, 7), 4, ()) == [(KEYS[0], 3), (KEYS[4], 0), (KEYS[4], 1), (KEYS[4], 2)]


def test_heads_found_on_disk_name_the_packs() -> None:
    # a chain that forked at block 2 inside another's pack of 0..3: its own tail pack from 2 on
    heads = [0, 0, 2, 2]
    assert pack_refs(KEYS, range(5), 4, heads) == [
        (KEYS[0], 0), (KEYS[0], 1), (KEYS[2], 0), (KEYS[2], 1), (KEYS[4], 0),
    ]  # fmt: skip


def test_one_block_per_file_has_no_references() -> None:
    assert pack_refs(KEYS, range(4), 1, ()) is None
