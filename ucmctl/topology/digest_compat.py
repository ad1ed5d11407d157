"""The fields newer than the stored records, each with the value a record made before it had
(its default): a digest leaves a field out while it holds that value, so that a topology, a
deployment's plan and a suite digest as they did before the field existed, and stored
baselines, history files and suite results still compare and resume. One table for the three;
a new field of any of them that enters a digest gets a row here. And the fields a bench result
held and no longer holds, each with the value the results before held (`OLDER`)."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from ucmctl.core.names import SERVER_ROLES

Record = Literal["topology", "plan", "suite"]


class _Always:
    def __repr__(self) -> str:
        return "ALWAYS"


ALWAYS: Any = _Always()  # a field no digest holds, whatever its value


class Newer(NamedTuple):
    """A field of one record's JSON dump newer than the records: left out at `default`."""

    record: Record
    path: str  # dotted; `*` is every value of a mapping or item of a list
    default: Any


# A node that runs bare: its container section at its defaults (`Container()`).
BARE: dict[str, Any] = {
    "runtime": "bare",
    "image": None,
    "derived": True,
    "python": "python3",
    "mounts": [],
    "devices": [],
    "env": {},
    "shm_size": None,
    "ipc": None,
    "network": "host",
    "user": None,
    "pull": "missing",
    "options": [],
}
NEVER: dict[str, Any] = {"policy": "never", "max_restarts": 3, "backoff_s": 5.0}  # the default restart policy

FIELDS: tuple[Newer, ...] = (
    Newer("topology", "nodes.*.container", BARE),
    Newer("topology", "nodes.*.systemd", False),  # the node's restart mechanism
    *(Newer("topology", f"{role}.container", None) for role in SERVER_ROLES),
    *(Newer("topology", f"{part}.restart", NEVER) for part in (*SERVER_ROLES, "proxy")),
    Newer("topology", "storage.pack_blocks", 1),  # a file per block (no packs)
    Newer("topology", "proxy.direct_below", 0),  # selective disaggregation off
    Newer("topology", "proxy.roles", "fixed"),
    Newer("topology", "proxy.kv_events", True),  # the servers' KV-cache events, where the index is read
    # answers moved off a failed instance: a run with no fault is the same run with it or without
    Newer("topology", "proxy.migrations", 3),
    Newer("topology", "proxy.stall_timeout", 30.0),  # hung servers' answers moved: same as migrations
    Newer("topology", "proxy.nodes", None),  # one proxy on `node`
    Newer("topology", "proxy.replicas", None),
    *(Newer("topology", f"{role}.kv_events_port", None) for role in SERVER_ROLES),
    Newer("plan", "nodes.*.slurm_node", ALWAYS),  # where a scheduler put it this time: not the plan's own
    Newer("plan", "nodes.*.systemd", False),
    Newer("plan", "processes.*.restart.script", None),
    Newer("plan", "store.pack_blocks", 1),
    Newer("plan", "processes.*.proxy", ALWAYS),  # the proxy's spec: its argv holds the same
    Newer("plan", "processes.*.server.kv_events_config", None),  # no KV-cache events published
    Newer("suite", "workload", None),  # a suite without a workload: the prefix one
)


class Older(NamedTuple):
    """A field of a bench result's JSON that results made before held and newer ones may leave
    out: keyed (`bench.history.key_fields`) as if it held `default` where it is absent."""

    record: Literal["bench"]
    path: str  # dotted
    default: Any


# The prefix workload's parameters moved from the run's settings to its spec: a run of another
# workload no longer says them; the results before held the options' defaults.
OLDER: tuple[Older, ...] = (
    Older("bench", "config.input_lens", []),
    Older("bench", "config.prefix_ratio", 0.8),
    Older("bench", "config.num_prompts", 128),
    Older("bench", "config.reset_hbm", False),
    Older("bench", "config.repeats", 1),
)


def with_older(record: Literal["bench"], data: dict[str, Any]) -> dict[str, Any]:
    """`data`, the record's JSON, with every field of OLDER for it that it lacks at its default
    (changed in place, and returned)."""
    for field in OLDER:
        if field.record == record:
            *parents, name = field.path.split(".")
            for holder in _holders(data, parents):
                holder.setdefault(name, field.default)
    return data


def without_newer(record: Record, data: dict[str, Any]) -> dict[str, Any]:
    """`data`, the record's JSON dump, with every field of FIELDS for it left out where it holds
    its default (changed in place, and returned)."""
    for field in FIELDS:
        if field.record == record:
            *parents, name = field.path.split(".")
            for holder in _holders(data, parents):
                if name in holder and (field.default is ALWAYS or holder[name] == field.default):
                    del holder[name]
    return data


def _holders(data: Any, path: list[str]) -> list[dict[str, Any]]:
    """The mappings at `path` under `data` (none where a part of it is missing or null)."""
    found = [data]
    for part in path:
        inner: list[Any] = []
        for value in found:
            if part == "*":
                inner.extend(value.values() if isinstance(value, dict) else value)
            elif isinstance(value, dict) and value.get(part) is not None:
                inner.append(value[part])
        found = [v for v in inner if isinstance(v, (dict, list))]
    return [v for v in found if isinstance(v, dict)]
