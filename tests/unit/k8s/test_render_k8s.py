"""`ucmctl render --k8s`: every example topology's manifests validate against their schemas, and
what they run is the Plan's command line, rank by rank, as Kubernetes and the shell would hand
it to the process (Kubernetes' `$(VAR)` expansion is emulated, the shell is run for real)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.k8s_validate import ManifestError, validate_object
from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.k8s.manifests import Manifest, write_manifests
from ucmctl.k8s.options import Options, k8s_name
from ucmctl.k8s.render import CONFIG_DIR, WORK_DIR, render_manifests, restart_notes
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan, Process
from ucmctl.topology.load import load_topology, parse_topology
from ucmctl.topology.model import Topology

REPO = Path(__file__).resolve().parents[3]
TOPOLOGIES = sorted((REPO / "topologies").glob("*.yaml"))
EP = REPO / "topologies" / "ep-dp4tp8-dp8tp4.yaml"


def _load(path: Path) -> tuple[Topology, Plan]:
    t = load_topology(path)
    return t, build_plan(t)


def _by_kind(manifests: list[Manifest], kind: str) -> dict[str, dict[str, Any]]:
    return {m.obj["metadata"]["name"]: m.obj for m in manifests if m.obj["kind"] == kind}


def _lws(manifests: list[Manifest], role: str) -> dict[str, Any]:
    return next(
        m.obj for m in manifests
        if m.obj["kind"] == "LeaderWorkerSet" and m.obj["metadata"]["name"].endswith(f"-{role}")
    )  # fmt: skip


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    template = (
        spec["leaderWorkerTemplate"]["workerTemplate"] if "leaderWorkerTemplate" in spec else spec["template"]
    )
    containers: list[dict[str, Any]] = template["spec"]["containers"]
    return containers


# --- Kubernetes' expansion of $(VAR) in command and env, as k8s.io/.../third_party/forked/golang/expansion


def k8s_expand(text: str, env: dict[str, str]) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env.get(name, f"$({name})"))
                    i = end + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def container_env(container: dict[str, Any], lws_env: dict[str, str]) -> dict[str, str]:
    """The container's environment as the process sees it (fieldRefs: a stand-in pod IP)."""
    env = dict(lws_env)
    for e in container.get("env", []):
        if "valueFrom" in e:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
            env[e["name"]] = "10.1.2.3"
        else:
            env[e["name"]] = k8s_expand(e["value"], env)
    return env


def run_container(
    container: dict[str, Any], lws_env: dict[str, str], bin_dir: Path
) -> tuple[list[str], dict[str, str]]:
    """The argv the container's process gets: command expanded, the shell run for real with a
    stand-in for the executable that reports its argv and environment."""
    env = container_env(container, lws_env)
    command = [k8s_expand(word, env) for word in container["command"]]
    if command[:2] != ["/bin/sh", "-c"]:
        return command, env
    name = re.search(r"^exec (\S+)", command[2], re.M)
    assert name is not None
    fake = bin_dir / name.group(1)
    if not fake.exists():
        fake.write_text(f"#!{sys.executable}\nimport json, os, sys\nprint(json.dumps(sys.argv))\n")
        fake.chmod(0o755)
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=30,
        env={**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )  # fmt: skip
    argv = json.loads(done.stdout)
    return [name.group(1), *argv[1:]], env


def expected_argv(plan: Plan, p: Process, leader: str | None) -> list[str]:
    """The Plan's argv as the pod must run it: listeners on the pod, the DP master at the LWS
    leader, files from the ConfigMap."""
    argv = list(p.argv)
    argv[argv.index("--host") + 1] = "0.0.0.0"
    if leader is not None:
        argv[argv.index("--data-parallel-address") + 1] = leader
    if "--kv-transfer-config" in argv:
        i = len(argv) - 1 - argv[::-1].index("--kv-transfer-config")
        text = argv[i + 1]
        for f in p.files:
            text = text.replace(json.dumps(f.path)[1:-1], f"{CONFIG_DIR}/{Path(f.path).name}")
        argv[i + 1] = json.dumps(json.loads(text))
    return argv


