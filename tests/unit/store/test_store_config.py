"""Configuration and argument errors name the key, the value and the valid choices."""

from __future__ import annotations

import numpy as np
import pytest
import ucm_store
from ucm_store import ConfigError

from tests.support.blocks import key


def open_store(tmp_path, shard_sizes=(4096,), **cfg):
    cfg.setdefault("storage_backends", str(tmp_path))
    cfg.setdefault("cache_buffer_capacity_gb", 0.01)
    return ucm_store.Store.from_config(cfg, shard_sizes=list(shard_sizes))


@pytest.mark.parametrize(
    ("cfg", "needles"),
    [
        ({"store_pipeline": "Cache|Ds3fs"}, ["store_pipeline", "'Ds3fs'", "Cache, Posix"]),
        ({"store_pipeline": "Posix|Cache"}, ["store_pipeline", "Cache|Posix"]),
        ({"store_pipeline": 3}, ["store_pipeline", "3"]),
        ({"storage_backends": "relative/dir"}, ["storage_backends", "not absolute"]),
        ({"storage_backends": ""}, ["storage_backends", "at least one"]),
        ({"storage_backends": 5}, ["storage_backends", "absolute paths"]),
        ({"cache_buffer_capacity_gb": 0}, ["cache_buffer_capacity_gb", "> 0"]),
        ({"cache_buffer_capacity_gb": "4"}, ["cache_buffer_capacity_gb", "'4'"]),
        ({"cache_buffer_capacity_gb": 1e-9}, ["cache_buffer_capacity_gb", "at least one block"]),
        ({"posix_capacity_gb": -1}, ["posix_capacity_gb", "0 = unlimited"]),
        ({"io_direct": "yes"}, ["io_direct", "true or false"]),
        ({"posix_io_threads": 0}, ["posix_io_threads", "1 to 256"]),
        ({"timeout_ms": -5}, ["timeout_ms", ">= 0"]),
        ({"posix_io_engine": "aio"}, ["unknown key", "posix_io_engine", "store_pipeline"]),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, cfg, needles):
    with pytest.raises(ConfigError) as err:
        open_store(tmp_path, **cfg)
    for needle in needles:
        assert needle in str(err.value)
    assert isinstance(err.value, ValueError)


def test_missing_backends_for_posix(tmp_path):
    with pytest.raises(ConfigError, match="storage_backends: missing"):
        ucm_store.Store.from_config({"store_pipeline": "Posix"}, shard_sizes=[64])


def test_cache_alone_needs_no_backend():
    store = ucm_store.Store.from_config(
        {"store_pipeline": "Cache", "cache_buffer_capacity_gb": 0.001}, shard_sizes=[64]
    )
    with store:
        assert store.settings.pipeline == "Cache"


@pytest.mark.parametrize("sizes", [[], [0], [-1], [1.5]])
def test_bad_shard_sizes(tmp_path, sizes):
    with pytest.raises(ConfigError, match="shard_sizes"):
        open_store(tmp_path, shard_sizes=sizes)


def test_key_size_is_enforced(tmp_path):
    assert ucm_store.KEY_SIZE == 16
    with open_store(tmp_path) as store:
        for bad in (b"short", b"x" * 17, "a" * 16, 1234):
            with pytest.raises(ValueError, match="16-byte"):
                store.lookup([bad])
        with pytest.raises(ValueError, match="key 1 is 3 bytes"):
            store.lookup_prefix([key(0), b"abc"])


def test_block_shape_is_enforced(tmp_path):
    with open_store(tmp_path, shard_sizes=(64, 32)) as store:
        good = [np.zeros(64, np.uint8), np.zeros(32, np.uint8)]
        with pytest.raises(ValueError, match="2 keys but 1 blocks"):
            store.dump([key(0), key(1)], [good])
        with pytest.raises(ValueError, match="has 1 shards; the store expects 2"):
            store.dump([key(0)], [good[:1]])
        with pytest.raises(ValueError, match="shard 1 has 31 bytes; the store expects 32"):
            store.dump([key(0)], [[good[0], np.zeros(31, np.uint8)]])
        with pytest.raises(ValueError, match="null address"):
            store.dump([key(0)], [[(0, 64), good[1]]])
        # Loads need writable destinations.
        with pytest.raises(BufferError):
            store.load([key(0)], [[bytes(64), bytes(32)]])
        assert store.stats()["dump_blocks"] == 0
