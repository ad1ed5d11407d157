"""What the proxy runs with, checked once at start: a bad value is one clear line, exit code 2."""

from __future__ import annotations

from dataclasses import dataclass, field

from yarl import URL

from ucmctl.core.endpoints import tcp_url
from ucmctl.core.errors import UcmctlError
from ucmctl.proxy import routing
from ucmctl.proxy.pool import LoadKind

MODES = ("pd", "mixed")
# P2P router protocols: vLLM's MooncakeConnector (a transfer_id per request, the prefiller's
# engine from its bootstrap server) and vllm-ascend's MooncakeConnectorV1 (the prefiller
# returns the decode leg's kv_transfer_params).
P2P_PROTOCOLS = ("mooncake", "ascend")
API_KEY_ENV = "UCMCTL_PROXY_API_KEY"
UPSTREAM_API_KEY_ENV = "UCMCTL_PROXY_UPSTREAM_API_KEY"
LOAD_KINDS = ("tokens", "requests")
ROLE_MODES = ("fixed", "dynamic")
# each leg's load measure by default: a prefill's cost is its prompt, a decode's its streams
DEFAULT_LOADS: dict[str, LoadKind] = {"prefill": "tokens", "decode": "requests", "mixed": "requests"}


@dataclass(frozen=True)
class ProxyConfig:
    """Everything the proxy needs; built by `make_config`, never from raw user input."""

    host: str = "127.0.0.1"
    port: int = 7802
    mode: str = "pd"
    p2p: str | None = None  # one of P2P_PROTOCOLS
    prefillers: tuple[str, ...] = ()
    bootstraps: tuple[str, ...] = ()  # mooncake: each prefiller's bootstrap server, same order
    decoders: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()
    routing: str = routing.DEFAULT  # a policy of ucmctl.proxy.routing.POLICIES
    prefill_load: LoadKind = DEFAULT_LOADS["prefill"]
    decode_load: LoadKind = DEFAULT_LOADS["decode"]
    mixed_load: LoadKind = DEFAULT_LOADS["mixed"]
    affinity_tokens: int = 128
    block_size: int = 16  # the servers' KV block size: how `kv` routing cuts prompts
    # pd with the store: a request whose tokens not cached on the chosen decode instance (its own
    # cache, then the store) are fewer than this goes to it alone, which prefills it; 0: never
    direct_below: int = 0
    # pd with the store: roles per request, any instance takes a prefill or a decode leg
    dynamic_roles: bool = False
    # (instance URL, ZMQ endpoint) of the instances whose vLLM KV-cache events the index reads
    kv_events: tuple[tuple[str, str], ...] = ()
    served_model: str | None = None  # the model name requests carry: the block keys' seed
    tokenize: bool = True  # where the index is read: text prompts' token ids from /tokenize
    kv_store: bool = True  # kv: the store's content counts (False: an ablation, benchmarks/routing.py)
    deployment: str | None = None
    health_interval: float = 2.0
    health_timeout: float = 2.0
    unhealthy_after: int = 2
    retries: int = 2
    # times one streamed answer may move to another instance after its upstream failed mid-stream
    migrations: int = 3
    retry_backoff: float = 0.02
    connect_timeout: float = 5.0
    read_timeout: float = 600.0
    # an instance streaming answers none of which brought a byte for this long is stalled: out of
    # routing, its answers cut and gone on elsewhere (proxy/stall); 0: only the read timeout
    stall_timeout: float = 30.0
    max_connections: int = 1024
    max_body_mb: int = 64
    api_key: str | None = field(default=None, repr=False)
    upstream_api_key: str | None = field(default=None, repr=False)

    def load(self, role: str) -> LoadKind:
        """How the load of a leg of `role` is measured."""
        return {"prefill": self.prefill_load, "decode": self.decode_load}.get(role, self.mixed_load)


def normalize_url(url: str, flag: str) -> str:
    """An instance's base URL (`http://host:port`), or a one-line error naming the flag."""
    text = url.strip().rstrip("/")
    if text.endswith("/v1"):  # users often paste the OpenAI base URL
        text = text[:-3]
    try:
        parsed = URL(text)
    except ValueError as exc:
        raise UcmctlError.one(f"{flag} {url!r} is not a URL: {exc}", fix="write http://HOST:PORT") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UcmctlError.one(f"{flag} {url!r} is not an http(s) URL", fix="write http://HOST:PORT")
    if parsed.path not in ("", "/") or parsed.query_string:
        raise UcmctlError.one(f"{flag} {url!r} has a path or query", fix="give only http://HOST:PORT")
    if parsed.explicit_port is None:
        raise UcmctlError.one(f"{flag} {url!r} has no port", fix="write http://HOST:PORT")
    return str(parsed.origin())


