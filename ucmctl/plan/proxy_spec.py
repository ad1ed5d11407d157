"""The proxy's settings as the Plan holds them: a structure built once (plan/build.py), turned into
the `ucmctl proxy` command line in one place (`ProxySpec.argv`), read by `render --k8s` as a
structure (its listener and its upstreams' addresses replaced, then the same argv)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from ucmctl.core import routing_names


class Upstream(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str  # the API server, as the proxy reaches it
    role: Literal["prefill", "decode", "mixed"]
    bootstrap: str | None = None  # P2P mooncake: the prefiller's bootstrap server
    kv_events: str | None = None  # where its KV-cache events are published (tcp://HOST:PORT)


class ProxySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str  # the interpreter that runs ucmctl on the proxy's node (or in its container)
    host: str  # the address it listens on
    port: int
    mode: Literal["pd", "mixed"]
    p2p: str | None = None  # the P2P router protocol (mooncake, ascend); None: the store hands KV over
    routing: str = routing_names.DEFAULT  # a policy of ucmctl.core.routing_names.POLICIES
    upstreams: tuple[Upstream, ...] = ()  # in the Plan's order of the servers
    block_size: int | None = None  # the servers' KV block size, where the topology sets it
    direct_below: int = 0  # centralized: fewer tokens to compute than this go to a decode alone
    roles: Literal["fixed", "dynamic"] = "fixed"  # dynamic: any server takes either leg (centralized)
    served_model: str | None = None  # the model name requests carry (the KV events' block keys)
    migrations: int = 3  # moves of one streamed answer cut mid-stream (the proxy's own default: 3)
    stall_timeout: float = 30.0  # s without a token from a streaming server: its answers move (default 30)

    def argv(self) -> list[str]:
        """The command line that runs this proxy."""
        argv = [self.python, "-m", "ucmctl", "proxy", "--host", self.host, "--port", str(self.port)]
        argv += ["--mode", self.mode]
        if self.mode == "mixed":
            for u in self.upstreams:
                argv += ["--instance", u.url]
        else:
            if self.p2p:
                argv += ["--p2p", self.p2p]
            for u in self.upstreams:
                argv += ["--prefiller" if u.role == "prefill" else "--decoder", u.url]
            for u in self.upstreams:
                if u.bootstrap:
                    argv += ["--bootstrap", u.bootstrap]
        if self.routing != routing_names.DEFAULT:
            argv += ["--routing", self.routing]
        cuts = self.routing == "kv" or self.direct_below  # prompts into the servers' blocks
        if cuts and self.block_size:
            argv += ["--block-size", str(self.block_size)]
        if self.direct_below:
            argv += ["--direct-below", str(self.direct_below)]
        if self.roles == "dynamic":
            argv += ["--roles", "dynamic"]
        if self.migrations != 3:
            argv += ["--migrations", str(self.migrations)]
        if self.stall_timeout != 30.0:
            argv += ["--stall-timeout", f"{self.stall_timeout:g}"]
        feeds = [f"{u.url}={u.kv_events}" for u in self.upstreams if u.kv_events]
        for feed in feeds:
            argv += ["--kv-events", feed]
        if feeds and self.served_model:
            argv += ["--served-model", self.served_model]
        return argv
