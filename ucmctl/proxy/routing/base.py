"""What a routing policy is given and what it answers: one instance of the candidates for a leg."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from ucmctl.proxy.pool import Instance, LoadKind


@dataclass(frozen=True)
class Ask:
    """One leg of a request, as a policy sees it."""

    role: str  # prefill, decode or mixed
    load: LoadKind  # how this leg's load is measured (configuration: ProxyConfig.loads)
    tokens: int = 0  # the prompt's tokens (exact for token ids, estimated for text)
    prefix: bytes | None = None  # the digest of the prompt's leading block, where affinity asks it
    session: str | None = None  # the conversation: the `X-Session-Id` header or the body's `user`


class Policy:
    """Chooses the instance for a leg among candidates (healthy, not draining, not tried yet for
    this request; never empty). A policy keeps only its own routing state; the instances' state
    is the pool's."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `ucmctl plan` and the help

    def choose(self, cands: Sequence[Instance], ask: Ask) -> Instance:
        raise NotImplementedError

    def forget(self, gone: Iterable[Instance]) -> None:
        """Instances removed from the pool: drop what the policy kept of them."""
