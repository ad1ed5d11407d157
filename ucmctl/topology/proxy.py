"""The topology's `proxy` section: where the proxy runs and how it routes and recovers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from ucmctl.topology.fields import Port, Restart, Routing, Strict, bind_address


class Proxy(Strict):
    node: str | None = Field(None, description="node that runs the proxy (and its replicas)")
    nodes: list[str] | None = Field(
        None, description="instead of node: the nodes its replicas are spread over, one on each in turn"
    )
    port: Port = Field(
        7802, description="port clients connect to; replicas sharing a node listen on port, port+1, ..."
    )
    replicas: int | None = Field(
        None,
        ge=1,
        le=64,
        description="proxies that share nothing (each learns the instances' state itself), for clients "
        "that know several endpoints: one may die without the deployment losing its front door "
        "(default: 1, or one on each of nodes)",
    )
    host: str | None = Field(
        None, description="address to listen on (default: the node's bind address); 0.0.0.0 for every one"
    )
    routing: Routing = Field(
        Routing("load"),
        description="which instance takes a request: round-robin, least-loaded (load), affinity (prefix: "
        "same leading block, same instance), session (one conversation, one instance), kv (least "
        "expected time to first token from where the prompt's KV is)",
    )
    direct_below: int = Field(
        0,
        ge=0,
        description="centralized, selective disaggregation: a request goes to the chosen decode instance "
        "alone, which prefills it (only one computing no other prompt), when fewer of its tokens than this "
        "are not cached there (its own cache, then the store), or when every prefill instance is busy (a "
        "leg queued behind the one it computes); 0: always a prefill leg first",
    )
    kv_events: bool = Field(
        True,
        description="routing kv or direct_below: every server publishes its KV-cache events and the proxy "
        "reads what each one's cache holds from them (servers of one engine each); false: the proxy's "
        "routing history alone",
    )
    roles: Literal["fixed", "dynamic"] = Field(
        "fixed",
        description="centralized: dynamic sends each request whole to the API server of either side the "
        "routing policy picks for its prompt, which prefills and decodes it; fixed keeps each to its side",
    )
    migrations: int = Field(
        3,
        ge=0,
        le=100,
        description="times one streamed answer may move to another instance when its instance fails "
        "mid-answer (it goes on from the prompt and the tokens so far, their KV from the store); 0: the "
        "answer ends with an error instead",
    )
    stall_timeout: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="seconds a server streaming answers may send no token (it hangs on its device, or "
        "its node is cut off without a reset) before it leaves routing and its answers go on on another "
        "server, as after a failure; one with requests waiting and nothing sent is asked for one token "
        "then, and leaves if that does not come within as long (a prompt that takes twice this to "
        "prefill alone on a server looks so: raise it); back once it answers a one-token completion; "
        "0: off (they wait for the read timeout, 600 s)",
    )
    restart: Restart = Field(default_factory=Restart, description="never, or on-failure (see the sides)")

    @field_validator("restart", mode="before")
    @classmethod
    def _restart(cls, v: Any) -> Any:
        return Restart.parse(v)

    @field_validator("host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        return None if v is None else bind_address(v)

    def places(self) -> list[tuple[str, str, int]]:
        """Each replica's process name, node and port, in order (the nodes taken in turn): one
        proxy is `proxy`, replicas are `proxy-0`, `proxy-1`, ..."""
        nodes = self.nodes or ([self.node] if self.node else [])
        count = (self.replicas or len(nodes)) if nodes else 0
        names = ["proxy"] if count == 1 else [f"proxy-{i}" for i in range(count)]
        return [(names[i], nodes[i % len(nodes)], self.port + i // len(nodes)) for i in range(count)]
