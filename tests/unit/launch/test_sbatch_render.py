"""`ucmctl render --slurm`: the sbatch script of every example topology is valid bash with the
right #SBATCH header and one job step per process; run for real against stand-ins for `srun`,
`curl` and `scancel`, it writes every file byte for byte, hands each step exactly the live
launcher's command, and ends the job when a process fails, with hostile topology values intact."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.launch.sbatch import render_script, write_script
from ucmctl.launch.slurm import container_options
from ucmctl.nodes import lifecycle
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan, SshClusterPlan
from ucmctl.topology.load import load_topology
from ucmctl.topology.model import SlurmCluster

REPO = Path(__file__).resolve().parents[3]
TOPOLOGIES = sorted((REPO / "topologies").glob("*.yaml"))
EP = REPO / "topologies" / "ep-dp4tp8-dp8tp4.yaml"
SLURM = SlurmCluster(kind="slurm", partition="gpu", account="proj-1", qos="normal", time_limit="1-00:00:00")


def slurm_plan(path: Path, cluster: SlurmCluster = SLURM) -> Plan:
    return build_plan(load_topology(path).model_copy(update={"cluster": cluster}))


def sbatch_lines(script: str) -> dict[str, str]:
    """#SBATCH flags as sbatch reads them: the comment block before the first command."""
    flags: dict[str, str] = {}
    for line in script.splitlines()[1:]:
        if line and not line.startswith("#"):
            break
        if line.startswith("#SBATCH "):
            flag, _, value = line.removeprefix("#SBATCH ").partition("=")
            flags[flag] = value
    return flags


