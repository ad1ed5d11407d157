"""What every request handler shares: the proxy's state (settings, instances, routing, metrics),
a client's request as the legs need it, and the OpenAI-style error answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from ucmctl.proxy.config import ProxyConfig
from ucmctl.proxy.handoff import Handoff, Store, make_handoff
from ucmctl.proxy.jsontext import Texts
from ucmctl.proxy.kv_feed import Feed
from ucmctl.proxy.kv_index import KvIndex, new_index
from ucmctl.proxy.metrics import Metrics
from ucmctl.proxy.pool import Instance, Pool
from ucmctl.proxy.routing import POLICIES, Ask, Policy, canonical, make_policy
from ucmctl.proxy.tokenize import Tokenizer

# selective disaggregation: a prefill instance with this many legs not answered is saturated
SATURATED_LEGS = 2


@dataclass
class ProxyState:
    """What every handler shares: settings, instances, routing, metrics and the one client session."""

    config: ProxyConfig
    pool: Pool = field(default_factory=Pool)
    policy: Policy = field(default_factory=lambda: make_policy("least-loaded"))
    index: KvIndex | None = None  # where prompts' blocks are: for kv routing and direct decodes
    handoff: Handoff = field(default_factory=Store)
    metrics: Metrics = field(default_factory=Metrics)
    session: aiohttp.ClientSession | None = None
    upstream_headers: dict[str, str] = field(default_factory=dict)
    feeds: list[Feed] = field(default_factory=list)  # the instances' KV-cache events into the index
    tokenizer: Tokenizer | None = None  # text prompts' exact token ids, where the index is read

    @classmethod
    def create(cls, config: ProxyConfig) -> ProxyState:
        """The state for `config`, every configured instance in routing."""
        needs_blocks = POLICIES[canonical(config.routing) or config.routing].needs_blocks
        index = new_index() if needs_blocks or config.direct_below else None
        policy = make_policy(config.routing, config.block_size, index, store=config.kv_store)
        state = cls(config, pool=Pool(config.dynamic_roles), policy=policy, index=index)
        for role, urls in (
            ("prefill", config.prefillers),
            ("decode", config.decoders),
            ("mixed", config.instances),
        ):
            for url in urls:
                state.pool.add(url, role)
        if index is not None:
            model = config.served_model or ""
            feeds = config.kv_events
            state.feeds = [Feed(url, endpoint, model, state.pool, index) for url, endpoint in feeds]
            state.tokenizer = Tokenizer(state.pool) if config.tokenize else None
        bootstrap_of = dict(zip(config.prefillers, config.bootstraps, strict=False))
        state.handoff = make_handoff(config.p2p, bootstrap_of, state.metrics, config.connect_timeout)
        # identity: relay the upstream's bytes as they are, no decompress and recompress
        state.upstream_headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if config.upstream_api_key:
            state.upstream_headers["Authorization"] = f"Bearer {config.upstream_api_key}"
        return state

    def routing_facts(self) -> dict[str, object]:
        """The policy's own facts, and where the index learns what each instance's cache holds."""
        facts = self.policy.describe()
        if self.feeds and "index" in facts:
            n = len(self.feeds)
            facts["index"] = f"vLLM KV events of {n} instances, with the proxy's routing history"
            facts["kv_events"] = [vars(f.stats).copy() for f in self.feeds]
        if "index" in facts:
            facts["tokenization"] = (
                self.tokenizer.describe() if self.tokenizer else {"source": "estimated (--no-tokenize)"}
            )
        return facts

    def timeout(self) -> aiohttp.ClientTimeout:
        """Per-leg timeouts: bounded connect and silence, no bound on a long generation."""
        cfg = self.config
        return aiohttp.ClientTimeout(
            total=None, sock_connect=cfg.connect_timeout, sock_read=cfg.read_timeout or None
        )

    def pick(self, ask: Ask, exclude: list[Instance] | tuple[Instance, ...] = ()) -> Instance | None:
        """The instance for a leg, by the routing policy; None when no candidate is left."""
        cands = self.pool.candidates(ask.role, exclude)
        return self.policy.choose(cands, ask) if cands else None

    def sent(self, inst: Instance, ask: Ask) -> None:
        """A leg that computes the prompt went to `inst`: its blocks count as held there from now
        on (a request routed after it finds them computed, or computing ahead of it in the same
        engine), not as stored yet."""
        if self.index is not None and ask.blocks and ask.role != "decode":
            self.index.took(ask.blocks, inst, saved=False)

    def took(self, inst: Instance, ask: Ask, seconds: float, *, saved: bool) -> None:
        """A leg came back well: the policy learns of it, and the index has the prompt's blocks
        in the instance's own cache now (and in the store, `saved`)."""
        self.policy.done(inst, ask, seconds)
        if self.index is not None and ask.blocks:
            self.index.took(ask.blocks, inst, saved=saved)

    def decode_first(self, req: Request) -> tuple[Instance | None, str | None]:
        """pd with the store and `direct_below`: the decode instance for `req`, chosen before
        its prefill, and why it takes `req` alone (it prefills what it has not cached, in its
        own cache or the store), None where it does not. Only a decode instance computing no
        prompt now takes one (at most one prefill at a time among its streams): "direct", fewer
        tokens to compute than `direct_below`; "direct_saturated", every prefill instance has a
        leg queued behind the one it computes. (None, None) where the decode instance is chosen
        after the prefill, as without. With roles per request, every request ("direct"):
        `_whole_first`."""
        cfg = self.config
        if cfg.dynamic_roles and not self.handoff.once:
            return self._whole_first(req)
        if not cfg.direct_below or self.index is None or self.handoff.once or not req.blocks:
            return None, None
        decode = self.pick(req.ask("decode", cfg, first_leg=False))
        if decode is None:
            return None, None
        if decode.pending:  # a prompt computing there already: its streams would wait on two
            return decode, None
        (held,), stored = self.index.leading(req.blocks, [decode])
        cached = max(held, stored) * cfg.block_size
        if req.tokens - cached < cfg.direct_below:
            return decode, "direct"
        return decode, "direct_saturated" if self._prefill_saturated(decode) else None

    def _whole_first(self, req: Request) -> tuple[Instance | None, str | None]:
        """Roles per request: the whole request goes to the instance of either side the policy
        picks for its prompt ("direct"), which computes the prompt and the answer: no second leg,
        no second queue, no load of what it has just computed. Measured (benchmarks/
        dynamic_roles.py): legs sent apart made each decode leg wait behind another prompt, and
        preferring an instance computing no prompt put each prompt beside the answer just begun
        there."""
        first = self.pick(req.ask("prefill", self.config, first_leg=True))
        return (first, "direct") if first is not None else (None, None)

    def _prefill_saturated(self, decode: Instance) -> bool:
        """Every prefill instance in routing (but `decode`) has SATURATED_LEGS legs or more not
        answered yet: one it computes, one queued behind."""
        prefills = self.pool.candidates("prefill", [decode])
        return bool(prefills) and all(i.pending >= SATURATED_LEGS for i in prefills)

    def remove(self, url: str, role: str | None = None) -> list[Instance]:
        """Take instances out of the pool and out of the policy's memory."""
        gone = self.pool.remove(url, role)
        self.policy.forget(gone)
        return gone