def expected_env(plan: Plan, p: Process) -> dict[str, str]:
    run_dir = plan.nodes[p.node].run_dir
    files = {f.path: f"{CONFIG_DIR}/{Path(f.path).name}" for f in p.files}
    out = {}
    for key, value in p.env.items():
        if key == p.device_variable:
            continue
        if key in ("VLLM_HOST_IP", "HCCL_IF_IP"):
            out[key] = "10.1.2.3"
            continue
        value = files.get(value, value)
        if value.startswith(run_dir + "/"):
            value = WORK_DIR + value[len(run_dir) :]
        out[key] = value
    return out


def check_servers_run_the_plan(t: Topology, plan: Plan, manifests: list[Manifest], tmp_path: Path) -> int:
    """Every DP rank's pod/container runs exactly its Plan command line and environment; a
    side without external DP runs its first server's (the others differ only in port numbers,
    which pods do not need). Returns how many processes were compared."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    compared = 0
    for role, side in t.sides():
        lws = _lws(manifests, role)
        name = lws["metadata"]["name"]
        size = lws["spec"]["leaderWorkerTemplate"]["size"]
        containers = _containers(lws)
        procs = [p for p in plan.servers() if p.role == role]
        external = side.dp > 1 and side.dp_mode.value == "external"
        if not external:
            procs = procs[:1]
        for p in procs:
            group = procs.index(p) // side.dp if external else 0
            worker, c = divmod(p.dp_rank or 0, len(containers))
            leader = f"{name}-{group}.{name}.default"
            lws_env = {
                "LWS_LEADER_ADDRESS": leader,
                "LWS_WORKER_INDEX": str(worker),
                "LWS_GROUP_SIZE": str(size),
            }
            argv, env = run_container(containers[c], lws_env, bin_dir)
            assert argv == expected_argv(plan, p, leader if external else None), p.name
            assert {k: env[k] for k in p.env if k in env} == expected_env(plan, p), p.name
            compared += 1
    return compared


# --- every example topology --------------------------------------------------------------------


@pytest.mark.parametrize("path", TOPOLOGIES, ids=[p.stem for p in TOPOLOGIES])
def test_example_renders_valid_manifests_that_run_the_plan(path: Path, tmp_path: Path) -> None:
    t, plan = _load(path)
    manifests = render_manifests(plan)
    written = write_manifests(manifests, plan, tmp_path / "k8s")
    assert [p.name for p in written] == [m.filename for m in manifests]
    for m, file in zip(manifests, written, strict=True):
        assert yaml.safe_load(file.read_text()) == m.obj  # the file holds exactly the object
        validate_object(m.obj)
        assert m.obj["metadata"]["namespace"] == "default"

    kinds = [m.obj["kind"] for m in manifests]
    assert kinds.count("LeaderWorkerSet") == len(t.sides())
    assert kinds.count("PersistentVolumeClaim") == (t.storage is not None)
    assert kinds.count("Deployment") == (t.proxy is not None) + (t.mooncake is not None)
    assert kinds.count("Service") == kinds.count("Deployment")

    # replicas x size x containers = the Plan's API servers, side by side
    for role, _side in t.sides():
        lws = _lws(manifests, role)
        n = lws["spec"]["replicas"] * lws["spec"]["leaderWorkerTemplate"]["size"] * len(_containers(lws))
        assert n == sum(1 for p in plan.servers() if p.role == role)
        for c in _containers(lws):
            assert c["readinessProbe"]["httpGet"]["path"] == "/health"

    # PYTHONHASHSEED and --dtype: one value on every server, as the topology checks demand
    seeds, dtypes = set(), set()
    for role, _side in t.sides():
        for c in _containers(_lws(manifests, role)):
            env = {e["name"]: e.get("value") for e in c["env"]}
            seeds.add(env["PYTHONHASHSEED"])
            words = c["command"] if c["command"][0] != "/bin/sh" else c["command"][2].split()
            dtypes.add(words[words.index("--dtype") + 1] if "--dtype" in words else None)
    assert seeds == {str(t.model.hash_seed)}
    assert len(dtypes) == 1
    assert check_servers_run_the_plan(t, plan, manifests, tmp_path) >= len(t.sides())


# --- the EP layout: DP4xTP8 prefill, DP8xTP4 decode -----------------------------------------------


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_ep_layout_carries_the_guides_parallelism(tmp_path: Path) -> None:
    _, plan = _load(EP)
    manifests = render_manifests(plan)
    prefill, decode = _lws(manifests, "prefill"), _lws(manifests, "decode")

    # prefill: one DP4 group over 4 nodes, a rank (TP8, 8 cards) per pod
    assert prefill["spec"]["replicas"] == 1
    assert prefill["spec"]["leaderWorkerTemplate"]["size"] == 4
    (p0,) = _containers(prefill)
    assert p0["resources"]["limits"] == {"huawei.com/Ascend910": 8}
    assert p0["resources"]["requests"] == {"huawei.com/Ascend910": 8}
    script = p0["command"][2]
    assert "--data-parallel-size 4 " in script and "--tensor-parallel-size 8 " in script
    assert '--data-parallel-rank "$$(( $(LWS_WORKER_INDEX) * 1 + 0 ))"' in script
    assert '--data-parallel-address "$(LWS_LEADER_ADDRESS)"' in script
    assert '"$(LWS_GROUP_SIZE)" != 4' in script

    # decode: one DP8 group over 4 nodes, two ranks (TP4, 4 cards each) per pod: 8 per pod
    assert decode["spec"]["replicas"] == 1
    assert decode["spec"]["leaderWorkerTemplate"]["size"] == 4
    d = _containers(decode)
    assert [c["resources"]["limits"] for c in d] == [{"huawei.com/Ascend910": 4}] * 2
    for c in d:
        assert "--data-parallel-size 8 " in c["command"][2] and "--tensor-parallel-size 4 " in c["command"][2]

    # each rank as the pods run it: the rank and master address the guide's scripts give
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ranks = []
    for worker in range(4):
        lws_env = {"LWS_LEADER_ADDRESS": "L", "LWS_WORKER_INDEX": str(worker), "LWS_GROUP_SIZE": "4"}
        for c in d:
            argv, env = run_container(c, lws_env, bin_dir)
            ranks.append((int(_flag(argv, "--data-parallel-rank")), int(_flag(argv, "--port"))))
            assert _flag(argv, "--data-parallel-address") == "L"
            assert _flag(argv, "--data-parallel-size") == "8" and _flag(argv, "--tensor-parallel-size") == "4"
            assert env["PYTHONHASHSEED"] == "0" and "ASCEND_RT_VISIBLE_DEVICES" not in env
            assert env["MOONCAKE_CONFIG_PATH"] == f"{CONFIG_DIR}/mooncake.json"
        argv, _ = run_container(p0, lws_env, bin_dir)
        assert _flag(argv, "--data-parallel-rank") == str(worker)
    assert ranks == [(r, 9000 + r % 2) for r in range(8)]

    # a pod started without the LWS controller stops at once, saying why
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_container(p0, {}, bin_dir)
    assert "LWS_WORKER_INDEX is not set" in failed.value.stderr
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_container(
            p0, {"LWS_LEADER_ADDRESS": "L", "LWS_WORKER_INDEX": "1", "LWS_GROUP_SIZE": "2"}, bin_dir
        )
    assert "LWS_GROUP_SIZE differs" in failed.value.stderr

    # the proxy reaches every rank by its pod's DNS name under the LWS's headless Service
    proxy = _by_kind(manifests, "Deployment")["ep-dp4tp8-dp8tp4-proxy"]
    argv = _containers(proxy)[0]["command"]
    prefillers = [argv[i + 1] for i, w in enumerate(argv) if w == "--prefiller"]
    decoders = [argv[i + 1] for i, w in enumerate(argv) if w == "--decoder"]
    pf, dc = "ep-dp4tp8-dp8tp4-prefill", "ep-dp4tp8-dp8tp4-decode"
    assert prefillers == [f"http://{pf}-0.{pf}.default:9000"] + [
        f"http://{pf}-0-{w}.{pf}.default:9000" for w in (1, 2, 3)
    ]
    assert decoders == [
        f"http://{dc}-0{'' if w == 0 else f'-{w}'}.{dc}.default:{9000 + c}" for w in range(4) for c in (0, 1)
    ]
    assert _flag(argv, "--host") == "0.0.0.0"
    services = _by_kind(manifests, "Service")
    assert services["ep-dp4tp8-dp8tp4-proxy"]["spec"]["ports"][0]["port"] == 7850
    assert {p["name"]: p["port"] for p in services["ep-dp4tp8-dp8tp4-mooncake-master"]["spec"]["ports"]} == {
        "master": 50088, "metrics": 9003,
    }  # fmt: skip

    # the store: a RWX claim on prefill (its UCM users), not on P2P decode
    (pvc,) = _by_kind(manifests, "PersistentVolumeClaim").values()
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}}
    assert {"name": "store", "mountPath": "/mnt/test1"} in p0["volumeMounts"]
    assert all(m["name"] != "store" for c in d for m in c["volumeMounts"])
    assert {"name": "dshm", "mountPath": "/dev/shm"} in p0["volumeMounts"]
    volumes = prefill["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in volumes

    # the ConfigMap: the Plan's UCM config, and mooncake.json pointing at the master's Service
    (config,) = _by_kind(manifests, "ConfigMap").values()
    ucm = yaml.safe_load(config["data"]["prefill.ucm_config.yaml"])
    assert ucm["ucm_connectors"][0]["ucm_connector_config"]["storage_backends"] == "/mnt/test1"
    mooncake = json.loads(config["data"]["decode.mooncake.json"])
    assert mooncake["master_server_address"] == "ep-dp4tp8-dp8tp4-mooncake-master.default:50088"


# --- values from the topology stay as written ---------------------------------------------------

HOSTILE = "/models/GLM 5.1 $(touch PWNED1) `touch PWNED2`; $HOME 'q\" \\ $$ *"


def test_shell_and_kubernetes_metacharacters_stay_one_argument(tmp_path: Path) -> None:
    text = EP.read_text().replace("path: /models/GLM-5.1-w4a8", f"path: {json.dumps(HOSTILE)}")
    text = text.replace('OMP_NUM_THREADS: "10"', 'OMP_NUM_THREADS: "$(PYTHONHASHSEED) $$ `id`"')
    t = parse_topology(text, "hostile.yaml", REPO / "topologies")
    plan = build_plan(t)
    manifests = render_manifests(plan)
    for m in manifests:
        validate_object(m.obj)
    check_servers_run_the_plan(t, plan, manifests, tmp_path)  # argv and env exactly the Plan's
    bin_dir = tmp_path / "bin"
    argv, env = run_container(
        _containers(_lws(manifests, "decode"))[1],
        {"LWS_LEADER_ADDRESS": "L", "LWS_WORKER_INDEX": "3", "LWS_GROUP_SIZE": "4"},
        bin_dir,
    )
    assert argv[2] == HOSTILE
    assert env["OMP_NUM_THREADS"] == "$(PYTHONHASHSEED) $$ `id`"
    assert not list(tmp_path.glob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
    # the proxy's argv (no shell) holds the value as Kubernetes must see it
    words = _containers(_lws(manifests, "prefill"))[0]["command"][2]
    assert "$$(touch PWNED1)" in words and "'/models/GLM 5.1 " in words  # quoted, then escaped


def test_non_shell_commands_escape_kubernetes_references(tmp_path: Path) -> None:
    text = (REPO / "topologies" / "1p1d.yaml").read_text()
    text = text.replace("path: /home/models/Qwen2.5-7B-Instruct", f"path: {json.dumps(HOSTILE)}")
    t = parse_topology(text, "1p1d.yaml", REPO / "topologies")
    plan = build_plan(t)
    manifests = render_manifests(plan)
    (c,) = _containers(_lws(manifests, "prefill"))
    assert c["command"][0] == "vllm"  # one server per pod: no shell needed
    assert "$$(touch PWNED1)" in c["command"][2]
    argv, _ = run_container(c, {"PYTHONHASHSEED": "x"}, tmp_path)
    assert argv[2] == HOSTILE


# --- other layouts and options -------------------------------------------------------------------


def test_cuda_p2p_bootstrap_urls_and_gpu_requests() -> None:
    text = (REPO / "topologies" / "2p2d-p2p.yaml").read_text().replace("platform: ascend", "platform: cuda")
    text = text.replace("  protocol: ascend\n", "")
    t = parse_topology(text, "2p2d-p2p-cuda.yaml")
    plan = build_plan(t)
    manifests = render_manifests(plan)
    for m in manifests:
        validate_object(m.obj)
    prefill = _lws(manifests, "prefill")
    assert prefill["spec"]["replicas"] == 2 and prefill["spec"]["leaderWorkerTemplate"]["size"] == 1
    (c,) = _containers(prefill)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    assert {"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": "8998"} in c["env"]
    assert all(e["name"] != "CUDA_VISIBLE_DEVICES" for e in c["env"])
    proxy = _containers(_by_kind(manifests, "Deployment")["ucm-2p2d-p2p-proxy"])[0]["command"]
    pf = "ucm-2p2d-p2p-prefill"
    assert [proxy[i + 1] for i, w in enumerate(proxy) if w == "--bootstrap"] == [
        f"http://{pf}-{g}.{pf}.default:8998" for g in (0, 1)
    ]
    assert [proxy[i + 1] for i, w in enumerate(proxy) if w == "--prefiller"] == [
        f"http://{pf}-{g}.{pf}.default:9000" for g in (0, 1)
    ]


def test_kv_routing_renders_a_proxy_that_reads_no_events_across_pods() -> None:
    text = (REPO / "topologies" / "2p2d-centralized.yaml").read_text()
    plan = build_plan(parse_topology(text.replace("\nproxy:\n", "\nproxy:\n  routing: kv\n", 1)))
    assert "--kv-events" in next(p for p in plan.processes if p.role == "proxy").argv  # on the nodes
    manifests = render_manifests(plan)
    for m in manifests:
        validate_object(m.obj)
    proxy = _containers(next(iter(_by_kind(manifests, "Deployment").values())))[0]["command"]
    assert "--routing" in proxy and "--kv-events" not in proxy and "--served-model" not in proxy


def test_xpyd_instances_and_two_backends() -> None:
    _, plan = _load(REPO / "topologies" / "xpyd.yaml")
    manifests = render_manifests(plan)
    prefill, decode = _lws(manifests, "prefill"), _lws(manifests, "decode")
    assert (prefill["spec"]["replicas"], prefill["spec"]["leaderWorkerTemplate"]["size"]) == (3, 1)
    assert (decode["spec"]["replicas"], decode["spec"]["leaderWorkerTemplate"]["size"]) == (2, 1)
    (c,) = _containers(prefill)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 2}
    store = [m for m in c["volumeMounts"] if m["name"] == "store"]
    assert store == [
        {"name": "store", "mountPath": "/mnt/nfs/ucm-a", "subPath": "backend-0"},
        {"name": "store", "mountPath": "/mnt/nfs/ucm-b", "subPath": "backend-1"},
    ]


def test_local_cpu_topology_renders_without_devices() -> None:
    _, plan = _load(REPO / "topologies" / "local-1p1d.yaml")
    manifests = render_manifests(plan)
    (c,) = _containers(_lws(manifests, "prefill"))
    assert "resources" not in c
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_CACHE_ROOT"] == f"{WORK_DIR}/vllm-cache"
    assert {"name": "work", "mountPath": WORK_DIR} in c["volumeMounts"]
    assert c["command"][c["command"].index("--host") + 1] == "0.0.0.0"


def test_options_namespace_images_and_store(tmp_path: Path) -> None:
    _, plan = _load(REPO / "topologies" / "hetero-ascend-cuda.yaml")
    options = Options(
        namespace="llm", image="reg/ucm:1", platform_images={"ascend": "reg/ucm-ascend:1"},
        storage_class="cephfs", store_size="500Gi",
    )  # fmt: skip
    manifests = render_manifests(plan, options)
    for m in manifests:
        validate_object(m.obj)
        assert m.obj["metadata"]["namespace"] == "llm"
    assert _containers(_lws(manifests, "prefill"))[0]["image"] == "reg/ucm-ascend:1"
    assert _containers(_lws(manifests, "prefill"))[0]["resources"]["limits"] == {"huawei.com/Ascend910": 1}
    assert _containers(_lws(manifests, "decode"))[0]["image"] == "reg/ucm:1"
    assert _containers(_lws(manifests, "decode"))[0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    (pvc,) = _by_kind(manifests, "PersistentVolumeClaim").values()
    assert pvc["spec"]["storageClassName"] == "cephfs"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "500Gi"
    proxy = _containers(_by_kind(manifests, "Deployment")["hetero-ascend-cuda-proxy"])[0]
    assert "http://hetero-ascend-cuda-decode-0.hetero-ascend-cuda-decode.llm:7801" in proxy["command"]
    with pytest.raises(UcmctlError, match="namespace"):
        render_manifests(plan, Options(namespace="Not_OK"))
    with pytest.raises(UcmctlError, match="quantity"):
        render_manifests(plan, Options(store_size="lots"))


def test_names_are_dns_labels() -> None:
    assert k8s_name("1p1d") == "ucm-1p1d"
    assert k8s_name("My_Deploy.v2") == "my-deploy-v2"
    assert len(k8s_name("a" * 63)) <= 40


# --- the validators refuse what the API server would -------------------------------------------


def test_validators_refuse_unknown_fields_and_wrong_types() -> None:
    _, plan = _load(EP)
    manifests = render_manifests(plan)
    lws = _lws(manifests, "decode")
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["sizee"] = 4
    with pytest.raises(ManifestError, match="sizee"):
        validate_object(bad)
    bad = copy.deepcopy(lws)
    bad["spec"]["replicas"] = "one"
    with pytest.raises(ManifestError, match="replicas"):
        validate_object(bad)
    bad = copy.deepcopy(lws)
    _containers(bad)[0]["readinessProbe"]["httpGet"]["portt"] = 1
    with pytest.raises(ManifestError, match="portt"):
        validate_object(bad)
    deployment = copy.deepcopy(_by_kind(manifests, "Deployment")["ep-dp4tp8-dp8tp4-proxy"])
    _containers(deployment)[0]["imagee"] = "x"
    with pytest.raises(ManifestError, match="imagee"):
        validate_object(deployment)
    service = copy.deepcopy(_by_kind(manifests, "Service")["ep-dp4tp8-dp8tp4-proxy"])
    service["spec"]["ports"][0]["port"] = "http"
    with pytest.raises(ManifestError):
        validate_object(service)


# --- the command line ------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ucmctl", *args], capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip


def test_cli_writes_then_rewrites_and_refuses_foreign_files(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    done = _cli("render", str(EP), "--k8s", str(out), "--namespace", "llm")
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 8 and files[0].startswith("00-persistentvolumeclaim-")
    assert [line for line in done.stdout.splitlines() if line.endswith(".yaml")] == [
        str(out / f) for f in files
    ]
    assert "kubectl apply -f" in done.stdout.splitlines()[-1]
    first = (out / files[0]).read_text()
    assert first.startswith("# Rendered by `ucmctl render --k8s`") and "not used on Kubernetes" in first

    # a second render replaces the first one's files, leaving none behind
    done = _cli("render", str(REPO / "topologies" / "pd-mixed.yaml"), "--k8s", str(out))
    assert done.returncode == 0, done.stderr
    assert len(list(out.iterdir())) == 3

    (out / "mine.yaml").write_text("kind: Secret\n")
    done = _cli("render", str(EP), "--k8s", str(out))
    assert done.returncode == ExitStatus.BAD_INPUT
    assert done.stderr.count("\n") == 1 and "mine.yaml" in done.stderr

    done = _cli("render", str(EP), "--k8s", str(tmp_path / "x"), "--image", "gpu=x")
    assert done.returncode == ExitStatus.BAD_INPUT
    assert done.stderr.startswith("error: --image gpu=x: unknown platform")
    assert done.stderr.count("\n") == 1


def test_pods_run_the_image_the_plan_runs_each_process_in() -> None:
    """The topology's container image reaches the pods from the Plan; --image still overrides."""
    # the servers in docker, the proxy bare
    plan = build_plan(load_topology(REPO / "topologies" / "2p2d-docker.yaml"))
    manifests = render_manifests(plan)
    server_image = plan.process("prefill-0").container.image  # type: ignore[union-attr]
    assert {c["image"] for c in _containers(_lws(manifests, "prefill"))} == {server_image}
    assert {c["image"] for c in _containers(_lws(manifests, "decode"))} == {server_image}
    proxy = next(m.obj for m in manifests if m.obj["kind"] == "Deployment")
    assert [c["image"] for c in _containers(proxy)] == [Options().image]  # runs bare: ucmctl's default
    chosen = render_manifests(plan, Options(image="registry.example.com/team/vllm-ucmctl:1"))
    assert {c["image"] for m in chosen if m.obj["kind"] in ("LeaderWorkerSet", "Deployment")
            for c in _containers(m.obj)} == {"registry.example.com/team/vllm-ucmctl:1"}  # fmt: skip