def _urls(urls: list[str] | tuple[str, ...], flag: str) -> tuple[str, ...]:
    out = tuple(normalize_url(u, flag) for u in urls)
    dup = sorted({u for u in out if out.count(u) > 1})
    if dup:
        raise UcmctlError.one(f"{flag} {dup[0]} is given twice", fix="list each instance once")
    return out


def _positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = "0 or more" if allow_zero else "more than 0"
        raise UcmctlError.one(
            f"{name} is {value}; it must be {bound}", fix=f"pass {name} with a value {bound}"
        )


def make_config(
    *,
    host: str,
    port: int,
    mode: str,
    p2p: str | None = None,
    prefillers: list[str] | tuple[str, ...] = (),
    bootstraps: list[str] | tuple[str, ...] = (),
    decoders: list[str] | tuple[str, ...] = (),
    instances: list[str] | tuple[str, ...] = (),
    routing_name: str = routing.DEFAULT,
    roles: str = "fixed",
    kv_events: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    **tuning: object,
) -> ProxyConfig:
    """Check the command line's values and return the config, or raise one UcmctlError."""
    if mode not in MODES:
        raise UcmctlError.one(f"--mode {mode!r} is not a mode", fix="use --mode pd or --mode mixed")
    if roles not in ROLE_MODES:
        raise UcmctlError.one(
            f"--roles {roles!r} is not fixed or dynamic", fix="use --roles fixed or --roles dynamic"
        )
    tuning["dynamic_roles"] = roles == "dynamic"
    if not 1 <= port <= 65535:
        raise UcmctlError.one(f"--port {port} is out of range", fix="use a port from 1 to 65535")
    pre, dec, mix = (
        _urls(prefillers, "--prefiller"),
        _urls(decoders, "--decoder"),
        _urls(instances, "--instance"),
    )
    _check_upstreams(mode, p2p, pre, dec, mix)
    boot = _urls(bootstraps, "--bootstrap")
    if p2p == "mooncake" and len(boot) != len(pre):
        raise UcmctlError.one(
            f"--p2p mooncake needs one --bootstrap per --prefiller ({len(pre)}), got {len(boot)}",
            fix="add --bootstrap http://HOST:VLLM_MOONCAKE_BOOTSTRAP_PORT for each prefiller, same order",
        )
    if tuning["dynamic_roles"] and (mode != "pd" or p2p):
        raise UcmctlError.one(
            "--roles dynamic is for pd mode with the store (no --p2p): a P2P leg needs its connector role",
            fix="drop --roles dynamic",
        )
    if tuning.get("direct_below") and (mode != "pd" or p2p):
        raise UcmctlError.one(
            "--direct-below is for pd mode with the store (no --p2p): a P2P decode needs a transfer",
            fix="drop --direct-below",
        )
    if boot and p2p != "mooncake":
        raise UcmctlError.one(
            "--bootstrap is for --p2p mooncake", fix="drop --bootstrap or add --p2p mooncake"
        )
    policy = routing.canonical(routing_name)
    if policy is None:
        raise UcmctlError.one(
            f"--routing {routing_name!r} is not a routing policy",
            fix=f"use one of {', '.join(routing.POLICIES)}",
        )
    _check_tuning(tuning)
    feeds = _kv_events(kv_events, (*pre, *dec, *mix))
    if feeds:
        _check_feeds(policy, tuning)
    env = env or {}
    return ProxyConfig(
        host=host,
        port=port,
        mode=mode,
        p2p=p2p,
        prefillers=pre,
        bootstraps=boot,
        decoders=dec,
        instances=mix,
        routing=policy,
        kv_events=feeds,
        api_key=env.get(API_KEY_ENV) or None,
        upstream_api_key=env.get(UPSTREAM_API_KEY_ENV) or None,
        **tuning,  # type: ignore[arg-type]
    )


