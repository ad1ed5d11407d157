"""`ucmctl bench --fault` on a local 2P2D of the simulator: decode-0 killed with SIGKILL 8 s into
the measure phase. The requests that failed are exactly the answers cut after tokens had gone
out (none failed before its first token: the proxy sent those again), the requests sent after
the kill were all served by the decode that stayed, the loss was reported within 10 s, and a
fault that names no process or no time in the phase is refused before anything is sent."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.deploy.test_local_lifecycle import deployed, spawn, topology, ucmctl
from tests.support.openai_checks import counter
from ucmctl.deploy.state import StateStore

pytestmark = pytest.mark.slow

# 80 requests at 4/s, each 60 tokens at 25 ms a step (1.5 s): ~3 answers streaming per decode
BENCH = ["bench", "--prefix-ratio", "0", "--input-len", "64", "--output-len", "60",
         "--num-prompts", "80", "--request-rate", "4", "-q"]  # fmt: skip


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, int]]]:
    """(the state folder, the ports) of a running 2P2D of the simulator on this machine."""
    tmp = tmp_path_factory.mktemp("fault")
    home, workdir = tmp / "home", tmp / "work"
    decode = "servers_per_node: 2, flags: {decode-step-ms: 25}, restart: {policy: on-failure, backoff_s: 1}"
    topo = topology(tmp, "t-fault", workdir, decode=decode, prefill="servers_per_node: 2")
    proxy = re.search(r"^proxy: \{node: me, port: (\d+)\}$", topo.read_text(), re.MULTILINE)
    assert proxy is not None
    # back within the 6 s window after a kill; a decode silent 2 s is out of routing (a hang)
    restart = ", stall_timeout: 2, restart: {policy: on-failure, backoff_s: 1}}"
    topo.write_text(topo.read_text().replace(proxy[0], proxy[0][:-1] + restart))
    sides = yaml.safe_load(topo.read_text())
    ports = {side: sides[side]["port"] for side in ("prefill", "decode", "proxy")}
    taken = [
        *ports.values(),
        ports["prefill"] + 1,
        ports["decode"] + 1,
        ports["decode"] + 2,
        ports["decode"] + 3,
    ]  # + a scaled one, and the edited topology's decodes a port up
    assert len(set(taken)) == len(taken), ports
    with deployed(home, topo, workdir):
        yield home, ports


def bench_with_fault(
    home: Path, tmp: Path, fault: str
) -> tuple[subprocess.CompletedProcess[str], dict, dict]:
    """`bench` of BENCH with `fault`: (the command's outcome, its one cell, the cell's fault)."""
    save = tmp / "run.json"
    done = ucmctl(home, *BENCH, "--fault", fault, "--save", str(save), timeout=300)
    (cell,) = json.loads(save.read_text())["cells"]
    return done, cell, cell["measure"]["fault"]


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("kill:decode-9@5s", "deployment 't-fault' has no process 'decode-9'"),
        ("kill:decode-0@0s", "the time must be after the phase's start"),
        ("kill:decode-0@30s", "sends its 80 requests within about 20 s at 4/s, before 30 s"),
        ("pause:decode-0@5s", "'pause' is not an action"),
        ("kill:decode-0", "is not a fault"),
    ],
)
def test_a_fault_outside_the_deployment_or_the_phase_is_refused(
    pd: tuple[Path, dict[str, int]], fault: str, said: str
) -> None:
    home, ports = pd
    decode = f"http://127.0.0.1:{ports['decode']}"
    before = counter(decode, "vllm:request_success_total")
    done = ucmctl(home, *BENCH, "--fault", fault)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "--fault" in done.stderr, done.stderr
    assert counter(decode, "vllm:request_success_total") == before  # nothing was sent


def test_fault_with_url_is_refused(pd: tuple[Path, dict[str, int]]) -> None:
    home, ports = pd
    done = ucmctl(home, *BENCH, "--url", f"http://127.0.0.1:{ports['proxy']}", "--fault", "kill:decode-0@5s")
    assert done.returncode == 2 and "with --url there is none" in done.stderr, done.stderr


def test_a_decode_killed_mid_phase_costs_no_answer_and_comes_back(
    tmp_path: Path, pd: tuple[Path, dict[str, int]]
) -> None:
    home, ports = pd
    done, cell, f = bench_with_fault(home, tmp_path, "kill:decode-0@6s")
    assert f["injected"] and f["was_running"] and f["spec"] == "kill:decode-0@6s", f
    assert 5.5 <= f["into_s"] <= 8, f
    # No request failed: those not answered yet went to decode-1 (retried before their first
    # token), and every answer cut mid-stream went on there (migrated: its context from the store)
    assert f["failed"] == cell["measure"]["failed"] == 0, f
    assert f["migrated"] == f["cut_mid_stream"] >= 1 and f["not_migrated"] == 0, f
    assert f["resume_gap_ms"]["answers"] == f["migrated"] and f["resume_gap_ms"]["p50"] > 0, f
    assert done.returncode == 0, done.stderr
    assert f"moved to another instance {f['migrated']}, not 0; resume gap p50 " in done.stdout, done.stdout
    assert f["streaming_on_it"] is not None and f["in_flight_on_it"] >= f["streaming_on_it"], f
    # The 6 s after it: every request sent was served (by decode-1, then decode-0 again).
    assert f["window_s"] == 6 and f["after"]["requests"] >= 15 and f["after"]["failed"] == 0, f
    # those cut were sent before it (and their TTFT and E2EL are not in its figures)
    assert f["before"]["requests"] >= 15 and f["before"]["failed"] == f["failed"], f
    assert f["after"]["p50_ttft_ms"] is not None and f["after"]["p50_e2el_ms"] >= 60 * 25, f
    assert f["detected_after_s"] is not None and f["detected_after_s"] <= 10, f
    # restart: on-failure (ucmctl's supervisor, 1 s after): back, and what it served since came
    # from the store (centralized: the prefill leg had saved every prompt)
    assert f["back_after_s"] is not None and f["back_after_s"] <= 15, f
    assert f["store_since_back"]["hit_tokens"] > 0, f
    # its counters began again: the phase's hit rate takes them from its restart, and says so
    assert cell["measure"]["hit_rate"]["restarted"] == ["decode-0"], cell["measure"]["hit_rate"]
    assert "decode-0 started again within the phase" in " ".join(done.stdout.split()), done.stdout
    (lost,) = cell["measure"]["lost"]
    assert lost["process"] == "decode-0" and "137" in lost["how"], lost
    assert "measure 64: fault kill:decode-0@6s sent " in done.stdout, done.stdout
    assert "reported lost " in done.stdout and "6 s after: " in done.stdout, done.stdout
    assert "since back: " in done.stdout and " prompt tokens from the store" in done.stdout, done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80, done.stdout
    decode1 = f"http://127.0.0.1:{ports['decode'] + 1}"
    assert counter(decode1, "vllm:request_success_total") >= 40  # it kept serving
    decode0 = f"http://127.0.0.1:{ports['decode']}"
    assert counter(decode0, "vllm:request_success_total") >= 5  # back in routing
    status = ucmctl(home, "status")
    row = next(line for line in status.stdout.splitlines() if line.startswith("decode-0 "))
    assert row.split()[-1] == "1" and row.split()[-2] == "-", status.stdout  # restarts; no uptime
    assert "running, restarted 1x" in row and "(last exit 137), healthy" in status.stdout, status.stdout
    saved = str(tmp_path / "run.json")  # where bench_with_fault saved it
    refused = ucmctl(home, "bench", "compare", saved, saved)
    assert refused.returncode == 2 and "--allow-lost" in refused.stderr, refused.stderr


def test_a_decode_hung_mid_phase_costs_no_answer_and_is_let_go(
    tmp_path: Path, pd: tuple[Path, dict[str, int]]
) -> None:
    """`hang:` stops decode-1 (SIGSTOP: alive, its connections open, silent) 6 s in: the proxy
    finds it by its silence (stall_timeout 2 s), moves its answers to decode-0 and sends the
    requests waiting there elsewhere, so no request fails; SIGCONT at the phase's end, and it is
    back in routing once it answers a completion."""
    home, ports = pd
    proxy = f"http://127.0.0.1:{ports['proxy']}"
    decode1 = f"http://127.0.0.1:{ports['decode'] + 1}"
    stalls = f'ucmctl_proxy_instance_stalls_total{{instance="{decode1}"'
    before = _sample(proxy, stalls)
    done, cell, f = bench_with_fault(home, tmp_path, "hang:decode-1@6s")
    assert done.returncode == 0, done.stderr
    assert f["injected"] and f["was_running"] and f["released"] is True, f
    assert f["failed"] == cell["measure"]["failed"] == 0, f
    assert f["migrated"] == f["cut_mid_stream"] >= 1 and f["not_migrated"] == 0, f
    assert f["resume_gap_ms"]["answers"] == f["migrated"] and f["resume_gap_ms"]["p50"] >= 2000, f
    assert _sample(proxy, stalls) == before + 1
    assert f["after"]["requests"] >= 15 and f["after"]["failed"] == 0, f
    assert "fault hang:decode-1@6s sent " in done.stdout and "let go at the phase's end" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80, done.stdout
    routed = f'ucmctl_proxy_instance_stalled{{instance="{decode1}"'
    deadline = time.monotonic() + 15
    while _sample(proxy, routed) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sample(proxy, routed) == 0  # it answered a completion: back in routing


def _sample(url: str, prefix: str) -> float:
    """The value of the one sample at `url`/metrics whose line starts with `prefix`."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        (line,) = [x for x in r.read().decode().splitlines() if x.startswith(prefix)]
    return float(line.rsplit(" ", 1)[1])