def steps(script: str) -> list[list[str]]:
    """Each `srun ... &` line of the script, as the shell splits it (the command may span lines)."""
    found = []
    for start in (m.start() for m in re.finditer(r"^srun ", script, re.MULTILINE)):
        end = script.index(" </dev/null &\n", start)
        found.append(shlex.split(script[start:end]))
    return found


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_every_example_renders_valid_bash_with_its_nodes_and_steps(path: Path, tmp_path: Path) -> None:
    plan = slurm_plan(path)
    written = write_script(plan, tmp_path / "out")
    assert written == tmp_path / "out" / f"{plan.deployment}.sbatch"
    assert stat.S_IMODE(written.stat().st_mode) == 0o755
    script = written.read_text()
    assert script == render_script(plan)
    assert script.startswith("#!/bin/bash\n# Rendered by `ucmctl render --slurm`")
    checked = subprocess.run(["bash", "-n", str(written)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr

    flags = sbatch_lines(script)
    assert flags == {
        "--job-name": f"ucmctl-{plan.deployment}", "--nodes": str(len(plan.nodes)),
        "--nodelist": ",".join(plan.nodes), "--ntasks-per-node": "1", "--exclusive": "",
        "--output": f"ucmctl-{plan.deployment}-%j.out", "--partition": "gpu", "--account": "proj-1",
        "--qos": "normal", "--time": "1-00:00:00",
    }  # fmt: skip
    assert "scancel" in script.split("#SBATCH")[0] and "ucmctl down" in script.split("#SBATCH")[0]

    # one step per process, on its node, in stage order, each running the live launcher's command
    found = steps(script)
    ordered = [p for stage in plan.stages() for p in stage]
    assert len(found) == len(plan.processes)
    for argv, p in zip(found, ordered, strict=True):
        spawn = lifecycle.spawn(p, foreground=True)
        assert argv == ["srun", "--overlap", f"--nodelist={p.node}", "--nodes=1", "--ntasks=1",
                        f"--job-name={p.name}", *container_options(p), "/bin/sh", "-c", spawn]  # fmt: skip
    # each stage is gated before the next one starts
    for first, second in zip(plan.stages(), plan.stages()[1:], strict=False):
        last_gate = max(script.index(f"\ngate {shlex.quote(p.name)} ") for p in first)
        assert all(script.index(f"--job-name={p.name} ") > last_gate for p in second)
    proxy = next((p for p in plan.processes if p.role == "proxy"), None)
    n = len(plan.processes)
    up = f"ucmctl: deployment {plan.deployment} is up: {n} process{'es' if n != 1 else ''}"
    assert up + (f", proxy {proxy.url}" if proxy else "") in script
    assert script.rstrip().endswith("\n  sleep 5\ndone")


def test_the_ep_layout_keeps_its_dp_and_tp_flags() -> None:
    plan = slurm_plan(EP)
    script = render_script(plan)
    servers = plan.servers()
    assert len(servers) == 12 and sbatch_lines(script)["--nodes"] == "8"
    assert {p.name: p.node for p in servers} == {
        argv[5].removeprefix("--job-name="): argv[2].removeprefix("--nodelist=")
        for argv in steps(script) if "--job-name=proxy" not in argv and "mooncake" not in argv[5]
    }  # fmt: skip
    for p in servers:
        launch = next(f.content for f in p.files if f.path == p.launch)
        rank = p.argv[p.argv.index("--data-parallel-rank") + 1]
        size = "4" if p.role == "prefill" else "8"
        assert p.argv[p.argv.index("--data-parallel-size") + 1] == size
        assert p.argv[p.argv.index("--tensor-parallel-size") + 1] == ("8" if p.role == "prefill" else "4")
        assert "--enable-expert-parallel" in p.argv and rank == str(p.dp_rank)
        assert "--data-parallel-rank" in launch and "--enable-expert-parallel" in launch
    assert _files_of(script) == {f.path: (f.content, f.mode) for p in plan.processes for f in p.files}


def _files_of(script: str) -> dict[str, tuple[str, int]]:
    """The files the script writes, decoded from its heredocs (paths as the shell reads them)."""
    files: dict[str, tuple[str, int]] = {}
    pattern = re.compile(r"^base64 -d > ([^\n]+?) <<'UCMCTL_BASE64_END' \|\| fail_files ([^\n]+)\n"
                         r"(.*?)^UCMCTL_BASE64_END\nchmod ([0-7]+) ", re.MULTILINE | re.DOTALL)  # fmt: skip
    for m in pattern.finditer(script):
        path = shlex.split(m.group(2))[0]
        files[path] = (base64.b64decode("".join(m.group(3).split())).decode(), int(m.group(4), 8))
    return files


# --- run for real, with stand-ins for Slurm's commands and curl -------------------------------------

FAKE_SRUN = """#!/bin/sh
# records its arguments (NUL-separated), then stays a moment or fails at once
out="$FAKE_DIR/srun.$$"
for a in "$@"; do printf '%s\\0' "$a"; done > "$out"
[ "$FAKE_MODE" = fail ] && { echo "srun: error: task 0: Exited with exit code 2" >&2; exit 2; }
exit 0
"""
FAKE_CURL = """#!/bin/sh
echo "$@" >> "$FAKE_DIR/curl.log"
[ "$FAKE_MODE" = fail ] && { printf 000; exit 7; }
printf 200
"""
FAKE_SCANCEL = """#!/bin/sh
echo "$@" >> "$FAKE_DIR/scancel.log"
"""


def hostile_topology(tmp: Path) -> tuple[Path, dict[str, str]]:
    """A topology whose model path, work folder and flags hold quotes, spaces and command
    substitutions that would each create a file under `tmp` if a shell ever evaluated them."""
    bad = {
        "model": f"/m o d'e\"l/$(touch {tmp}/pwned1)`touch {tmp}/pwned2`",
        "work": f"{tmp}/w d'$(touch {tmp}/pwned3)\"x; touch {tmp}/pwned4",
        "flag": f"a b $(touch {tmp}/pwned5) 'q' \"r\" \\ $HOME",
    }
    text = f"""
name: hostile
mode: centralized
engine: sim
model: {{path: {json.dumps(bad["model"])}}}
cluster: {{kind: slurm, partition: debug, time_limit: "30:00"}}
nodes:
  h1: {{host: 10.0.0.1, platform: cpu, python: {sys.executable}, workdir: {json.dumps(bad["work"])}}}
  h2: {{host: 10.0.0.2, platform: cpu, python: {sys.executable}, workdir: {json.dumps(bad["work"])}}}
storage: {{storage_backends: {tmp}/store, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [h1], port: 8100, flags: {{block-size: 16, note: {json.dumps(bad["flag"])}}}}}
decode: {{nodes: [h2], port: 8200, flags: {{block-size: 16}}}}
proxy: {{node: h1, port: 8000}}
"""
    path = tmp / "t.yaml"
    path.write_text(text)
    return path, bad


def run_script(
    script: Path, tmp: Path, mode: str, said: Callable[[str], bool] = lambda out: True
) -> subprocess.CompletedProcess[str]:
    """Run the script with the stand-ins; once it says the deployment is up (it then holds the
    allocation until cancelled), wait until its output is what `said` waits for (the stand-in
    steps that ended reported), then end it, as `scancel` would."""
    fake = tmp / "fake"
    fake.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("curl", FAKE_CURL), ("scancel", FAKE_SCANCEL)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "FAKE_DIR": str(fake), "FAKE_MODE": mode,
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "h[1-2]"}  # fmt: skip
    return run_until_up(["bash", str(script)], env, tmp, said)


def run_until_up(
    argv: list[str], env: dict[str, str], cwd: Path, said: Callable[[str], bool] = lambda out: True
) -> subprocess.CompletedProcess[str]:
    out, err = cwd / "script.out", cwd / "script.err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(argv, stdout=o, stderr=e, text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and "is up" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        deadline = time.monotonic() + 30  # the script looks at its steps every 5 s
        while proc.poll() is None and time.monotonic() < deadline:
            if said(out.read_text()) and _holding(proc.pid):  # it said so, then held on
                break
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # as scancel ends the batch script and its steps
        proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out.read_text(), err.read_text())


