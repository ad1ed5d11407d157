"""`ucmctl proxy`: the command the Plan launches (the lead registers `proxy` on the main app)."""

from __future__ import annotations

import os
from typing import Any

import typer

from ucmctl.proxy import routing

# the options make_config takes by name; every other option is a tuning value of the config
TAKEN = {
    "roles",
    "host",
    "port",
    "mode",
    "p2p",
    "prefiller",
    "bootstrap",
    "decoder",
    "instance",
    "routing_name",
    "prefix_affinity",
    "kv_events",
}


def proxy(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(7802, "--port", help="port to listen on"),
    mode: str = typer.Option(
        "pd", "--mode", help="pd (prefill then decode) or mixed (one instance does both)"
    ),
    p2p: str | None = typer.Option(
        None,
        "--p2p",
        help="P2P KV transfer protocol: mooncake (vLLM's MooncakeConnector) or ascend "
        "(vllm-ascend's MooncakeConnectorV1)",
    ),
    prefiller: list[str] = typer.Option([], "--prefiller", help="prefill instance URL (repeat)"),
    bootstrap: list[str] = typer.Option(
        [], "--bootstrap", help="--p2p mooncake: each prefiller's bootstrap URL, same order"
    ),
    decoder: list[str] = typer.Option([], "--decoder", help="decode instance URL (repeat)"),
    instance: list[str] = typer.Option([], "--instance", help="mixed-mode instance URL (repeat)"),
    routing_name: str = typer.Option(
        routing.DEFAULT,
        "--routing",
        help="which instance takes a request: " + ", ".join(routing.POLICIES),
    ),
    prefix_affinity: bool = typer.Option(False, "--prefix-affinity", hidden=True, help="--routing affinity"),
    affinity_tokens: int = typer.Option(128, "--affinity-tokens", help="affinity: the leading block, tokens"),
    block_size: int = typer.Option(16, "--block-size", help="the servers' KV block size, tokens"),
    direct_below: int = typer.Option(
        0,
        "--direct-below",
        help="pd with the store: send a request whose tokens not cached on the chosen decode instance "
        "are fewer than this, or any while every prefill instance is busy, to that instance alone (it "
        "prefills them; only one computing no other prompt); 0: never",
    ),
    kv_events: list[str] = typer.Option(
        [],
        "--kv-events",
        help="an instance's vLLM KV-cache events: URL=tcp://HOST:PORT (its --kv-events-config endpoint "
        "tcp://*:PORT; repeat): the kv index reads what each cache holds instead of guessing it",
    ),
    served_model: str | None = typer.Option(
        None, "--served-model", help="with --kv-events: the model name requests carry (the block keys' seed)"
    ),
    kv_store: bool = typer.Option(True, "--kv-store/--kv-no-store", hidden=True, help="kv: an ablation"),
    tokenize: bool = typer.Option(
        True, "--tokenize/--no-tokenize", help="kv, --direct-below: text prompts' ids from /tokenize (exact)"
    ),
    roles: str = typer.Option(
        "fixed",
        "--roles",
        help="fixed, or dynamic: each request whole to the instance of either side that the policy picks for "
        "its prompt (pd, store)",
    ),
    prefill_load: str = typer.Option("tokens", "--prefill-load", help="a prefill's load: tokens or requests"),
    decode_load: str = typer.Option("requests", "--decode-load", help="a decode's load: requests or tokens"),
    mixed_load: str = typer.Option("requests", "--mixed-load", help="a mixed one's: requests or tokens"),
    deployment: str | None = typer.Option(None, "--deployment", help="deployment name (a label in /metrics)"),
    health_interval: float = typer.Option(2.0, "--health-interval", help="seconds between health checks"),
    health_timeout: float = typer.Option(2.0, "--health-timeout", help="seconds a health check may take"),
    unhealthy_after: int = typer.Option(2, "--unhealthy-after", help="failures in a row that take one out"),
    retries: int = typer.Option(2, "--retries", help="retries of a leg on other instances before any byte"),
    migrations: int = typer.Option(3, "--migrations", help="moves of an answer cut mid-stream (0: none)"),
    retry_backoff: float = typer.Option(0.02, "--retry-backoff", help="first retry's delay, s (doubles)"),
    connect_timeout: float = typer.Option(5.0, "--connect-timeout", help="seconds to connect to an instance"),
    read_timeout: float = typer.Option(
        600.0, "--read-timeout", help="seconds an instance may stay silent (0: no limit)"
    ),
    stall_timeout: float = typer.Option(
        30.0,
        "--stall-timeout",
        help="seconds an instance may send nothing while it streams (or, requests waiting on it, and a "
        "probe unanswered as long) before it is out of routing and they go elsewhere (0: off)",
    ),
    max_connections: int = typer.Option(1024, "--max-connections", help="upstream connection pool size"),
) -> None:
    """Front prefill/decode (or mixed) instances: route each request, stream answers, survive failures.

    Client API key: env UCMCTL_PROXY_API_KEY (never a flag: command lines end up in logs).
    Key sent to the instances: env UCMCTL_PROXY_UPSTREAM_API_KEY.
    """
    _run(dict(locals()))


def _run(given: dict[str, Any]) -> None:
    """The proxy of the command line's values (`proxy`'s parameters by name)."""
    from ucmctl.proxy.app import run
    from ucmctl.proxy.config import make_config

    upstreams = {f"{k}s": given[k] for k in ("prefiller", "bootstrap", "decoder", "instance")}
    tuning = {k: v for k, v in given.items() if k not in TAKEN}
    named = {k: given[k] for k in ("host", "port", "mode", "p2p", "roles", "kv_events")}
    routing_name = "affinity" if given["prefix_affinity"] else given["routing_name"]
    config = make_config(**named, routing_name=routing_name, env=dict(os.environ), **upstreams, **tuning)
    run(config)