def test_a_rolling_restart_during_a_run_loses_no_request(
    tmp_path: Path, pd: tuple[Path, dict[str, int]]
) -> None:
    home, _ = pd
    save = tmp_path / "run.json"
    run = spawn(home, *BENCH, "--save", str(save))
    time.sleep(3)  # the measure phase is under way
    restarted = ucmctl(home, "restart", "--rolling", "--drain-timeout", "30", timeout=300)
    out, err = run.communicate(timeout=300)
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.strip() == "4 processes restarted", restarted.stdout
    for name in ("prefill-0", "prefill-1", "decode-0", "decode-1"):  # one at a time, in plan order
        assert re.search(rf"^{name} on me: restarted in [0-9.]+ s \(drained in [0-9.]+ s\)$",
                         restarted.stderr, re.MULTILINE), restarted.stderr  # fmt: skip
    (cell,) = json.loads(save.read_text())["cells"]
    # every request of the run was answered, while each server in turn was drained and restarted
    assert cell["measure"]["failed"] == 0 and cell["measure"]["completed"] == 80, (out, err)
    assert run.returncode == 0, err
    record = json.loads((home / "deployments" / "t-fault.json").read_text())
    assert {n: s["restarts"] for n, s in record["processes"].items()} == {
        "prefill-0": 1, "prefill-1": 1, "decode-0": 1, "decode-1": 1, "proxy": 0}  # fmt: skip
    status = ucmctl(home, "status")
    assert status.stdout.count(", healthy") == 5, status.stdout


