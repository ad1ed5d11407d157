"""Two proxies that share nothing in front of a local 1P2D of the simulator (`proxy: {replicas:
2}`): `up` starts both and proves the KV path through each; `status` and the routing lines name
each; a restart drains the instance at both; `bench` spreads its requests over both, and when
one is killed mid-phase (SIGKILL, no supervisor) every request sent after the kill is answered
by the other (the ones the dead one refused went on to it), and only what the dead one carried
failed, counted; `down` stops everything, the dead one's record included."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from tests.integration.deploy.test_local_lifecycle import deployed, topology, ucmctl
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

# 80 requests at 4/s, each 60 tokens at 25 ms a step (1.5 s): ~6 answers in flight, ~3 a proxy
BENCH = ["bench", "--prefix-ratio", "0", "--input-len", "64", "--output-len", "60",
         "--num-prompts", "80", "--request-rate", "4", "-q"]  # fmt: skip


def instances(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/instances", timeout=10) as r:
        return list(json.loads(r.read())["instances"])


def test_two_replicas_each_routed_probed_drained_and_one_killed_costs_only_what_it_carried(
    tmp_path: Path,
) -> None:
    home, workdir = tmp_path / "home", tmp_path / "work"
    decode = "servers_per_node: 2, flags: {decode-step-ms: 25}"
    topo = topology(tmp_path, "t-replicas", workdir, decode=decode)
    port = free_port(2)
    text = re.sub(r"^proxy: .*$", f"proxy: {{node: me, port: {port}, replicas: 2}}", topo.read_text(),
                  flags=re.MULTILINE)  # fmt: skip
    topo.write_text(text)
    doors = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    with deployed(home, topo, workdir):
        up = json.loads((home / "deployments" / "t-replicas.json").read_text())
        assert [p["name"] for p in up["plan"]["processes"] if p["role"] == "proxy"] == ["proxy-0", "proxy-1"]
        status = ucmctl(home, "status").stdout
        for name in ("proxy-0", "proxy-1"):
            assert re.search(rf"^{name} .*running", status, re.MULTILINE), status
            assert f"{name} routing: least-loaded" in status, status
        decodes = sorted(i["url"] for i in instances(doors[0]) if i["role"] == "decode")
        assert decodes == sorted(i["url"] for i in instances(doors[1]) if i["role"] == "decode")

        # a restart takes decode-0 out of both replicas' routing and back into both
        restart = ucmctl(home, "restart", "decode-0")
        assert restart.returncode == 0, restart.stderr
        for door in doors:
            (d0,) = [i for i in instances(door) if i["url"] == decodes[0]]
            assert d0["healthy"] and not d0["draining"], (door, d0)

        save = tmp_path / "run.json"
        done = ucmctl(home, *BENCH, "--fault", "kill:proxy-1@6s", "--save", str(save), timeout=300)
        (cell,) = json.loads(save.read_text())["cells"]
        f, phase = cell["measure"]["fault"], cell["measure"]
        assert f["injected"] and f["was_running"] and f["process"] == "proxy-1", f
        # what proxy-1 carried when it died failed; nothing sent after the kill did: those it
        # refused went on to proxy-0
        assert f["failed_sent_after"] == 0 and f["after"]["failed"] == 0, f
        assert 0 < f["failed"] == phase["failed"] <= f["in_flight_on_it"] + 1, f
        assert f["sent_on"] > 0 and phase["completed"] == 80 - f["failed"], f
        # proxy-0's own counts went on: nothing of its own was cut
        assert f["cut_mid_stream"] == 0 and f["failed"] > 0, f
        assert done.returncode == 6, done.stderr  # requests failed: the run says so
        assert "sent on to another proxy" in done.stdout, done.stdout
        assert max(len(line) for line in done.stdout.splitlines()) <= 80, done.stdout
        status = ucmctl(home, "status").stdout
        assert re.search(r"^proxy-1 .*(not running|exited)", status, re.MULTILINE), status

        # as users type it: the two URLs, one of them dead, every request answered
        again = ucmctl(home, "bench", "--url", ",".join(doors), "--prefix-ratio", "0", "--input-len", "64",
                       "--output-len", "8", "--num-prompts", "12", "-q")  # fmt: skip
        assert again.returncode == 0, again.stderr
        rows = [r.split() for r in again.stdout.splitlines() if r.startswith("64 ")]
        assert rows and all(r[2:4] == ["12", "0"] for r in rows if len(r) == 9), again.stdout
    down_record = home / "deployments" / "t-replicas.json"
    assert not down_record.exists() or json.loads(down_record.read_text())["status"] != "up"
