"""The registry of workloads: what `ucmctl bench --workload NAME` and a suite's
`workload: {kind: NAME, ...}` name. Each is one package here: its spec (`spec.py`, a
`WorkloadSpec`: parameters, phases, defaults, checks) and its runner (`runner.py`); a new one is
a package and one entry in SPECS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Union

from pydantic import Field

from ucmctl.bench.workloads.base import WorkloadSpec
from ucmctl.bench.workloads.long_doc import LongDocSpec
from ucmctl.bench.workloads.multi_turn import MultiTurnSpec
from ucmctl.bench.workloads.prefix import PrefixSpec
from ucmctl.bench.workloads.trace import TraceSpec

# In the order `--workload`'s help and errors list them.
SPECS: tuple[type[WorkloadSpec], ...] = (PrefixSpec, MultiTurnSpec, TraceSpec, LongDocSpec)
BY_KIND: dict[str, type[WorkloadSpec]] = {s.model_fields["kind"].default: s for s in SPECS}

# A suite's `workload:`, parsed as the spec its `kind` names.
if TYPE_CHECKING:
    AnyWorkload = WorkloadSpec
else:
    AnyWorkload = Annotated[Union[SPECS], Field(discriminator="kind")]  # noqa: UP007

__all__ = [
    "BY_KIND",
    "SPECS",
    "AnyWorkload",
    "LongDocSpec",
    "MultiTurnSpec",
    "PrefixSpec",
    "TraceSpec",
    "WorkloadSpec",
]
