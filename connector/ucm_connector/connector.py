"""`UCMConnector`: the KVConnectorBase_V1 subclass vLLM loads by module path.

A thin facade: the scheduler role delegates to `SchedulerSide`, the worker role to
`WorkerSide`. It uses vLLM's public connector API only (no patching), and works on any
platform; the device-specific part is the copy path in `copy_path.py`.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ucm_connector import LOGGER_NAME
from ucm_connector.compat import cache_hit_source, register_with_factory
from ucm_connector.config import UCMConfig, load_config
from ucm_connector.keys import KeyMaker, Namespace
from ucm_connector.metadata import UCMConnectorMetadata
from ucm_connector.scheduler import SchedulerSide
from ucm_connector.stats import UCMConnectorStats, UCMPromMetrics
from ucm_connector.store import StoreLike, open_store
from ucm_connector.worker import WorkerSide
from ucmctl.core.ucm_config import lookup_bound

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(LOGGER_NAME)


def _namespace(
    vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, config: UCMConfig
) -> tuple[Namespace, int]:
    """The namespace of this deployment's blocks, and vLLM hashes per block."""
    from vllm.platforms import current_platform
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError(
            f"UCMConnector supports models with one KV cache group, this one has {len(groups)} "
            "(hybrid attention); run it without the connector"
        )
    pp = vllm_config.parallel_config.pipeline_parallel_size
    if pp != 1:
        raise ValueError(f"UCMConnector does not support pipeline parallelism (size {pp})")
    spec = groups[0].kv_cache_spec
    model = vllm_config.model_config.served_model_name
    if isinstance(model, (list, tuple)):
        model = model[0]
    block_size = spec.block_size
    # Older vLLM (0.23 and before) hashes whole blocks and has no separate hash block size.
    hash_block = getattr(kv_cache_config, "hash_block_size", None) or block_size
    if block_size % hash_block:
        raise ValueError(f"UCMConnector: block size {block_size} is not a multiple of hash size {hash_block}")
    kv_layout = getattr(kv_cache_config, "kv_cache_layout", None) or "default"  # 0.32 and later
    ns = Namespace(
        model=str(model or vllm_config.model_config.model),
        dtype=str(spec.dtype).removeprefix("torch."),
        # The byte layout inside a block differs between platforms (the CPU kernel stores all
        # K rows then all V rows), so the platform is part of the layout.
        layout=f"{current_platform.device_type}/{kv_layout}",
        block_size=block_size,
        tp_size=vllm_config.parallel_config.tensor_parallel_size,
        num_layers=len(groups[0].layer_names),
        shard_bytes=spec.page_size_bytes,
        mla=isinstance(spec, MLAAttentionSpec),
        layerwise=config.use_layerwise,
    )
    return ns, block_size // hash_block


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except Exception:  # the TP group is not initialized: a single-rank worker
        return 0


