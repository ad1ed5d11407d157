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
    blocks: Sequence[int] = ()  # the prompt's full blocks' keys, where the policy needs them


class Policy:
    """Chooses the instance for a leg among candidates (healthy, not draining, not tried yet for
    this request; never empty). A policy keeps only its own routing state; the instances' state
    is the pool's."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `ucmctl plan` and the help
    needs_blocks: ClassVar[bool] = False  # reads `Ask.blocks` (kv_index.block_keys of the prompt)
    needs_prefix: ClassVar[bool] = False  # reads `Ask.prefix` (rewrite.prefix_key of the prompt)

    def choose(self, cands: Sequence[Instance], ask: Ask) -> Instance:
        raise NotImplementedError

    def forget(self, gone: Iterable[Instance]) -> None:
        """Instances removed from the pool: drop what the policy kept of them."""

    def done(self, inst: Instance, ask: Ask, seconds: float) -> None:
        """The leg `ask` went to `inst` and came back well after `seconds`: the prefill leg's
        whole answer, a decode or mixed leg's first bytes."""

    def describe(self) -> dict[str, object]:
        """What the policy knows now, for the proxy's /routing."""
        return {"policy": self.name}
