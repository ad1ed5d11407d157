"""Facts about accelerator platforms, in one place: the topology's checks, the plan builder and
preflight read them from here (none of them owns them, so none has to import another for them).

A leaf module: it imports nothing from ucmctl.
"""

from __future__ import annotations

from enum import Enum


class Platform(str, Enum):
    cuda = "cuda"
    ascend = "ascend"
    musa = "musa"
    maca = "maca"
    cpu = "cpu"


# The variable that selects a node's cards, per platform (MetaX MACA follows CUDA's name).
DEVICE_VARIABLE: dict[Platform, str | None] = {
    Platform.cuda: "CUDA_VISIBLE_DEVICES",
    Platform.ascend: "ASCEND_RT_VISIBLE_DEVICES",
    Platform.musa: "MUSA_VISIBLE_DEVICES",
    Platform.maca: "CUDA_VISIBLE_DEVICES",
    Platform.cpu: None,
}
ALL_DEVICE_VARIABLES = {v for v in DEVICE_VARIABLE.values() if v} | {"HIP_VISIBLE_DEVICES"}

# The extended resource a platform's device plugin advertises on Kubernetes. Ascend's device plugin names
# the chip family (Ascend910 for the Atlas 800 A2/A3 servers of the guides); MUSA and MACA are
# their vendors' plugins' names. The CPU platform asks for none.
DEVICE_RESOURCE: dict[Platform, str | None] = {
    Platform.cuda: "nvidia.com/gpu",
    Platform.ascend: "huawei.com/Ascend910",
    Platform.musa: "mthreads.com/gpu",
    Platform.maca: "metax-tech.com/gpu",
    Platform.cpu: None,
}
# The tool that counts a node's cards, per platform (preflight's `nvidia`/`npu` facts); a
# platform absent here has no standard way to count them: the topology is trusted.
DEVICE_COUNTER: dict[Platform, str] = {
    Platform.cuda: "nvidia-smi",
    Platform.maca: "nvidia-smi",
    Platform.ascend: "npu-smi",
}

# The variables that name the NIC for collective traffic, per platform (the guides' exports).
NIC_VARIABLES: dict[Platform, tuple[str, ...]] = {
    Platform.ascend: ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME"),
    Platform.cuda: ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"),
    Platform.maca: ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"),
    Platform.musa: ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"),
    Platform.cpu: (),
}