def _kv_events(given: list[str] | tuple[str, ...], upstreams: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Each `URL=tcp://HOST:PORT` as (the instance's URL, the endpoint), or one UcmctlError."""
    out: list[tuple[str, str]] = []
    for item in given:
        url, sep, endpoint = item.partition("=")
        fix = "write --kv-events http://HOST:PORT=tcp://HOST:EVENTS_PORT"
        if not sep:
            raise UcmctlError.one(f"--kv-events {item!r} has no '='", fix=fix)
        url = normalize_url(url, "--kv-events")
        if url not in upstreams:
            fix_url = "name a --prefiller, --decoder or --instance URL"
            raise UcmctlError.one(f"--kv-events {url} is not an instance of this proxy", fix=fix_url)
        endpoint = _tcp_endpoint(endpoint)
        if not endpoint:
            raise UcmctlError.one(
                f"--kv-events {url}: {item.partition('=')[2]!r} is not tcp://HOST:PORT", fix=fix
            )
        if any(u == url for u, _ in out):
            raise UcmctlError.one(f"--kv-events {url} is given twice", fix="give each instance one endpoint")
        out.append((url, endpoint))
    return tuple(out)


def _check_feeds(policy: str, tuning: dict[str, object]) -> None:
    """--kv-events need a reader of the index and the model name that seeds its keys."""
    if not (routing.POLICIES[policy].needs_blocks or tuning.get("direct_below")):
        raise UcmctlError.one(
            f"--kv-events feeds the proxy's KV index, which --routing {policy} does not read",
            fix="use --routing kv (or --direct-below), or drop --kv-events",
        )
    if not tuning.get("served_model"):
        raise UcmctlError.one(
            "--kv-events needs --served-model: the model name requests carry seeds the block keys",
            fix="add --served-model NAME (the servers' --served-model-name)",
        )


def _tcp_endpoint(text: str) -> str:
    """`tcp://HOST:PORT` as ZMQ takes it, or "" when `text` is not one."""
    try:
        parsed = URL(text)
        port = parsed.explicit_port
    except ValueError:
        return ""
    if parsed.scheme != "tcp" or not parsed.host or port is None or parsed.path not in ("", "/"):
        return ""
    return tcp_url(parsed.raw_host or "", port)


def _check_upstreams(
    mode: str, p2p: str | None, pre: tuple[str, ...], dec: tuple[str, ...], mix: tuple[str, ...]
) -> None:
    """Raise one UcmctlError unless the upstream URLs fit the mode and the P2P protocol is known."""
    if mode == "pd":
        if mix:
            raise UcmctlError.one(
                "--instance is for --mode mixed", fix="use --prefiller/--decoder in pd mode"
            )
        if not pre or not dec:
            missing = "--prefiller" if not pre else "--decoder"
            raise UcmctlError.one(
                f"pd mode needs at least one {missing}", fix=f"add {missing} http://HOST:PORT"
            )
    else:
        if pre or dec:
            raise UcmctlError.one(
                "--prefiller/--decoder are for --mode pd", fix="use --instance in mixed mode"
            )
        if p2p:
            raise UcmctlError.one("--p2p needs --mode pd", fix="drop --p2p or use --mode pd")
        if not mix:
            raise UcmctlError.one(
                "mixed mode needs at least one --instance", fix="add --instance http://HOST:PORT"
            )
    if p2p is not None and p2p not in P2P_PROTOCOLS:
        raise UcmctlError.one(
            f"--p2p {p2p!r} is not a P2P protocol", fix=f"use --p2p {' or --p2p '.join(P2P_PROTOCOLS)}"
        )


def _check_tuning(tuning: dict[str, object]) -> None:
    """Raise one UcmctlError for a tuning value out of range; TypeError for an unknown setting."""
    for name in ("health_interval", "health_timeout", "connect_timeout"):
        if name in tuning:
            _positive("--" + name.replace("_", "-"), float(tuning[name]))  # type: ignore[arg-type]
    for name in ("retries", "retry_backoff", "read_timeout", "stall_timeout", "direct_below", "migrations"):
        if name in tuning:
            _positive("--" + name.replace("_", "-"), float(tuning[name]), allow_zero=True)  # type: ignore[arg-type]
    for name in ("prefill_load", "decode_load", "mixed_load"):
        if name in tuning and tuning[name] not in LOAD_KINDS:
            flag = "--" + name.replace("_", "-")
            raise UcmctlError.one(
                f"{flag} {tuning[name]!r} is not a load measure", fix=f"pass {flag} tokens or {flag} requests"
            )
    for name in ("unhealthy_after", "affinity_tokens", "block_size", "max_connections", "max_body_mb"):
        if name in tuning and int(tuning[name]) < 1:  # type: ignore[call-overload]
            flag = "--" + name.replace("_", "-")
            raise UcmctlError.one(
                f"{flag} is {tuning[name]}; it must be 1 or more", fix=f"pass {flag} 1 or more"
            )
    unknown = set(tuning) - set(ProxyConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown proxy settings: {sorted(unknown)}")