def test_a_rolling_restart_moves_long_answers_instead_of_waiting_for_them(
    tmp_path: Path, pd: tuple[Path, dict[str, int]]
) -> None:
    """Answers of 600 tokens (15 s each) streaming from both decode instances: a rolling restart
    of the two moves each one's answers to the other after --move-after 1 s (they go on from the
    store) instead of waiting for them: each restart takes seconds, and no answer fails."""
    home, ports = pd
    before = _migrations(ports["proxy"])
    save = tmp_path / "run.json"
    long = ["bench", "--prefix-ratio", "0", "--input-len", "64", "--output-len", "600",
            "--num-prompts", "8", "--request-rate", "2", "-q", "--save", str(save)]  # fmt: skip
    run = spawn(home, *long)
    time.sleep(4)  # every answer streaming
    restarted = ucmctl(home, "restart", "--rolling", "--move-after", "1", "decode-0", "decode-1", timeout=120)
    out, err = run.communicate(timeout=300)
    assert restarted.returncode == 0 and restarted.stdout.strip() == "2 processes restarted", restarted.stderr
    took = re.findall(r"^decode-\d on me: restarted in ([0-9.]+) s \(drained in ([0-9.]+) s\)$",
                      restarted.stderr, re.MULTILINE)  # fmt: skip
    assert len(took) == 2, restarted.stderr
    # each drained within a second or two after the move (its answers had 8-15 s to go)
    print(f"restarted in (s, drained in s): {took}")
    assert all(float(drained) <= 4 and float(total) <= 10 for total, drained in took), took
    (cell,) = json.loads(save.read_text())["cells"]
    assert cell["measure"]["failed"] == 0 and cell["measure"]["completed"] == 8, (out, err)
    after = _migrations(ports["proxy"])
    moved = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    # the first instance's answers, and the second's (some moved twice); none failed or stayed
    assert set(moved) == {'outcome="resumed",cause="drain"'} and moved['outcome="resumed",cause="drain"'] >= 4


