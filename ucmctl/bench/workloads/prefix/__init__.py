"""The prefix workload (the guides' preseed then measure): its spec (`spec.py`) and its runner
(`runner.py`)."""

from ucmctl.bench.workloads.prefix.spec import PrefixSpec

__all__ = ["PrefixSpec"]
