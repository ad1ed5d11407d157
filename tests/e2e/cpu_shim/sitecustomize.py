"""TEST-ONLY shim, put on PYTHONPATH of the vLLM servers of tests/e2e/test_p2p_mooncake.py.

vLLM's MooncakeConnector asks `torch.accelerator.current_device_index()` at worker start,
which raises on a machine without an accelerator. This answers 0 there, and nothing else.
It is never part of what `ucmctl up` renders: CUDA and Ascend nodes have a device.
"""

try:
    import torch

    _original = torch.accelerator.current_device_index

    def _current_device_index() -> int:
        try:
            return _original()
        except Exception:
            return 0

    torch.accelerator.current_device_index = _current_device_index
except Exception:  # torch absent or another layout: leave everything as it is
    pass
