"""The proxy's subscriptions to vLLM's KV-cache events: what each instance's own cache really
holds, read into the routing index (kv_index) instead of guessed from the routing history.

Each configured instance that publishes (`--kv-events URL=tcp://HOST:PORT`: the engine binds
`tcp://*:PORT`, the proxy connects, as vLLM's own publisher expects) gets one task that reads
its batches (kv_events.decode) and applies them: blocks stored in the engine's cache are held
by the instance, blocks removed are not, a cleared cache holds nothing (a new `epoch`). The
batches are numbered; a gap (the publisher's buffer overran, or the proxy missed some while it
reconnected) means blocks may have gone unseen, so the instance is taken to hold nothing, as
after a clear or a restart (batches numbered from 1 again), until new events say otherwise.
A malformed event is counted and skipped, never a crash. Where no event arrives, the routing
history still fills the index (the approximate source), so a feed that cannot be reached costs
accuracy, not requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from ucmctl.proxy.kv_events import MEDIUM_HBM, BadEvent, Cleared, Removed, Stored, Translation, decode
from ucmctl.proxy.kv_index import KvIndex
from ucmctl.proxy.pool import Instance, Pool

log = logging.getLogger("ucmctl.proxy")


@dataclass
class FeedStats:
    """What one instance's feed has read (the proxy's /metrics and /routing show them)."""

    url: str
    endpoint: str
    batches: int = 0
    events: int = 0
    bad: int = 0  # malformed events or batches, skipped
    gaps: int = 0  # batches missed: the instance then counts as holding nothing (as after a restart)
    unknown_parent: int = 0  # stored blocks whose prefix was never seen stored (no key)
    last_seq: int | None = None


@dataclass
class Feed:
    """Applies one instance's event batches to the index."""

    url: str
    endpoint: str
    model: str  # the served name requests carry: the block keys' seed
    pool: Pool
    index: KvIndex
    translation: Translation = field(init=False)
    stats: FeedStats = field(init=False)

    def __post_init__(self) -> None:
        self.translation = Translation(self.model)
        self.stats = FeedStats(self.url, self.endpoint)

    def instances(self) -> list[Instance]:
        """The pool's instances at the feed's URL (one per role it takes)."""
        return [i for i in self.pool.find(self.url) if not i.removed]

    def apply(self, seq: int | None, payload: bytes) -> None:
        """One batch, numbered `seq` (None: unnumbered)."""
        s = self.stats
        insts = self.instances()
        if seq is not None and s.last_seq is not None and seq != s.last_seq + 1:
            # numbered from 1 again: the publisher restarted (its cache is new); ahead: missed
            s.gaps += seq > s.last_seq
            self._forget(insts)
        if seq is not None:
            s.last_seq = seq
        try:
            events = decode(payload)
        except BadEvent:
            s.bad += 1
            return
        s.batches += 1
        for event in events:
            if isinstance(event, BadEvent):
                s.bad += 1
                continue
            s.events += 1
            self._one(insts, event)

    def _one(self, insts: list[Instance], event: Stored | Removed | Cleared) -> None:
        if isinstance(event, Cleared):
            self._forget(insts)
        elif event.medium not in MEDIUM_HBM:
            return  # a connector's medium (the store): the store's content is read elsewhere
        elif isinstance(event, Stored):
            keys = self.translation.stored(event)
            if keys is None:
                self.stats.unknown_parent += 1
                return
            for inst in insts:
                self.index.took(keys, inst, saved=False)
        else:
            keys = self.translation.removed(event)
            for inst in insts:
                self.index.lost(keys, inst)

    def _forget(self, insts: list[Instance]) -> None:
        """The instance holds nothing the index knew of (its earlier epoch's blocks are gone)."""
        for inst in insts:
            inst.cache_lost()


async def follow(feed: Feed, retry_s: float = 1.0) -> None:
    """Read `feed`'s endpoint until cancelled; reconnect after an error (ZMQ itself reconnects a
    connected SUB socket to a publisher that restarts)."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context.instance()
    while True:
        sock = ctx.socket(zmq.SUB)
        try:
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IPV6, 1)  # a [v6] endpoint's, harmless for v4
            sock.connect(feed.endpoint)
            while True:
                parts = await sock.recv_multipart()
                seq = int.from_bytes(parts[1], "big") if len(parts) == 3 and len(parts[1]) == 8 else None
                feed.apply(seq, parts[-1])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken socket: log, wait, connect again
            log.warning("kv events from %s (%s): %s; reconnecting", feed.url, feed.endpoint, exc)
            await asyncio.sleep(retry_s)
        finally:
            sock.close()


async def run_feeds(feeds: list[Feed]) -> None:
    """Every feed until cancelled."""
    tasks = [asyncio.create_task(follow(f)) for f in feeds]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