@dataclass(frozen=True)
class Request:
    """A client's request as the legs need it."""

    raw: bytes
    body: dict[str, Any]
    path: str
    tokens: int
    headers: dict[str, str]
    prefix: bytes | None = None  # the affinity key, where the policy reads one
    session: str | None = None  # the conversation
    blocks: Sequence[int] = ()  # the prompt's blocks, where the policy reads them
    texts: Texts = field(default_factory=dict)  # the body's long values as sent (jsontext)

    def ask(self, role: str, config: ProxyConfig, *, first_leg: bool) -> Ask:
        """The leg of `role`; the prompt's prefix key goes with the leg that computes the prompt."""
        prefix = self.prefix if first_leg else None
        return Ask(role, config.load(role), self.tokens, prefix, self.session, self.blocks)


def error_response(status: int, message: str, rid: str | None = None) -> web.Response:
    """An OpenAI-style JSON error."""
    kind = "invalid_request_error" if status < 500 else "upstream_error"
    body = {"error": {"message": message, "type": kind, "code": status}}
    headers = {"X-Request-Id": rid} if rid else None
    return web.json_response(body, status=status, headers=headers)


def session_of(request: web.Request, body: dict[str, Any]) -> str | None:
    """The conversation a request belongs to: its `X-Session-Id` header, else the OpenAI `user`."""
    header = request.headers.get("X-Session-Id")
    if header:
        return header
    user = body.get("user")
    return user if isinstance(user, str) and user else None
