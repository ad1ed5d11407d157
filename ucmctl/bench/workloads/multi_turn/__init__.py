"""The multi-turn workload: its spec (`spec.py`) and its runner (`runner.py`)."""

from ucmctl.bench.workloads.multi_turn.spec import MultiTurnSpec

__all__ = ["MultiTurnSpec"]
