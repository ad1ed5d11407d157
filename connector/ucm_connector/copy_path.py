"""The device copy path: how whole KV blocks reach host memory the store can read or write.

A stored block is one shard per layer: the bytes of that block in that layer's paged cache.
`HostCopyBackend` serves caches that live in host memory (vLLM's CPU backend) without any
copy: the store reads and writes the paged cache in place. `StagedCopyBackend` serves device
caches (CUDA, Ascend, ...): it gathers blocks into pinned host staging buffers with
`non_blocking` copies on a side stream, ordered after the compute stream by an event when
`enable_event_sync` is on (a full device synchronize otherwise). Only the generic
`torch.Stream` / `torch.Event` / `torch.accelerator` APIs are used, so no backend-specific
module (such as torch.cuda) is touched, and nothing device-related runs on CPU.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

Shard = tuple[int, int]  # (host address, nbytes)


@dataclass
class KVLayout:
    """The paged KV cache as the connector sees it: one tensor per layer, blocks on dim 0."""

    layer_names: list[str]
    tensors: list[torch.Tensor]
    shard_bytes: int

    @classmethod
    def from_kv_caches(cls, kv_caches: dict[str, torch.Tensor], layer_order: Sequence[str]) -> KVLayout:
        names = [n for n in layer_order if n in kv_caches] or list(kv_caches)
        missing = sorted(set(kv_caches) - set(names))
        names += missing
        tensors = [kv_caches[n] for n in names]
        sizes = {t[0].numel() * t.element_size() for t in tensors}
        if len(sizes) != 1:
            raise ValueError(f"KV cache layers differ in bytes per block: {sorted(sizes)}")
        return cls(layer_names=names, tensors=tensors, shard_bytes=sizes.pop())

    @property
    def num_layers(self) -> int:
        return len(self.tensors)

    def layer_index(self, layer_name: str) -> int:
        return self.layer_names.index(layer_name)

    def blocks_are_contiguous(self) -> bool:
        """True when each (block, layer) is one contiguous byte range."""
        return all(
            t[0].is_contiguous() and t.stride(0) * t.element_size() == self.shard_bytes for t in self.tensors
        )


class CopyBackend(ABC):
    """Moves whole blocks between the paged cache and host shards the store can address."""

    def __init__(self, layout: KVLayout) -> None:
        self.layout = layout

    def _layers(self, layers: Sequence[int] | None) -> Sequence[int]:
        return range(self.layout.num_layers) if layers is None else layers

    @abstractmethod
    def dump_sources(
        self, block_ids: Sequence[int], layers: Sequence[int] | None = None
    ) -> list[list[Shard]]:
        """Host shards holding the current bytes of `block_ids` (per block, per layer).

        Called after the forward wrote them; the shards stay valid until `release_dump`.
        """

    def release_dump(self) -> None:
        """The store has copied the dump sources out; staging may be reused."""
        return None

    @abstractmethod
    def load_targets(
        self, block_ids: Sequence[int], layers: Sequence[int] | None = None
    ) -> list[list[Shard]]:
        """Host shards the store should write the bytes of `block_ids` into."""

    def finish_load(self, block_ids: Sequence[int], layers: Sequence[int] | None = None) -> None:
        """Make loaded bytes visible in the paged cache before the forward reads them."""
        return None


class HostCopyBackend(CopyBackend):
    """Zero-copy: the paged cache is host memory, so shards point straight into it."""

    def __init__(self, layout: KVLayout) -> None:
        super().__init__(layout)
        if not layout.blocks_are_contiguous():
            raise ValueError("HostCopyBackend needs each (block, layer) to be contiguous")
        self._bases = [t.data_ptr() for t in layout.tensors]
        self._num_blocks = [t.shape[0] for t in layout.tensors]

    def _shards(self, block_ids: Sequence[int], layers: Sequence[int] | None) -> list[list[Shard]]:
        n = self.layout.shard_bytes
        out = []
        for b in block_ids:
            if not 0 <= b < self._num_blocks[0]:
                raise IndexError(f"block id {b} outside the KV cache (0..{self._num_blocks[0] - 1})")
            out.append([(self._bases[li] + b * n, n) for li in self._layers(layers)])
        return out

    def dump_sources(
        self, block_ids: Sequence[int], layers: Sequence[int] | None = None
    ) -> list[list[Shard]]:
        return self._shards(block_ids, layers)

    def load_targets(
        self, block_ids: Sequence[int], layers: Sequence[int] | None = None
    ) -> list[list[Shard]]:
        return self._shards(block_ids, layers)


class StagedCopyBackend(CopyBackend):
    """Device caches: gather blocks into pinned host staging with asynchronous copies."""

    def __init__(self, layout: KVLayout, event_sync: bool = True) -> None:
        super().__init__(layout)
        self.device = layout.tensors[0].device
        self._event_sync = event_sync
        self._on_device = self.device.type != "cpu"
        self._stream = torch.Stream(self.device) if self._on_device else None
        self._bufs: dict[tuple, torch.Tensor] = {}
        self._load_done: torch.Event | None = None

    def _buffer(self, key: tuple, nbytes: int) -> torch.Tensor:
        # One buffer per (direction, layers): layerwise transfers of different layers are in
        # flight at the same time and must not share staging.
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < nbytes:
            # Pinned memory lets non_blocking copies overlap; grow geometrically to amortize.
            size = max(nbytes, 2 * (buf.numel() if buf is not None else 0))
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=self._on_device)
            self._bufs[key] = buf
        return buf

    def _views(self, buf: torch.Tensor, nblocks: int, nlayers: int) -> torch.Tensor:
        n = self.layout.shard_bytes
        return buf[: nblocks * nlayers * n].view(nblocks, nlayers, n)

    def _after_compute(self) -> None:
        """Order the side stream after the compute stream's writes to the cache."""
        if not self._on_device:
            return
        if self._event_sync:
            event = torch.Event(self.device)
            event.record(torch.accelerator.current_stream(self.device))
            assert self._stream is not None
            self._stream.wait_event(event)
        else:
            torch.accelerator.synchronize(self.device)

    def _block_bytes(self, layer: int, block_ids: Sequence[int]) -> torch.Tensor:
        t = self.layout.tensors[layer]
        idx = torch.tensor(list(block_ids), device=self.device, dtype=torch.long)
        return t.index_select(0, idx).reshape(len(block_ids), -1).view(torch.uint8)

    def dump_sources(
        self, block_ids: Sequence[int], layers: Sequence[int] | None = None
    ) -> list[list[Shard]]:
        layers = list(self._layers(layers))
        views = self._views(
            self._buffer(("dump", *layers), len(block_ids) * len(layers) * self.layout.shard_bytes),
            len(block_ids),
            len(layers),
        )
        self._after_compute()
        with self._stream if self._stream is not None else contextlib.nullcontext():
            for j, li in enumerate(layers):
                views[:, j].copy_(self._block_bytes(li, block_ids), non_blocking=True)
        if self._stream is not None:
            self._stream.synchronize()  # the store reads the host bytes next
        return _shards_of(views)

    def load_targets(
        self, block_ids: Sequence[int], layers: Sequence[int] | None = None
    ) -> list[list[Shard]]:
        layers = list(self._layers(layers))
        if self._load_done is not None:
            self._load_done.synchronize()  # the previous host-to-device copy still reads it
            self._load_done = None
        views = self._views(
            self._buffer(("load", *layers), len(block_ids) * len(layers) * self.layout.shard_bytes),
            len(block_ids),
            len(layers),
        )
        return _shards_of(views)

    def finish_load(self, block_ids: Sequence[int], layers: Sequence[int] | None = None) -> None:
        layers = list(self._layers(layers))
        views = self._views(self._bufs[("load", *layers)], len(block_ids), len(layers))
        idx = torch.tensor(list(block_ids), device=self.device, dtype=torch.long)
        for j, li in enumerate(layers):
            t = self.layout.tensors[li]
            src = views[:, j].to(self.device, non_blocking=True)
            t.index_copy_(0, idx, src.view(t.dtype).view(len(block_ids), *t.shape[1:]))
        if self._on_device:
            # The copies run on the current stream, so the forward that follows on it is
            # ordered after them without blocking the host; the event only guards the staging
            # buffer against reuse by the next load.
            self._load_done = torch.Event(self.device)
            self._load_done.record(torch.accelerator.current_stream(self.device))


def _shards_of(views: torch.Tensor) -> list[list[Shard]]:
    base = views.data_ptr()
    nblocks, nlayers, n = views.shape
    return [[(base + (i * nlayers + j) * n, n) for j in range(nlayers)] for i in range(nblocks)]


def make_copy_backend(layout: KVLayout, event_sync: bool) -> CopyBackend:
    """Zero-copy when the cache is host memory with contiguous blocks, staged otherwise."""
    if layout.tensors[0].device.type == "cpu" and layout.blocks_are_contiguous():
        return HostCopyBackend(layout)
    return StagedCopyBackend(layout, event_sync=event_sync)
