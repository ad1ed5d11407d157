"""Field types that several sections of a topology share."""

from __future__ import annotations

import ipaddress
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ucmctl.core import routing_names

Port = Annotated[int, Field(ge=1, le=65535)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def bind_address(v: str) -> str:
    """An IP address literal. `bind` exists for when the node's own name resolution would pick the
    wrong address (a hostname often resolves to 127.0.1.1 on the node itself), so it takes none."""
    try:
        ipaddress.ip_address(v)
    except ValueError:
        raise ValueError(
            "must be an IP address of the node, or 0.0.0.0 (or ::) to listen on every interface"
        ) from None
    return v


# the proxy's routing policies, and the names `load` and `prefix` they had first
Routing = Enum(  # type: ignore[misc]
    "Routing", [(name, name) for name in (*routing_names.POLICIES, *routing_names.ALIASES)], type=str
)


class Restart(Strict):
    """What happens when a process of the side ends on its own with a failure."""

    policy: Literal["never", "on-failure"] = Field(
        default="never",
        description="never (default), or on-failure: started again, at most max_restarts times",
    )
    max_restarts: int = Field(default=3, ge=1, le=100, description="restarts at most, then it stays down")
    backoff_s: float = Field(
        default=5.0,
        ge=0,
        le=600,
        description="seconds before a restart (ucmctl's supervisor and systemd; runtimes use their own)",
    )

    @classmethod
    def parse(cls, value: Any) -> Any:
        """`restart: on-failure` is `restart: {policy: on-failure}`."""
        return {"policy": value} if isinstance(value, str) else value

    @property
    def on(self) -> bool:
        return self.policy == "on-failure"