def _migrations(port: int) -> dict[str, float]:
    """The proxy's migrations counter by its labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(r"^ucmctl_proxy_migrations_total\{(.*)\} (\S+)$", text, re.MULTILINE)
    return {labels: float(value) for labels, value in found}


def test_a_restart_that_would_leave_a_role_unrouted_or_names_no_process_is_refused(
    pd: tuple[Path, dict[str, int]],
) -> None:
    home, _ = pd
    both = ucmctl(home, "restart", "prefill-0", "prefill-1")
    assert both.returncode == 2, both.stderr
    assert "restarting prefill-0, prefill-1 leaves no prefill instance in routing" in both.stderr
    unknown = ucmctl(home, "restart", "decode-9")
    assert unknown.returncode == 2, unknown.stderr
    assert "'decode-9' is neither a deployment on this machine nor a process of t-fault" in unknown.stderr
    named = ucmctl(home, "restart", "t-fault", "decode-9")
    assert named.returncode == 2 and "no process decode-9 in t-fault" in named.stderr, named.stderr
    with StateStore(home / "deployments").lock("t-fault", "up"):  # as a running `up` holds it
        busy = ucmctl(home, "restart", "decode-0")
        scaling = ucmctl(home, "scale", "--decode", "3")
    assert busy.returncode == 4 and "deployment 't-fault' is busy" in busy.stderr, busy.stderr
    assert scaling.returncode == 4 and "deployment 't-fault' is busy" in scaling.stderr, scaling.stderr


# Binds the port as soon as it is free and answers 200 to everything: what a health check of
# that port cannot tell from the server that should be there.
SQUATTER = r"""
import http.server, sys, time
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args): pass
while True:
    try:
        server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok)
        break
    except OSError:
        time.sleep(0.002)
