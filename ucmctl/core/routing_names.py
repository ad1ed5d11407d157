"""The proxy's routing policies by name, for the topology, the Plan and the proxy's command line
(the policies themselves are ucmctl.proxy.routing's, one module each, in this order)."""

from __future__ import annotations

POLICIES = ("round-robin", "least-loaded", "affinity", "session", "kv")
DEFAULT = "least-loaded"
# the topology's earlier names: `load` is least-loaded, `prefix` is affinity
ALIASES = {"load": "least-loaded", "prefix": "affinity"}
SUMMARIES = {
    "round-robin": "each instance in turn, whatever its load",
    "least-loaded": "least loaded (prefill: prompt tokens in flight; decode: requests), ties round-robin",
    "affinity": "the same leading block of a prompt to the same instance, new ones by load",
    "session": "one conversation (X-Session-Id or user) to one instance, within 1.25x average load",
    "kv": "least expected time to first token from where the prompt's KV is (own cache, store) and the queue",
}


def canonical(name: str) -> str | None:
    """The policy's name for `name` (an alias read as its policy); None when there is none."""
    name = ALIASES.get(name, name)
    return name if name in POLICIES else None