def _holding(pid: int) -> bool:
    """Whether the script `pid` sleeps in its loop that holds the allocation (a `sleep` child)."""
    for info in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            ppid = info.read_text().rsplit(")", 1)[1].split()[1]
            if ppid == str(pid) and (info.parent / "cmdline").read_bytes().startswith(b"sleep\0"):
                return True
    return False


def recorded_steps(tmp: Path) -> list[list[str]]:
    return [p.read_bytes().decode().split("\0")[:-1] for p in sorted((tmp / "fake").glob("srun.*"))]


def test_hostile_values_reach_files_and_steps_intact(tmp_path: Path) -> None:
    topo, bad = hostile_topology(tmp_path)
    plan = build_plan(load_topology(topo))
    assert any(bad["model"] in p.argv for p in plan.processes)
    script = write_script(plan, tmp_path / "out")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    ended = [f"ucmctl: {p.name} on {p.node} ended (its log: {p.log})" for p in plan.processes]
    done = run_script(script, tmp_path, "ok", said=lambda out: all(e in out for e in ended))
    assert done.returncode == -signal.SIGKILL, done.stderr + done.stdout  # held until cancelled
    assert "ucmctl: deployment hostile is up: 3 processes, proxy http://10.0.0.1:8000" in done.stdout
    for e in ended:  # the stand-in steps ended at once: each reported, the job still held
        assert e in done.stdout
    assert not list(tmp_path.glob("pwned*")), "a topology value was evaluated by a shell"

    placed = [f for p in plan.processes for f in p.files]
    assert len(placed) == 5
    for f in placed:  # written byte for byte, with its mode, no staging file left
        assert Path(f.path).read_bytes() == f.content.encode(), f.path
        assert stat.S_IMODE(Path(f.path).stat().st_mode) == f.mode
    assert not [p for p in Path(placed[0].path).parent.parent.rglob("*staging*")]
    launch = Path(plan.process("prefill-0").launch).read_text()
    assert shlex.quote(bad["model"]) in launch or bad["model"] in launch

    # each step got exactly the live launcher's command, as one argument
    ran = {argv[4]: argv for argv in recorded_steps(tmp_path)}
    assert set(ran) == {"--job-name=prefill-0", "--job-name=decode-0", "--job-name=proxy"}
    for p in plan.processes:
        assert ran[f"--job-name={p.name}"] == ["--overlap", f"--nodelist={p.node}", "--nodes=1", "--ntasks=1",
                                               f"--job-name={p.name}", "/bin/sh", "-c",
                                               lifecycle.spawn(p, foreground=True)]  # fmt: skip
    probed = (tmp_path / "fake" / "curl.log").read_text()
    assert [line.split()[-1] for line in probed.splitlines()] == [u for p in plan.processes for u in p.health]
    assert not (tmp_path / "fake" / "scancel.log").exists()


