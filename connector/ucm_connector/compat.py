"""What differs between the vLLM versions the connector runs on, found by feature detection.

The connector supports vLLM 0.13 to 0.33 (vllm-ascend pins 0.13, 0.18 and 0.23). Nothing here
reads a version number: each helper asks vLLM whether the feature is there.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from ucm_connector import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)


def cache_hit_source(name: str) -> Any | None:
    """vLLM's `CacheHitSource.<name>` (0.32 and later label external hits by source), else None."""
    try:
        module = importlib.import_module("vllm.v1.metrics.cache_hit_source")
    except ImportError:
        return None
    return getattr(module.CacheHitSource, name, None)


def register_with_factory(name: str, module_path: str, class_name: str) -> bool:
    """Register a connector under `name` with vLLM's connector factory, unless already there.

    MultiConnector rebuilds its children's stats by registered name; a connector loaded only
    through `kv_connector_module_path` is unknown to it otherwise. Returns whether it registered.
    """
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except ImportError:  # no factory in this vLLM: nothing looks connectors up by name
        return False
    registry = getattr(KVConnectorFactory, "_registry", None)
    if isinstance(registry, dict) and name in registry:
        return False
    try:
        KVConnectorFactory.register_connector(name, module_path, class_name)
    except ValueError:  # registered meanwhile (another import path of this module)
        return False
    return True


def metric_per_engine(metric: Any, per_engine_labelvalues: dict[int, list[object]]) -> dict[int, Any]:
    """One labelled child of `metric` per engine index (vLLM's create_metric_per_engine)."""
    return {idx: metric.labels(*values) for idx, values in per_engine_labelvalues.items()}


def blocks_first(kv_caches: dict[str, Any], block_bytes: int | None) -> dict[str, Any]:
    """Each layer's paged KV cache with blocks on dim 0, as the copy path expects.

    vLLM's CPU attention before 0.23 (and attention backends that keep K and V apart) shapes
    a layer's cache `(2, num_blocks, ...)`: one block is then a K range and a V range. Seen
    as `(num_blocks, 2, ...)` (a view, no copy) it holds the block's bytes in K, V order.
    Detected by the shape: a leading 2 where the layer as it stands does not hold the bytes
    per block that the KV cache spec announces, and the swapped view does.
    """
    if block_bytes is None:
        return kv_caches
    out = {}
    for name, t in kv_caches.items():
        per_block = t[0].numel() * t.element_size() if t.dim() >= 2 else 0
        if per_block != block_bytes and t.dim() >= 3 and t.shape[0] == 2:
            swapped = t.transpose(0, 1)
            if swapped[0].numel() * t.element_size() == block_bytes:
                t = swapped
        out[name] = t
    return out
