"""Containers in the Plan: each platform's cards as the container sees them, the names and labels
that find a container again, and a launch script that runs exactly the plan's command line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.unit.plan.conftest import TOPOLOGIES
from ucmctl.core.platforms import Platform
from ucmctl.plan.build import build_plan
from ucmctl.plan.containers import card_mapping, derived_image
from ucmctl.plan.model import Process
from ucmctl.topology.load import load_topology, parse_topology

CPU = """
name: cpu-pod
mode: centralized
model: {path: /models/tiny}
nodes:
  a:
    host: 10.0.0.1
    platform: cpu
    devices: 0
    container:
      runtime: podman
      image: localhost/vllm-cpu:0.32
      derived: false
      env: {VLLM_CPU_KVCACHE_SPACE: 2}
      options: [--cgroup-parent=/ucm/x]
storage: {storage_backends: /srv/kv, cache_buffer_capacity_gb: 1}
prefill: {nodes: [a], port: 8000, env: {VLLM_CPU_OMP_THREADS_BIND: "0"}}
decode: {nodes: [a], port: 8001, env: {VLLM_CPU_OMP_THREADS_BIND: "1"}}
proxy: {node: a, port: 8002}
"""


def _env(p: Process) -> dict[str, str]:
    assert p.container is not None
    return dict(a.removeprefix("--env=").split("=", 1) for a in p.container.argv if a.startswith("--env="))


def test_cuda_under_podman_maps_each_card_by_cdi_and_counts_them_from_zero_inside() -> None:
    plan = build_plan(load_topology(TOPOLOGIES / "1p1d-podman.yaml"))
    prefill, decode = plan.process("prefill-0"), plan.process("decode-0")
    assert prefill.container is not None and decode.container is not None
    assert [a for a in prefill.container.argv if "nvidia.com/gpu" in a] == [
        "--device=nvidia.com/gpu=0", "--device=nvidia.com/gpu=1"]  # fmt: skip
    assert [a for a in decode.container.argv if "nvidia.com/gpu" in a] == ["--device=nvidia.com/gpu=2"]
    assert _env(decode)["CUDA_VISIBLE_DEVICES"] == "0"  # card 2 of the node is the container's 0
    assert decode.env["CUDA_VISIBLE_DEVICES"] == "0" and decode.devices == [2]


def test_cuda_under_docker_names_the_cards_in_one_gpus_option() -> None:
    options, nodes, inside = card_mapping(Platform.cuda, "docker", [4, 5, 6, 7])
    assert options == ["--gpus", '"device=4,5,6,7"'] and nodes == [] and inside == "0,1,2,3"


def test_ascend_maps_its_cards_control_devices_and_driver_folders() -> None:
    plan = build_plan(load_topology(TOPOLOGIES / "ascend-p2p-podman.yaml"))
    decode = plan.process("decode-0")
    assert decode.container is not None
    argv = decode.container.argv
    assert [a for a in argv if a.startswith("--device=")] == [
        "--device=/dev/davinci0", "--device=/dev/davinci1", "--device=/dev/davinci_manager",
        "--device=/dev/devmm_svm", "--device=/dev/hisi_hdc"]  # fmt: skip
    for folder in ("/usr/local/dcmi", "/usr/local/bin/npu-smi", "/usr/local/Ascend/driver/lib64",
                   "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info"):  # fmt: skip
        assert f"--volume={folder}:{folder}" in argv
    assert _env(decode)["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"
    assert "--shm-size=1g" in argv and "--ipc=private" in argv
    assert decode.container.devices[:2] == ["/dev/davinci0", "/dev/davinci1"]  # preflight checks these


def test_musa_and_maca_map_every_cards_nodes_and_keep_the_nodes_numbering() -> None:
    assert card_mapping(Platform.musa, "docker", [2, 3]) == (["--device=/dev/dri"], ["/dev/dri"], "2,3")
    options, _, inside = card_mapping(Platform.maca, "docker", [1])
    assert options == ["--device=/dev/dri", "--device=/dev/mxcd"] and inside == "1"


def test_cpu_container_has_no_devices_and_its_folders_at_the_same_paths() -> None:
    plan = build_plan(parse_topology(CPU))
    prefill, proxy = plan.process("prefill-0"), plan.process("proxy")
    assert prefill.container is not None and proxy.container is not None
    argv = prefill.container.argv
    assert not [a for a in argv if a.startswith(("--device", "--gpus"))]
    work = "/tmp/ucmctl-root/cpu-pod/prefill-0"
    assert f"--volume={work}:{work}" in argv and "--volume=/models/tiny:/models/tiny:ro" in argv
    assert "--volume=/srv/kv:/srv/kv" in argv
    assert "--volume=/models/tiny:/models/tiny:ro" not in proxy.container.argv  # the proxy reads no model
    assert _env(prefill)["VLLM_CPU_KVCACHE_SPACE"] == "2"
    # vLLM's caches stay on the node across starts, as a bare server's do
    cache = "/tmp/ucmctl-root/cpu-pod/vllm-cache"
    assert _env(prefill)["VLLM_CACHE_ROOT"] == cache and f"--volume={cache}:{cache}" in argv
    assert f"mkdir -p {cache}" in next(f.content for f in prefill.files if f.path == prefill.launch)
    # the image's own engine and Python, not the node's
    i = argv.index("localhost/vllm-cpu:0.32")
    assert argv[i + 1 : i + 3] == ["vllm", "serve"] and argv[i + 1 :] == prefill.argv
    assert proxy.container.argv[proxy.container.argv.index("localhost/vllm-cpu:0.32") + 1] == "python3"
    assert argv[-len(prefill.argv) - 2] == "--cgroup-parent=/ucm/x"
    assert prefill.container.name == "ucmctl-cpu-pod-prefill-0"
    assert prefill.container.labels["io.ucmctl.deployment"] == "cpu-pod"
    assert prefill.container.labels["io.ucmctl.process"] == "prefill-0"


@pytest.mark.parametrize(
    "base, derived",
    [
        ("docker.io/vllm/vllm-openai:v0.11.0", "localhost/ucmctl/docker.io/vllm/vllm-openai:v0.11.0"),
        ("vllm/vllm-openai", "localhost/ucmctl/vllm/vllm-openai:latest"),
        ("registry:5000/team/vllm:1", "localhost/ucmctl/registry-5000/team/vllm:1"),
        ("quay.io/ascend/vllm-ascend@sha256:" + "ab" * 32,
         "localhost/ucmctl/quay.io/ascend/vllm-ascend:sha256-abababababab"),
    ],
)  # fmt: skip
def test_a_derived_image_is_named_after_its_base(base: str, derived: str) -> None:
    assert derived_image(base) == derived


def test_the_launch_script_runs_exactly_the_plans_command_line(tmp_path: Path) -> None:
    """With a stand-in `podman` that records its arguments: every value reaches it as planned."""
    topology = CPU.replace("VLLM_CPU_KVCACHE_SPACE: 2", 'ODD: "it\'s $HOME `x` \\"q\\" ;|&"')
    plan = build_plan(parse_topology(topology))
    p = plan.process("prefill-0")
    assert p.container is not None
    fake = tmp_path / "podman"
    fake.write_text('#!/bin/sh\n[ "$1" = ps ] && exit 0\nprintf "%s\\0" "$@" > "$0.args"\n')
    fake.chmod(0o755)
    script = next(f for f in p.files if f.path == p.launch).content
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=30)
    recorded = (tmp_path / "podman.args").read_bytes().decode().split("\0")[:-1]
    assert ["podman", *recorded] == p.container.argv
    assert '--env=ODD=it\'s $HOME `x` "q" ;|&' in recorded


def test_a_derived_oci_bundle_shares_the_nodes_namespaces_and_mounts_the_plans_folders() -> None:
    """`bundle_config`: what Slurm's job step sees comes from the bundle's config.json alone."""
    from ucmctl.plan.containers import BUNDLE_SITE, bundle_config, oci_bundle

    base = {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "args": ["sh"], "env": ["PATH=/usr/bin", "PYTHONPATH=/opt/app"]},
        "root": {"path": "/elsewhere/rootfs", "readonly": True},
        "hostname": "runc",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/data", "type": "tmpfs", "source": "tmpfs"}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")]},
    }  # fmt: skip
    mounts = ["/run/x:/run/x", "/models/m:/models/m:ro", "/srv/kv:/data"]
    got = bundle_config(base, mounts, derived=True)
    assert got["root"] == {"path": "rootfs", "readonly": True}  # Slurm 22.05 takes the bundle's rootfs/ only
    assert [n["type"] for n in got["linux"]["namespaces"]] == ["mount", "cgroup"] and "hostname" not in got
    assert got["mounts"] == [
        {"destination": "/proc", "type": "proc", "source": "proc"},  # the base's /data gives way to ours
        {"destination": "/run/x", "type": "bind", "source": "/run/x", "options": ["rbind", "rw"]},
        {"destination": "/models/m", "type": "bind", "source": "/models/m", "options": ["rbind", "ro"]},
        {"destination": "/data", "type": "bind", "source": "/srv/kv", "options": ["rbind", "rw"]},
    ]
    assert got["process"]["env"] == ["PATH=/usr/bin", f"PYTHONPATH={BUNDLE_SITE}:/opt/app"]
    assert base["root"]["path"] == "/elsewhere/rootfs"  # the base's own config is left as it was
    plain = bundle_config(base, mounts, derived=False)
    assert plain["process"]["env"] == base["process"]["env"]
    # the bundle's name: beside its base, a digest of what goes into it
    assert (
        oci_bundle("/b/vllm/", mounts, True)
        == oci_bundle("/b/vllm", mounts, True)
        != oci_bundle("/b/vllm", mounts, False)
    )
    assert oci_bundle("/b/vllm", mounts, True) != oci_bundle("/b/vllm", mounts[:2], True)