class UcmctlConnector(KVConnectorBase_V1):
    """KV connector to the UCM store: external prefix cache shared through DRAM and files.

    vLLM loads it as `UCMConnector` (the guides' name, an alias below) through
    `kv_connector_module_path`. The class has a name of its own because vLLM's MultiConnector
    keys its children's stats by class name and rebuilds them through the connector registry
    by that name, and vllm-ascend registers a different `UCMConnector` of its own.
    """

    # Blocks come from the store's tiers; disk is the outermost one that can supply them
    # (vLLM 0.32 and later label hits by source; earlier versions have no such label).
    # With no label (None) the base class's default stays in place.
    _cache_hit_source = cache_hit_source("DISK") or getattr(KVConnectorBase_V1, "_cache_hit_source", None)

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._config = load_config(self._kv_transfer_config.kv_connector_extra_config)
        ns, hashes_per_block = _namespace(vllm_config, kv_cache_config, self._config)
        self._keys = KeyMaker(ns, hashes_per_block)
        shard_sizes = [ns.shard_bytes] if ns.layerwise else [ns.shard_bytes] * ns.num_layers
        self._scheduler: SchedulerSide | None = None
        self._scheduler_store: StoreLike | None = None
        self._worker: WorkerSide | None = None
        self._layer_names = list(kv_cache_config.kv_cache_groups[0].layer_names)
        self._check_hash_seed(vllm_config.cache_config.prefix_caching_hash_algo)
        self._check_failure_policy()
        if role == KVConnectorRole.SCHEDULER:
            store = open_store(self._config, shard_sizes, lookup_only=True)
            self._scheduler_store = store
            self._scheduler = SchedulerSide(
                store,
                self._keys,
                ns.block_size,
                lookup_timeout_s=lookup_bound(self._config.load_timeout_s),
                pack_blocks=self._config.pack_blocks,
            )
            logger.info(
                "UCMConnector scheduler: config %s, pipeline %s, namespace %s",
                self._config.source,
                self._config.store_config.get("store_pipeline"),
                ns,
            )
        else:
            config = self._config
            self._worker = WorkerSide(
                open_store=lambda sizes: open_store(config, sizes),
                keys=self._keys,
                tp_rank=_tp_rank(),
                event_sync=config.enable_event_sync,
                wait_persisted=config.wait_persisted,
                load_timeout_s=config.load_timeout_s,
                dump_timeout_s=config.dump_timeout_s,
            )

    @staticmethod
    def _check_hash_seed(hash_algo: str) -> None:
        """Non-cryptographic block hashes are seeded per process unless PYTHONHASHSEED is set."""
        if os.environ.get("PYTHONHASHSEED") is None and not hash_algo.startswith("sha256"):
            logger.warning(
                "UCMConnector: PYTHONHASHSEED is unset and the block hash is %s: instances will "
                "not share blocks. Set the same PYTHONHASHSEED on every instance.",
                hash_algo,
            )

    def _check_failure_policy(self) -> None:
        """A load error must cost a recompute, not the request: say so when it would not."""
        ktc = self._kv_transfer_config
        if "kv_load_failure_policy" in ktc.kv_connector_extra_config:
            logger.warning(
                "UCMConnector: kv_load_failure_policy inside kv_connector_extra_config is ignored "
                "by vLLM; put it at the top level of --kv-transfer-config"
            )
        if getattr(ktc, "kv_load_failure_policy", "recompute") != "recompute":
            logger.warning(
                "UCMConnector: kv_load_failure_policy is %r: a corrupt or missing block will fail "
                'its request; set "kv_load_failure_policy": "recompute" in --kv-transfer-config',
                ktc.kv_load_failure_policy,
            )

    # A best-effort cache: a dropped save is a future miss, never something to redeliver.
    @property
    def requires_kv_delivery(self) -> bool:
        return False

    # ---- worker role ------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches, self._layer_names, self._keys.namespace.shard_bytes)

    def _meta(self) -> UCMConnectorMetadata | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, UCMConnectorMetadata) else None

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._meta()
        if self._worker is not None and meta is not None:
            self._worker.start_load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._worker is not None:
            self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        meta = self._meta()
        if self._worker is not None and meta is not None:
            self._worker.save_layer(layer_name, meta)

    def wait_for_save(self) -> None:
        if self._worker is not None:
            self._worker.wait_for_save(self._meta())

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors() if self._worker is not None else set()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._worker is not None:
            return self._worker.take_stats()
        if self._scheduler is not None:  # vLLM aggregates the scheduler side's stats too
            errors = self._scheduler.take_lookup_errors()
            return UCMConnectorStats(data=dict(errors)) if errors else None
        return None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return UCMConnectorStats.from_data(data)

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        # The stats this connector reports reach Prometheus; MultiConnector requires it of
        # every child that reports stats.
        return UCMPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        store = self._scheduler_store
        if store is not None:
            self._scheduler_store = None
            store.close()

    # ---- scheduler role -----------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self._scheduler is not None and connector_output.invalid_block_ids:
            self._scheduler.on_load_errors(set(connector_output.invalid_block_ids))

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self._scheduler is not None:
            self._scheduler.request_finished(request)
        return False, None

    def reset_cache(self) -> bool | None:
        if self._scheduler is not None:
            self._scheduler.reset()
        return True


UCMConnector = UcmctlConnector

# vLLM's MultiConnector looks its children up by class name (to rebuild their stats); a connector
# loaded by module path is not in that registry unless it registers itself. The guides' name is
# registered too where no other connector holds it.
register_with_factory(UcmctlConnector.__name__, __name__, UcmctlConnector.__name__)
register_with_factory("UCMConnector", __name__, UcmctlConnector.__name__)
