"""Engines: what serving with vLLM or the simulator means to ucmctl (engines/base.py).

The registry below is the one list of engines: the topology's `engine` and the Plan's take their
names from it, in its order. A new engine (SGLang, say) is one module with an `Engine` subclass
and one line here; docs/architecture.md says what it must define.
"""

from __future__ import annotations

from ucmctl.engines.base import Engine, KvTransfer, Metrics, MooncakeLeg, ServerSpec
from ucmctl.engines.sim import SimEngine
from ucmctl.engines.vllm import VllmEngine

ENGINES: dict[str, Engine] = {
    "vllm": VllmEngine(),
    "sim": SimEngine(),
}
# The engine of a topology that names none, and of a bench run against a URL that names none.
DEFAULT_ENGINE = "vllm"


def engine_for(name: str) -> Engine:
    """The engine a Plan or topology names (the topology's schema admits only these names)."""
    return ENGINES[name]


__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "Engine",
    "KvTransfer",
    "Metrics",
    "MooncakeLeg",
    "ServerSpec",
    "engine_for",
]
