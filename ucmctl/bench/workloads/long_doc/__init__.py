"""The long-document workload: its spec (`spec.py`) and its runner (`runner.py`)."""

from ucmctl.bench.workloads.long_doc.spec import REPEAT_MODES, LongDocSpec

__all__ = ["REPEAT_MODES", "LongDocSpec"]
