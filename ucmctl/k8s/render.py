"""Plan -> Kubernetes manifests: the same processes, command lines and files as `up` starts
over SSH, as objects a cluster runs (ucmctl only writes them; `kubectl apply -f DIR` runs them).

The layout, one object per file, numbered in apply order:

- a ReadWriteMany PersistentVolumeClaim for the UCM store (mounted at every storage backend
  path of the store's users; several backends are sub-paths of the one claim);
- a ConfigMap with each side's UCM config and, in P2P mode, `mooncake.json` (its master
  address becomes the Mooncake master's Service name);
- `mooncake_master` (P2P) and the proxy: a Deployment and a Service each; the proxy's
  upstreams are the servers' pod DNS names under their LeaderWorkerSet's headless Service;
- one LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`) per side: replicas = instances, size =
  pods per instance. With external DP (one API server per rank, the EP layout) an instance is
  a DP group: a pod per node of the group, a container per rank on that node; the rank and
  the DP master address come from the LWS environment (`LWS_WORKER_INDEX`,
  `LWS_LEADER_ADDRESS`, `LWS_GROUP_SIZE` checked), through a shell. Otherwise an instance is
  one API server: one pod of one container.

What differs from the SSH plan: the scheduler places pods, so the topology's node names and
hosts are not used (listeners bind 0.0.0.0 in their pod; the addresses a process announces,
`VLLM_HOST_IP` and `HCCL_IF_IP`, are the pod's IP); the device plugin gives each container its
cards (`nvidia.com/gpu`, `huawei.com/Ascend910`, ...), so the device variable
(`CUDA_VISIBLE_DEVICES`, ...) is not set; `/dev/shm` is a memory `emptyDir`; files under the
node's run directory live in an `emptyDir`; health is a readiness probe on the Plan's first
health URL (`/health`; `/metrics` for the Mooncake master).

Kubernetes expands `$(NAME)` in `command`, `args` and `env` values and reduces `$$` to `$`:
every `$` of a value from the topology is written `$$`, so values reach the process as
written (as `launch.sh` passes them); every word that reaches a shell is `shlex.quote`d.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ucmctl.core.errors import UcmctlError
from ucmctl.core.names import SERVER_ROLES
from ucmctl.core.platforms import DEVICE_RESOURCE, Platform
from ucmctl.engines import engine_for
from ucmctl.k8s.layout import SideLayout, server_spec, side_layout
from ucmctl.k8s.manifests import Manifest
from ucmctl.k8s.options import Options, check_options, k8s_name
from ucmctl.plan.model import Plan, Process

API_LWS = "leaderworkerset.x-k8s.io/v1"
CONFIG_DIR = "/etc/ucmctl"  # the ConfigMap's files, in every server container
WORK_DIR = "/var/lib/ucmctl"  # what the Plan puts under the node's run directory
ANY_ADDRESS = "0.0.0.0"  # the pod's own interfaces

# Variables that name the node's own address: on Kubernetes, the pod's.
HCCL_IF_IP = "HCCL_IF_IP"  # Ascend's collective address (plan/build.py), with the engine's own


def k8s_escape(text: str) -> str:
    """A value as Kubernetes must hold it to hand the process exactly `text`: `$$` for `$`."""
    return text.replace("$", "$$")


@dataclass(frozen=True)
class Raw:
    """Shell text written as is (Kubernetes `$(LWS_...)` references, arithmetic)."""

    text: str


Word = str | Raw


class _Renderer:
    def __init__(self, plan: Plan, options: Options) -> None:
        self.plan = plan
        self.o = options
        self.base = k8s_name(plan.deployment)
        self.ns = options.namespace
        self.labels = {
            "app.kubernetes.io/name": "ucmctl",
            "app.kubernetes.io/instance": self.base,
            "app.kubernetes.io/managed-by": "ucmctl",
        }
        by_role = {role: [p for p in plan.servers() if p.role == role] for role in SERVER_ROLES}
        self.sides = [side_layout(plan, self.base, role, procs) for role, procs in by_role.items() if procs]
        self.mooncake = next((p for p in plan.processes if p.role == "mooncake"), None)
        self.proxy = next((p for p in plan.processes if p.role == "proxy"), None)
        # replicas: one Deployment of as many pods, each the first's (the base port), one Service
        self.proxy_replicas = sum(1 for p in plan.processes if p.role == "proxy")
        self.config_name = f"{self.base}-config"
        self.store_name = f"{self.base}-store"
        self.mooncake_name = f"{self.base}-mooncake-master"
        self.proxy_name = f"{self.base}-proxy"
        self.config_data: dict[str, str] = {}

    # --- objects ------------------------------------------------------------------------------

    def manifests(self) -> list[Manifest]:
        objs: list[dict[str, Any]] = []
        if self.plan.store is not None:
            objs.append(self._pvc())
        containers = {s.role: [self._server_container(s, c) for c in range(s.per_pod)] for s in self.sides}
        if self.config_data:
            objs.append(self._object("v1", "ConfigMap", self.config_name, "config", data=self.config_data))
        if self.mooncake is not None:
            objs += self._deployment_and_service(self.mooncake, self.mooncake_name, "mooncake")
        for s in self.sides:
            objs.append(self._lws(s, containers[s.role]))
        if self.proxy is not None:
            objs += self._deployment_and_service(self.proxy, self.proxy_name, "proxy", self.proxy_replicas)
        self._check_equal_where_checks_demand(objs)
        return [
            Manifest(f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml", obj)
            for i, obj in enumerate(objs)
        ]

    def _meta(self, name: str, component: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.ns,
            "labels": {**self.labels, "app.kubernetes.io/component": component},
            "annotations": {
                "ucmctl/deployment": self.plan.deployment,
                "ucmctl/topology-digest": self.plan.topology_digest,
            },
        }

    def _object(self, api: str, kind: str, name: str, component: str, **body: Any) -> dict[str, Any]:
        return {"apiVersion": api, "kind": kind, "metadata": self._meta(name, component), **body}

    def _pvc(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": self.o.store_size}},
        }
        if self.o.storage_class:
            spec["storageClassName"] = self.o.storage_class
        return self._object("v1", "PersistentVolumeClaim", self.store_name, "store", spec=spec)

    def _selector(self, component: str) -> dict[str, str]:
        return {
            "app.kubernetes.io/instance": self.base,
            "app.kubernetes.io/component": component,
        }

    def _deployment_and_service(
        self, p: Process, name: str, component: str, replicas: int = 1
    ) -> list[dict[str, Any]]:
        container = self._container(p, name=component, words=self._service_argv(p), env=self._env(p))
        pod = self._pod_template(component, [container], [])
        spec = {"replicas": replicas, "selector": {"matchLabels": self._selector(component)}, "template": pod}
        deployment = self._object("apps/v1", "Deployment", name, component, spec=spec)
        ports = [
            {"name": _port_name(key), "port": port, "targetPort": port, "protocol": "TCP"}
            for key, port in p.ports.items()
        ]
        service = self._object(
            "v1",
            "Service",
            name,
            component,
            spec={"type": "ClusterIP", "selector": self._selector(component), "ports": ports},
        )
        return [deployment, service]

    def _pod_template(
        self, component: str, containers: list[dict[str, Any]], volumes: list[dict[str, Any]]
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": containers}
        if volumes:
            spec["volumes"] = volumes
        labels = {**self.labels, "app.kubernetes.io/component": component}
        return {"metadata": {"labels": labels}, "spec": spec}

    def _lws(self, s: SideLayout, containers: list[dict[str, Any]]) -> dict[str, Any]:
        volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
        items = [{"key": f"{s.role}.{f}", "path": f} for f in sorted(self._side_files(s))]
        if items:
            volumes.append({"name": "config", "configMap": {"name": self.config_name, "items": items}})
        if self._uses_store(s):
            volumes.append({"name": "store", "persistentVolumeClaim": {"claimName": self.store_name}})
        if any(m["name"] == "work" for c in containers for m in c.get("volumeMounts", [])):
            volumes.append({"name": "work", "emptyDir": {}})
        pod = self._pod_template(s.role, containers, volumes)
        spec = {
            "replicas": s.replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": s.size,
                # one rank gone stalls its DP group: the group restarts as a whole
                "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": pod,
            },
        }
        return self._object(API_LWS, "LeaderWorkerSet", s.name, s.role, spec=spec)

    # --- containers ---------------------------------------------------------------------------

    def _container(
        self,
        p: Process,
        *,
        name: str,
        words: list[Word],
        env: list[dict[str, Any]],
        suffix: str = "",
        mounts: list[dict[str, Any]] | None = None,
        resources: dict[str, Any] | None = None,
        prelude: list[str] | None = None,
    ) -> dict[str, Any]:
        platform = self.plan.nodes[p.node].platform
        container: dict[str, Any] = {"name": name, "image": self.o.image_for(platform, p)}
        if any(isinstance(w, Raw) for w in words) or prelude:
            script = "\n".join([*(prelude or []), "exec " + " ".join(_shell_word(w) for w in words)])
            container["command"] = ["/bin/sh", "-c", script]
        else:
            container["command"] = [k8s_escape(w) for w in words if isinstance(w, str)]
        if env:
            container["env"] = env
        container["ports"] = [
            {"name": _port_name(key, suffix), "containerPort": port, "protocol": "TCP"}
            for key, port in p.ports.items()
        ]
        if p.health:
            health = urlsplit(p.health[0])
            container["readinessProbe"] = {
                "httpGet": {"path": health.path or "/", "port": health.port},
                "periodSeconds": 10,
                "timeoutSeconds": 5,
                "failureThreshold": 3,
            }
        if resources:
            container["resources"] = resources
        if mounts:
            container["volumeMounts"] = mounts
        return container

    def _server_container(self, s: SideLayout, c: int) -> dict[str, Any]:
        p = s.templates[c]
        paths = _PathMap(self.plan, p)
        spec = server_spec(p)
        # The Plan's server as the pod runs it: listening on the pod, its rank from the LWS.
        pod = {"host": ANY_ADDRESS}
        prelude: list[str] = []
        if s.external_dp:
            pod |= {"data_parallel_rank": _RANK, "data_parallel_address": _LEADER}
            prelude = [
                "set -eu",
                'case "$(LWS_WORKER_INDEX)" in',
                "  ''|*[!0-9]*) echo 'ucmctl: LWS_WORKER_INDEX is not set: start this pod through its "
                "LeaderWorkerSet' >&2; exit 1 ;;",
                "esac",
                f'if [ "$(LWS_GROUP_SIZE)" != {s.size} ]; then',
                f"  echo 'ucmctl: LWS_GROUP_SIZE differs from the {s.size} pods this command was rendered "
                "for: render again' >&2; exit 1",
                "fi",
            ]
        if spec.kv_transfer_config is not None:
            pod["kv_transfer_config"] = _map_json(spec.kv_transfer_config, paths.map)
        argv = engine_for(self.plan.engine).argv(spec.model_copy(update=pod))
        shell = {
            _RANK: Raw(f'"$$(( $(LWS_WORKER_INDEX) * {s.per_pod} + {c} ))"'),
            _LEADER: Raw('"$(LWS_LEADER_ADDRESS)"'),
        }
        words: list[Word] = [shell.get(w) or paths.map(w) for w in argv]

        for f in p.files:
            if f.path in _start_scripts(p):
                continue
            content = f.content
            if posixpath.basename(f.path) == "mooncake.json":
                content = self._mooncake_json(content)
            key = f"{s.role}.{posixpath.basename(f.path)}"
            if self.config_data.setdefault(key, content) != content:
                raise UcmctlError.one(f"{s.role}: {key} differs between the side's servers")

        mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        if self._side_files(s):
            mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
        if self._uses_store(s) and self.plan.store is not None:
            backends = self.plan.store.backends
            for i, path in enumerate(backends):
                mount = {"name": "store", "mountPath": path}
                if len(backends) > 1:
                    mount["subPath"] = f"backend-{i}"
                mounts.append(mount)
        env = self._env(p, paths)
        if paths.used_work:
            mounts.append({"name": "work", "mountPath": WORK_DIR})
        resources = None
        resource = DEVICE_RESOURCE[Platform(self.plan.nodes[p.node].platform)]
        if resource and p.devices:
            count = len(p.devices)
            resources = {"requests": {resource: count}, "limits": {resource: count}}
        return self._container(
            p,
            name=f"{s.role}-{c}",
            words=words,
            env=env,
            suffix=f"-{c}",
            mounts=mounts,
            resources=resources,
            prelude=prelude,
        )

    def _side_files(self, s: SideLayout) -> list[str]:
        return sorted(
            posixpath.basename(f.path)
            for f in s.templates[0].files
            if f.path not in _start_scripts(s.templates[0])
        )

    def _uses_store(self, s: SideLayout) -> bool:
        return self.plan.uses_store(s.templates[0])

    def _env(self, p: Process, paths: _PathMap | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for key, value in p.env.items():
            if key == p.device_variable:
                continue  # the device plugin makes the container's cards visible
            if key in (HCCL_IF_IP, engine_for(self.plan.engine).host_ip_variable):
                out.append({"name": key, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
                continue
            if paths is not None:
                value = paths.map(value)
            out.append({"name": key, "value": k8s_escape(value)})
        return out

    def _service_argv(self, p: Process) -> list[Word]:
        """The Mooncake master's or the proxy's argv: listeners on the pod, upstreams by DNS (the
        proxy's from its spec, with each server's pod address, without KV-cache events)."""
        if p.proxy is not None:
            urls = self._upstream_urls()

            def by_dns(url: str) -> str:
                if url not in urls:
                    raise AssertionError(f"proxy upstream {url} is no server of the plan")
                return urls[url]

            # no KV-cache events across pods (a pod's publisher port is its DP rank's, its shell's)
            ups = tuple(
                u.model_copy(update={"url": by_dns(u.url), "bootstrap": u.bootstrap and by_dns(u.bootstrap)})
                for u in p.proxy.upstreams
            )
            ups = tuple(u.model_copy(update={"kv_events": None}) for u in ups)
            return list(p.proxy.model_copy(update={"host": ANY_ADDRESS, "upstreams": ups}).argv())
        words: list[Word] = list(p.argv)
        for flag in ("--host", "--rpc_address", "--metrics_host"):
            _set_value(words, flag, ANY_ADDRESS)
        return words

    def _upstream_urls(self) -> dict[str, str]:
        """Each server's URL (and bootstrap URL) in the Plan -> its pod's DNS name."""
        urls: dict[str, str] = {}
        for s in self.sides:
            for p in self.plan.servers():
                if p.name not in s.where or p.url is None:
                    continue
                group, worker, c = s.where[p.name]
                host = s.pod_host(self.ns, group, worker)
                template = s.templates[c]
                urls[p.url] = f"http://{host}:{template.ports['http']}"
                if "bootstrap" in p.ports:
                    plan_host = p.url.rsplit(":", 1)[0]
                    urls[f"{plan_host}:{p.ports['bootstrap']}"] = (
                        f"http://{host}:{template.ports['bootstrap']}"
                    )
        return urls

    def _mooncake_json(self, content: str) -> str:
        assert self.mooncake is not None, "mooncake.json is written only in P2P mode"
        config = json.loads(content)
        config["master_server_address"] = f"{self.mooncake_name}.{self.ns}:{self.mooncake.ports['master']}"
        return json.dumps(config, indent=4, ensure_ascii=False) + "\n"

    def _check_equal_where_checks_demand(self, objs: list[dict[str, Any]]) -> None:
        """PYTHONHASHSEED and --dtype as rendered, on every server: one value each (the
        topology checks demand it of the Plan; this holds the manifests to it too)."""
        seeds, dtypes = set(), set()
        for obj in objs:
            if obj["kind"] != "LeaderWorkerSet":
                continue
            for c in obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"]:
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                seeds.add(env.get("PYTHONHASHSEED"))
                words = (
                    shlex.split(c["command"][2]) if c["command"][:2] == ["/bin/sh", "-c"] else c["command"]
                )
                dtypes.add(words[words.index("--dtype") + 1] if "--dtype" in words else None)
        planned = {p.env.get("PYTHONHASHSEED") for p in self.plan.servers()}
        if seeds and (seeds != planned or len(planned) > 1):
            raise UcmctlError.one(
                f"PYTHONHASHSEED differs between the rendered servers: {sorted(map(str, seeds))}"
            )
        if len(dtypes) > 1:
            raise UcmctlError.one(f"--dtype differs between the rendered servers: {sorted(map(str, dtypes))}")


class _PathMap:
    """The Plan's paths on a node -> where they are in the container: the process's placed files
    in the ConfigMap's folder, anything else under the node's run directory in an emptyDir."""

    def __init__(self, plan: Plan, p: Process) -> None:
        self.files = {f.path: posixpath.join(CONFIG_DIR, posixpath.basename(f.path)) for f in p.files}
        self.run_dir = plan.nodes[p.node].run_dir
        self.used_work = False

    def map(self, value: str) -> str:
        if value in self.files:
            return self.files[value]
        if value == self.run_dir or value.startswith(self.run_dir + "/"):
            self.used_work = True
            return WORK_DIR + value[len(self.run_dir) :]
        return value


def _start_scripts(p: Process) -> set[str]:
    """The scripts that start `p` on a node, not rendered (the container's command is its
    argv): its launch script and, with restart: on-failure, what restarts it there: ucmctl's
    supervisor's script (then its `launch`, and the launch script beside it that it runs) or
    the script of its systemd unit; Kubernetes restarts the container itself."""
    scripts = {p.launch}
    if p.restart is not None and p.restart.by == "supervisor":
        scripts.add(posixpath.join(posixpath.dirname(p.launch), "launch.sh"))
    if p.restart is not None and p.restart.script is not None:
        scripts.add(p.restart.script)
    return scripts


def _map_json(value: Any, fn: Any) -> Any:
    if isinstance(value, dict):
        return {k: _map_json(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_json(v, fn) for v in value]
    return fn(value) if isinstance(value, str) else value


# Words of a server's command line that the pod's shell gives: its DP rank and its group's leader.
_RANK = "\0ucmctl-dp-rank"
_LEADER = "\0ucmctl-dp-leader"


def _first(words: list[Word], flag: str) -> int | None:
    return next((i for i, w in enumerate(words[:-1]) if w == flag), None)


def _set_value(words: list[Word], flag: str, value: Word) -> None:
    """Replace the value of the Plan's own `flag` in the Mooncake master's argv (a server's and
    the proxy's command lines are built from their specs instead)."""
    i = _first(words, flag)
    if i is not None:
        words[i + 1] = value


def _shell_word(word: Word) -> str:
    return word.text if isinstance(word, Raw) else k8s_escape(shlex.quote(word))


def _port_name(key: str, suffix: str = "") -> str:
    """An IANA service name (<= 15 characters, a-z0-9 and single '-')."""
    name = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[: 15 - len(suffix)].rstrip("-")
    return name + suffix


def render_manifests(plan: Plan, options: Options | None = None) -> list[Manifest]:
    """Every object of the deployment, in apply order: a pure function of the Plan."""
    options = options or Options()
    check_options(options)
    return _Renderer(plan, options).manifests()


def restart_notes(plan: Plan) -> list[str]:
    """What of the topology's `restart` Kubernetes does not keep, a line for the roles that say
    `never` and one for those that say `on-failure`: a Deployment's and a LeaderWorkerSet's pods
    restart their containers whenever they end, after the kubelet's back-off (10 s, doubling to
    5 min, with no limit; a LeaderWorkerSet recreates the whole group)."""
    roles: dict[str, Process] = {}
    for p in plan.processes:
        roles.setdefault(str(p.role), p)
    never = [r for r, p in roles.items() if p.restart is None]
    limited = [f"{r} (at most {p.restart.max_restarts}x)" for r, p in roles.items() if p.restart is not None]
    how = (
        "Kubernetes restarts a pod's container whenever it ends (the kubelet's back-off: 10 s, "
        "doubling to 5 min)"
    )
    out = []
    if never:
        out.append(f"{how}: `restart: never` of {', '.join(never)} is not kept")
    if limited:
        out.append(
            f"{how}, with no limit and not after backoff_s: `restart: on-failure` of "
            f"{', '.join(limited)} is kept without its limit"
        )
    return out
