"""The trace workload: its spec (`spec.py`), its runner (`runner.py`) and the trace format
(`format.py`: load, make, write, turn into prompts, score)."""

from ucmctl.bench.workloads.trace.spec import TraceSpec

__all__ = ["TraceSpec"]