def test_render_says_which_restart_policies_kubernetes_does_not_keep(tmp_path: Path) -> None:
    """Pods of a Deployment or a LeaderWorkerSet are restarted whenever they end: `never` and
    on-failure's limit are not what the cluster will do, and the command says so for each role."""
    plan = build_plan(load_topology(EP))
    assert restart_notes(plan) == [
        "Kubernetes restarts a pod's container whenever it ends (the kubelet's back-off: 10 s, "
        "doubling to 5 min): `restart: never` of mooncake, prefill, decode, proxy is not kept"
    ]
    text = EP.read_text()
    topo = tmp_path / "ep.yaml"
    topo.write_text(
        text.replace("\ndecode:\n", "\ndecode:\n  restart: {policy: on-failure, max_restarts: 2}\n", 1)
    )
    plan = build_plan(load_topology(topo))
    assert [p.restart.max_restarts for p in plan.processes if p.role == "decode" and p.restart] != []
    notes = restart_notes(plan)
    assert notes[0].endswith("`restart: never` of mooncake, prefill, proxy is not kept")
    assert notes[1].endswith("`restart: on-failure` of decode (at most 2x) is kept without its limit")
    done = _cli("render", str(topo), "--k8s", str(tmp_path / "k"))
    assert done.returncode == 0, done.stderr
    assert [" ".join(n.split()) for n in done.stderr.split("note: ")[1:]] == notes
    # the pods run the engine itself, as without the policy (no supervisor's or systemd unit's
    # script in them)
    on_systemd = tmp_path / "ep-systemd.yaml"
    data = yaml.safe_load(topo.read_text())
    data["nodes"] = {name: {**node, "systemd": True} for name, node in data["nodes"].items()}
    on_systemd.write_text(yaml.safe_dump(data, sort_keys=False))
    systemd_plan = build_plan(load_topology(on_systemd))
    assert {p.restart.by for p in systemd_plan.processes if p.restart} == {"systemd"}
    without = _by_kind(render_manifests(build_plan(load_topology(EP))), "LeaderWorkerSet")
    for with_policy in (plan, systemd_plan):
        rendered = _by_kind(render_manifests(with_policy), "LeaderWorkerSet")
        assert rendered.keys() == without.keys()
        for name in without:
            assert rendered[name]["spec"] == without[name]["spec"], name