server.serve_forever()
"""


def test_a_port_taken_while_a_server_restarts_fails_the_restart_not_passes_its_health(
    pd: tuple[Path, dict[str, int]],
) -> None:
    home, ports = pd
    squatter = subprocess.Popen([sys.executable, "-c", SQUATTER, str(ports["decode"])])
    try:
        taken = ucmctl(home, "restart", "decode-0", timeout=120)
    finally:
        squatter.kill()
        squatter.wait()
    assert taken.returncode == 1, (taken.stdout, taken.stderr)
    said = " ".join(taken.stderr.split())
    assert (
        f"port {ports['decode']} in use by another process once decode-0 stopped: not started again" in said
    ), said
    assert "restarted" not in taken.stdout, taken.stdout
    back = ucmctl(home, "restart", "decode-0", timeout=120)
    assert back.returncode == 0 and back.stdout.strip() == "1 process restarted", (back.stdout, back.stderr)
    status = ucmctl(home, "status")
    assert status.stdout.count(", healthy") == 5, status.stdout


def test_scale_decode_up_and_down_during_a_run_loses_no_request(
    tmp_path: Path, pd: tuple[Path, dict[str, int]]
) -> None:
    home, ports = pd
    save = tmp_path / "run.json"
    run = spawn(home, *BENCH, "--save", str(save))
    time.sleep(2)
    up = ucmctl(home, "scale", "--decode", "3", timeout=300)
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == "added decode-2", up.stdout
    assert re.search(r"^decode-2 on me: added in [0-9.]+ s$", up.stderr, re.MULTILINE), up.stderr
    assert "decode-2: KV probe: prefill-0 -> decode-2: external prefix hits grew by " in up.stderr, up.stderr
    decode2 = f"http://127.0.0.1:{ports['decode'] + 2}"
    time.sleep(4)  # it takes its share of the run
    served = counter(decode2, "vllm:request_success_total")
    assert served >= 1
    down = ucmctl(home, "scale", "--decode", "2", timeout=300)
    assert down.returncode == 0, down.stderr
    assert down.stdout.strip() == "took out decode-2", down.stdout
    out, err = run.communicate(timeout=300)
    (cell,) = json.loads(save.read_text())["cells"]
    assert cell["measure"]["failed"] == 0 and cell["measure"]["completed"] == 80, (out, err)
    record = json.loads((home / "deployments" / "t-fault.json").read_text())
    assert [p["name"] for p in record["plan"]["processes"] if p["role"] == "decode"] == [
        "decode-0",
        "decode-1",
    ]
    assert "decode-2" not in record["processes"]
    status = ucmctl(home, "status")
    assert "decode-2" not in status.stdout and status.stdout.count(", healthy") == 5, status.stdout
    listed = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ports['proxy']}/instances").read())
    assert sorted(i["url"] for i in listed["instances"] if i["role"] == "decode") == [
        f"http://127.0.0.1:{ports['decode']}", f"http://127.0.0.1:{ports['decode'] + 1}"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--decode", "0"], "--decode 0: a side keeps at least 1 instance"),
        ([], "say how many: --prefill N, --decode M"),
        (["--mixed", "2"], "deployment 't-fault' has no mixed side"),
    ],
)
def test_scale_refuses_what_it_cannot_do(pd: tuple[Path, dict[str, int]], args: list[str], said: str) -> None:
    home, _ = pd
    done = ucmctl(home, "scale", *args)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_a_scale_onto_a_taken_port_is_refused_before_anything_changes(
    pd: tuple[Path, dict[str, int]],
) -> None:
    home, ports = pd
    before = json.loads((home / "deployments" / "t-fault.json").read_text())
    with socket.socket() as taken:  # decode-2's port is in use: `up`'s preflight says so
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past an earlier run's TIME_WAIT
        taken.bind(("127.0.0.1", ports["decode"] + 2))
        taken.listen()
        done = ucmctl(home, "scale", "--decode", "3", timeout=300)
    assert done.returncode == 3, done.stderr
    assert f"port {ports['decode'] + 2} (decode-2 http) is already in use" in done.stderr, done.stderr
    assert json.loads((home / "deployments" / "t-fault.json").read_text()) == before


@contextlib.contextmanager
def taken_with_a_free_port_after() -> Iterator[socket.socket]:
    """A listening socket on a port whose next port is free (a bind says so): decode-0 and
    decode-1's new ports. The next port may be another socket's (an ephemeral port of the
    deployment's own connections): then another pair."""
    for _ in range(50):
        taken = socket.socket()
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        try:
            with socket.socket() as beside:
                beside.bind(("127.0.0.1", taken.getsockname()[1] + 1))
        except OSError:
            taken.close()
            continue
        with taken:
            taken.listen()
            yield taken
        return
    raise AssertionError("no port with a free port after it in 50 tries")


def test_up_that_moves_a_server_onto_a_taken_port_is_refused_before_anything_changes(
    tmp_path: Path, pd: tuple[Path, dict[str, int]]
) -> None:
    """A changed topology that gives the decode servers other ports: the new ports are checked
    as `up` checks them (not those the servers hold now, which are their own)."""
    home, _ = pd
    before = json.loads((home / "deployments" / "t-fault.json").read_text())
    original = Path(before["topology_path"])
    sides = yaml.safe_load(original.read_text())
    with taken_with_a_free_port_after() as taken:
        moved_to = taken.getsockname()[1]
        sides["decode"]["port"] = moved_to
        edited = tmp_path / "t-fault.yaml"
        edited.write_text(yaml.safe_dump(sides, sort_keys=False))
        done = ucmctl(home, "up", str(edited), timeout=300)
    assert done.returncode == 3, done.stderr
    said = " ".join(done.stderr.split())
    assert f"port {moved_to} (decode-0 http) is already in use" in said, said
    assert f"port {moved_to + 1}" not in said and "already runs" not in said, said
    assert json.loads((home / "deployments" / "t-fault.json").read_text()) == before
    status = ucmctl(home, "status")
    assert status.stdout.count(", healthy") == 5, status.stdout


def test_a_scale_whose_new_instance_fails_is_undone(pd: tuple[Path, dict[str, int]]) -> None:
    home, _ = pd
    before = json.loads((home / "deployments" / "t-fault.json").read_text())
    decode1 = next(p for p in before["plan"]["processes"] if p["name"] == "decode-1")
    log = Path(decode1["log"].replace("decode-1", "decode-2"))
    log.unlink(missing_ok=True)  # an earlier scale's
    log.mkdir(parents=True, exist_ok=True)  # its log cannot be opened: decode-2 cannot start
    try:
        done = ucmctl(home, "scale", "--decode", "3", timeout=300)
    finally:
        log.rmdir()
    assert done.returncode == 1, done.stderr
    assert "decode-2 on node me did not come up" in done.stderr
    assert "the instances this change added are stopped again" in " ".join(done.stderr.split())
    after = json.loads((home / "deployments" / "t-fault.json").read_text())
    assert after["plan"] == before["plan"] and after["processes"].keys() == before["processes"].keys()
    status = ucmctl(home, "status")
    assert "decode-2" not in status.stdout and status.stdout.count(", healthy") == 5, status.stdout


def test_up_of_an_edited_topology_starts_restarts_and_stops_only_what_changed_during_a_run(
    tmp_path: Path, pd: tuple[Path, dict[str, int]]
) -> None:
    home, ports = pd
    record = json.loads((home / "deployments" / "t-fault.json").read_text())
    original = Path(record["topology_path"])
    edited = tmp_path / "t-fault.yaml"  # decode: a third instance, a flag changed, a port up
    text = original.read_text()
    was = f"port: {ports['decode']}, servers_per_node: 2, flags: {{decode-step-ms: 25}}"
    now = f"port: {ports['decode'] + 1}, servers_per_node: 3, flags: {{decode-step-ms: 20}}"
    assert text.count(was) == 1, text
    edited.write_text(text.replace(was, now))
    pids = {n: s["pgid"] for n, s in record["processes"].items()}
    save = tmp_path / "run.json"
    run = spawn(home, *[("160" if a == "80" else a) for a in BENCH], "--save", str(save))
    time.sleep(2)
    grown = ucmctl(home, "up", str(edited), timeout=300)
    assert grown.returncode == 0, grown.stderr
    said = " ".join(grown.stderr.split())
    # decode-0 takes decode-1's port: decode-1 moves off it first
    assert "will start decode-2; restart decode-1, decode-0 (the rest stays running)" in said, said
    assert "decode-2: KV probe: prefill-0 -> decode-2: external prefix hits grew by " in said, said
    assert re.search(r"^decode-2 on me: added in [0-9.]+ s$", grown.stderr, re.MULTILINE), grown.stderr
    for name in ("decode-0", "decode-1"):
        assert re.search(rf"^{name} on me: restarted in [0-9.]+ s", grown.stderr, re.MULTILINE), grown.stderr
    again = ucmctl(home, "up", str(edited))
    assert again.returncode == 0 and "already up with this topology: nothing to change" in again.stderr
    middle = json.loads((home / "deployments" / "t-fault.json").read_text())
    assert middle["topology_path"] == str(edited.resolve())
    decodes = [p for p in middle["plan"]["processes"] if p["role"] == "decode"]
    assert [p["name"] for p in decodes] == ["decode-0", "decode-1", "decode-2"]
    assert all(p["argv"][p["argv"].index("--decode-step-ms") + 1] == "20" for p in decodes), decodes
    assert [p["ports"]["http"] - ports["decode"] for p in decodes] == [1, 2, 3], decodes
    kept = {n: s["pgid"] for n, s in middle["processes"].items() if not n.startswith("decode")}
    assert kept == {n: pid for n, pid in pids.items() if not n.startswith("decode")}  # left running
    back = ucmctl(home, "up", str(original), timeout=300)  # and back: decode-2 goes, the flag too
    assert back.returncode == 0, back.stderr
    assert "this topology will take out decode-2; restart decode-0, decode-1" in " ".join(back.stderr.split())
    out, err = run.communicate(timeout=300)
    (cell,) = json.loads(save.read_text())["cells"]
    assert cell["measure"]["failed"] == 0 and cell["measure"]["completed"] == 160, (out, err)
    decode2 = f"http://127.0.0.1:{ports['decode'] + 2}"
    with pytest.raises(OSError):
        urllib.request.urlopen(decode2 + "/health", timeout=2)
    after = json.loads((home / "deployments" / "t-fault.json").read_text())
    assert after["topology_path"] == str(original)
    assert after["plan"]["topology_digest"] == after["topology_digest"] == record["topology_digest"]
    assert [p for p in after["plan"]["processes"] if p["name"] != "proxy"] == [
        p for p in record["plan"]["processes"] if p["name"] != "proxy"]  # fmt: skip
    status = ucmctl(home, "status")
    assert "decode-2" not in status.stdout and status.stdout.count(", healthy") == 5, status.stdout


def test_the_proxy_killed_mid_phase_costs_what_it_carried_and_what_came_while_it_was_down(
    tmp_path: Path, pd: tuple[Path, dict[str, int]]
) -> None:
    home, ports = pd
    # at 8 s of the phase's 20: the window compared after it is 8 s, which a loaded machine's
    # supervisor (1 s backoff, then the proxy's start) needs more of than the 6 s it had once
    done, cell, f = bench_with_fault(home, tmp_path, "kill:proxy@8s")
    assert f["injected"] and f["was_running"] and f["process"] == "proxy", f
    assert done.returncode == 6 and f["failed"] == cell["measure"]["failed"] > 0, (done.stderr, f)
    # what it carried when it died (every instance's answers are its own), and what was sent
    # to it while it was down: nothing else
    # (its gauge is read just before the signal goes and cannot be after: a request sent in the
    # millisecond between is carried but not counted)
    carried = f["failed"] - f["failed_sent_after"]
    assert 0 < carried <= f["in_flight_on_it"] + 1 and f["streaming_on_it"] <= f["in_flight_on_it"], f
    assert f["cut_mid_stream"] is None and f["retried"] is None, f  # its counts died with it
    assert f["detected_after_s"] is not None and f["detected_after_s"] <= 10, f
    assert f["back_after_s"] is not None and f["back_after_s"] <= 15, f
    assert f["store_since_back"] is None, f  # it has no store
    assert f["after"]["requests"] > f["after"]["failed"], f  # served again once back
    assert "of them sent after it" in done.stdout and "back in " in done.stdout, done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80, done.stdout
    answer = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{ports['proxy']}/v1/completions",
        data=json.dumps({"model": "sim-model", "prompt": "back", "max_tokens": 3}).encode(),
        headers={"Content-Type": "application/json"})).read())  # fmt: skip
    assert answer["usage"]["completion_tokens"] == 3
    status = ucmctl(home, "status")
    row = next(line for line in status.stdout.splitlines() if line.startswith("proxy "))
    assert row.split()[-1] == "1", status.stdout  # restarted once, by its supervisor


def test_a_prefill_killed_mid_phase_costs_no_request(tmp_path: Path, pd: tuple[Path, dict[str, int]]) -> None:
    """Last in the module: prefill-0 has no restart policy and stays down."""
    home, ports = pd
    done, cell, f = bench_with_fault(home, tmp_path, "kill:prefill-0@6s")
    assert f["injected"] and f["was_running"] and f["process"] == "prefill-0", f
    # a prefill leg streams nothing to the client: one cut by the kill, or sent to it before the
    # proxy saw it gone, is sent to prefill-1
    assert f["failed"] == cell["measure"]["failed"] == 0 and cell["measure"]["completed"] == 80, f
    assert f["streaming_on_it"] == 0 and f["retried"] >= f["in_flight_on_it"], f
    assert f["detected_after_s"] is not None and f["detected_after_s"] <= 10, f
    assert f["back_after_s"] is None and "not back" in done.stdout, done.stdout  # restart: never
    (lost,) = cell["measure"]["lost"]
    assert lost["process"] == "prefill-0" and lost["how"] == "not running", lost  # no supervisor
    prefill1 = f"http://127.0.0.1:{ports['prefill'] + 1}"
    assert counter(prefill1, "vllm:request_success_total") >= 40  # it took every prefill since
