"""The simulator (ucmctl/sim): it takes vLLM's command line and speaks vLLM's API and metrics, so
it is vLLM's engine with another executable, a shorter health timeout, no CPU binding, and the
UCM store read by the simulator itself rather than through the packaged connector."""

from __future__ import annotations

from collections.abc import Callable

from ucmctl.engines.vllm import VllmEngine


class SimEngine(VllmEngine):
    name = "sim"
    display_name = "ucmctl (for the simulator)"
    health_timeout = 60.0
    cpu_binding_variable = None
    loads_ucm_connector = False
    one_version = False
    version_probe = 'import ucmctl; print("engine=sim " + ucmctl.__version__)'

    def executable(self, python: str, tool: Callable[[str], str]) -> list[str]:
        return [python, "-m", "ucmctl", "sim", "serve"]
