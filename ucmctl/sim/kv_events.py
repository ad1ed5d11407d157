"""The simulator's KV-cache events, published as vLLM publishes them (`--kv-events-config`,
publisher zmq): a PUB socket bound to the endpoint (`tcp://*:PORT`; the port plus the rank for
each data-parallel rank), multipart messages of (topic, sequence number as 8 big-endian bytes,
msgpack `KVEventBatch` [ts, events, data_parallel_rank]). The events are the prefix cache's
(sim/prefix_cache.py): blocks stored, blocks removed, the cache cleared. A subscriber that is
not there yet misses what was sent before it came, as with vLLM (no replay here)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ucmctl.core.errors import UcmctlError


@dataclass(frozen=True)
class EventsConfig:
    endpoint: str  # tcp://*:PORT
    topic: str = ""


def parse_events_config(raw: str | None) -> EventsConfig | None:
    """`--kv-events-config` as vLLM reads it; None when events are off. A value that is not
    JSON, or another publisher than zmq, is one line."""
    if raw is None:
        return None
    try:
        cfg = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UcmctlError.one(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(cfg, dict) or not cfg.get("enable_kv_cache_events"):
        return None
    if cfg.get("publisher", "zmq") != "zmq":
        raise UcmctlError.one(
            f"--kv-events-config publisher {cfg['publisher']!r}: the simulator publishes zmq"
        )
    endpoint = str(cfg.get("endpoint", "tcp://*:5557"))
    if not endpoint.startswith("tcp://") or not endpoint.rpartition(":")[2].isdigit():
        raise UcmctlError.one(f"--kv-events-config endpoint {endpoint!r} is not tcp://HOST:PORT")
    return EventsConfig(endpoint, str(cfg.get("topic", "")))


class Publisher:
    """One engine's (DP rank's) event publisher."""

    def __init__(self, config: EventsConfig, rank: int) -> None:
        import zmq

        host, _, port = config.endpoint.rpartition(":")
        address = f"{host}:{int(port) + rank}"
        self._zmq = zmq
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as exc:  # the port taken, an address not this machine's
            self._sock.close()
            why = zmq.strerror(exc.errno or 0)
            raise UcmctlError.one(
                f"--kv-events-config: cannot publish KV-cache events on {address}: {why}",
                fix="give the endpoint a free port of this machine",
            ) from None
        self._topic = config.topic.encode()
        self._rank = rank
        self._seq = 0

    def send(self, events: list[dict[str, Any]]) -> None:
        import msgspec

        self._seq += 1
        payload = msgspec.msgpack.encode([time.time(), events, self._rank])
        # a slow or absent subscriber never holds the engine up: ZMQ drops past its buffer
        self._sock.send_multipart([self._topic, self._seq.to_bytes(8, "big"), payload], self._zmq.NOBLOCK)

    def close(self) -> None:
        self._sock.close()