def test_a_step_that_ends_before_its_health_cancels_the_job(tmp_path: Path) -> None:
    topo, _ = hostile_topology(tmp_path)
    plan = build_plan(load_topology(topo))
    log = Path(plan.process("prefill-0").log)
    script = write_script(plan, tmp_path / "out")
    log.parent.mkdir(parents=True, exist_ok=True)
    done = run_script(script, tmp_path, "fail")
    assert done.returncode == 1, done.stderr + done.stdout
    said = done.stderr
    failed = r"ucmctl: (prefill|decode)-0 on h[12] failed: its job step ended before it became healthy"
    assert re.search(failed, said), said
    assert "last lines of" in said and (tmp_path / "fake" / "scancel.log").read_text() == "4242\n"
    assert "is up" not in done.stdout
    assert len(recorded_steps(tmp_path)) == 2  # the proxy's stage never started


def test_a_health_timeout_names_the_url(tmp_path: Path) -> None:
    topo, _ = hostile_topology(tmp_path)
    plan = build_plan(load_topology(topo))
    quick = plan.model_copy(
        update={"processes": [p.model_copy(update={"health_timeout": 1.0}) for p in plan.processes]}
    )
    script = write_script(quick, tmp_path / "out")
    fake_srun = FAKE_SRUN.replace("exit 0\n", "exec sleep 30 >/dev/null 2>&1\n")  # runs on, never healthy
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "srun").write_text(fake_srun)
    (fake / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "FAKE_DIR": str(fake), "FAKE_MODE": "slow",
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h[1-2]"}  # fmt: skip
    (fake / "curl").write_text("#!/bin/sh\nprintf 503\n")
    (fake / "curl").chmod(0o755)
    (fake / "scancel").write_text(FAKE_SCANCEL)
    (fake / "scancel").chmod(0o755)
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path, start_new_session=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the stand-ins still sleeping (Slurm's scancel ends steps)
    assert proc.returncode == 1, err
    assert "prefill-0 on h1 failed: http://10.0.0.1:8100/health did not answer 200 within 1 s" in err, err


def test_python_probes_health_where_curl_is_missing(tmp_path: Path) -> None:
    """No curl on the batch node: the nodes' Python asks (and a server that answers passes)."""
    import http.server
    import threading

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path.endswith(("/health", "/v1/models")) else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        topo, _ = hostile_topology(tmp_path)
        plan = build_plan(load_topology(topo))
        base = f"http://127.0.0.1:{server.server_address[1]}"
        local = [p.model_copy(update={"health": [u.replace(str(p.url), base) for u in p.health]})
                 for p in plan.processes]  # fmt: skip
        script = write_script(plan.model_copy(update={"processes": local}), tmp_path / "out")
        fake = tmp_path / "fake"
        fake.mkdir()
        for name, body in (("srun", FAKE_SRUN), ("scancel", FAKE_SCANCEL)):
            (fake / name).write_text(body)
            (fake / name).chmod(0o755)
        # a PATH without curl: only the stand-ins and the basic tools the script needs
        tools = fake / "tools"
        tools.mkdir()
        for tool in ("base64", "mkdir", "chmod", "mv", "rm", "date", "sleep", "tail", "cat", "hostname"):
            found = shutil.which(tool)
            assert found, tool
            (tools / tool).symlink_to(found)
        env = {"PATH": f"{fake}:{tools}", "FAKE_DIR": str(fake), "FAKE_MODE": "ok", "SLURM_JOB_ID": "9",
               "SLURM_JOB_NODELIST": "h1"}  # fmt: skip
        done = run_until_up(["/bin/bash", str(script)], env, tmp_path)
        assert "deployment hostile is up" in done.stdout, done.stderr
    finally:
        server.shutdown()


def test_a_value_slurm_would_misread_is_refused() -> None:
    plan = slurm_plan(REPO / "topologies" / "1p1d.yaml")
    assert plan.cluster.kind == "slurm"
    odd = plan.model_copy(update={"cluster": plan.cluster.model_copy(update={"partition": "gpu x"})})
    with pytest.raises(UcmctlError, match="Slurm reads that line unquoted"):
        render_script(odd)
    without = plan.model_copy(update={"cluster": SshClusterPlan()})
    with pytest.raises(UcmctlError, match=re.escape("cluster: {kind: slurm")):
        render_script(without)


# --- the command line ------------------------------------------------------------------------------


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ucmctl", *args], capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, cwd=cwd,
    )  # fmt: skip


def test_cli_render_slurm_prints_the_path_and_how_to_submit(tmp_path: Path) -> None:
    hostile_topology(tmp_path)
    done = _cli("render", "t.yaml", "--slurm", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "out/hostile.sbatch" and (tmp_path / "out" / "hostile.sbatch").is_file()
    assert "`sbatch out/hostile.sbatch`" in lines[1] and "ucmctl down t.yaml" in lines[1]
    assert len(lines) == 2 and done.stderr == ""


@pytest.mark.parametrize(
    "args",
    [["--slurm", "a", "--k8s", "b"], []],
    ids=["both", "neither"],
)
def test_cli_render_needs_exactly_one_target(args: list[str], tmp_path: Path) -> None:
    done = _cli("render", str(EP), *args, cwd=tmp_path)
    assert done.returncode == ExitStatus.BAD_INPUT
    said = "error: ucmctl render: pass exactly one of --k8s DIR, --slurm DIR or --prometheus DIR\n"
    assert done.stderr == said
    assert list(tmp_path.iterdir()) == []


def test_cli_render_slurm_without_a_slurm_cluster_says_what_to_add(tmp_path: Path) -> None:
    done = _cli("render", str(EP), "--slurm", str(tmp_path / "out"))
    assert done.returncode == ExitStatus.BAD_INPUT
    assert done.stderr.count("\n") == 1 and "--slurm needs a Slurm cluster" in done.stderr
    assert "cluster: {kind: slurm" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_pyxis_step_runs_in_its_image_with_the_nodes_folders() -> None:
    """The pyxis options of a job step, exactly (the live launcher adds the same: launch/slurm.py)."""
    plan = build_plan(load_topology(REPO / "topologies" / "slurm-pyxis.yaml"))
    prefill = plan.process("prefill-0")
    work = "/shared/ucmctl/slurm-pyxis/prefill-0"
    step = next(s for s in steps(render_script(plan)) if "--job-name=prefill-0" in s)
    model = "/shared/models/Qwen2.5-7B-Instruct"
    assert step[:step.index("/bin/sh")] == [
        "srun", "--overlap", "--gres=npu:2", "--nodelist=n1", "--nodes=1", "--ntasks=1",
        "--job-name=prefill-0", "--container-image=registry.example.com#ascend/vllm-ascend-ucmctl:v0.11.0rc1",
        f"--container-mounts={work}:{work},{model}:{model}:ro,"
        "/shared/kv:/shared/kv,/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro",
        f"--container-workdir={work}", "--no-container-mount-home",
    ]  # fmt: skip
    # inside, the image's own engine and Python; the launch script sets the environment
    assert prefill.argv[:2] == ["vllm", "serve"] and plan.process("proxy").argv[0] == "python3"
    assert prefill.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"


def test_an_oci_step_runs_in_the_bundle_ucmctl_derives_with_the_nodes_folders() -> None:
    """Slurm's own container support: the step names the bundle `ucmctl image build` makes beside
    the topology's, whose config.json carries the node's folders (Slurm takes mounts from it only)."""
    plan = build_plan(load_topology(REPO / "topologies" / "slurm-oci.yaml"))
    prefill, decode = plan.process("prefill-0"), plan.process("decode-0")
    assert prefill.container is not None and decode.container is not None
    bundle = prefill.container.image
    base, _, digest = bundle.rpartition(".ucmctl-")
    assert base == "/shared/bundles/vllm-openai-v0.11.0" and len(digest) == 12
    step = next(s for s in steps(render_script(plan)) if "--job-name=prefill-0" in s)
    assert step[:step.index("/bin/sh")] == [
        "srun", "--overlap", "--gres=gpu:2", "--nodelist=n1", "--nodes=1", "--ntasks=1",
        "--job-name=prefill-0", f"--container={bundle}",
    ]  # fmt: skip
    run, model = "/shared/ucmctl/slurm-oci", "/shared/models/Qwen2.5-7B-Instruct"
    assert prefill.container.mounts == [f"{run}:{run}", f"{model}:{model}:ro", "/shared/kv:/shared/kv",
                                        "/shared/hf-cache:/root/.cache/huggingface"]  # fmt: skip
    # the same folders on both nodes: one bundle (on the shared folder, made once)
    proxy = plan.process("proxy").container
    assert decode.container.image == bundle and proxy is not None and proxy.image == bundle
    assert prefill.argv[:2] == ["vllm", "serve"] and prefill.env["CUDA_VISIBLE_DEVICES"] == "0,1"
