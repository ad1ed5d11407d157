"""`render --prometheus`: the targets of every shipped topology, configs and rules that promtool
accepts, dashboards whose every query is the deployment's, and a folder never overwritten."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.monitor.dashboards import PANELS, dashboard
from ucmctl.monitor.prometheus import MANIFEST, render, targets, write
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology

TOPOLOGIES = sorted((Path(__file__).resolve().parents[3] / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_every_metrics_endpoint_of_every_shipped_topology_is_a_labelled_target(path: Path) -> None:
    plan = build_plan(load_topology(path))
    found = targets(plan)
    servers = [p for p in plan.processes if p.role in ("prefill", "decode", "mixed", "proxy", "mooncake")]
    assert len(found) == len(servers) > 0
    for entry, p in zip(found, servers, strict=True):
        assert entry["labels"] == {
            "deployment": plan.deployment,
            "role": p.role,
            "process": p.name,
            "node": p.node,
        }
        (target,) = entry["targets"]  # type: ignore[misc]
        assert p.url is not None and p.url.endswith(target)
    master = [p for p in plan.processes if p.role == "mooncake"]
    if master:  # its metrics port, not its RPC port
        (entry,) = [e for e in found if e["labels"]["role"] == "mooncake"]  # type: ignore[index]
        assert entry["targets"] == [f"{master[0].url.split('//')[1]}"]  # type: ignore[union-attr]
        assert str(master[0].ports["metrics"]) in entry["targets"][0]  # type: ignore[index]


@pytest.mark.parametrize("path", TOPOLOGIES[:4], ids=lambda p: p.stem)
def test_promtool_accepts_the_config_and_the_rules(path: Path, tmp_path: Path) -> None:
    assert shutil.which("promtool"), "scripts/setup.sh --tests installs prometheus (promtool is in it)"
    plan = build_plan(load_topology(path))
    write(render(plan, 2.0), tmp_path)
    for check in (["config", "prometheus.yml"], ["rules", f"ucmctl-{plan.deployment}-alerts.yml"]):
        done = subprocess.run(["promtool", "check", *check], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "targets" / f"{plan.deployment}.json").read_text()) == targets(plan)


def test_dashboards_query_only_their_deployment() -> None:
    assert {p.dashboard for p in PANELS} == {"serving", "kv-cache"}
    for which in ("serving", "kv-cache"):
        model = dashboard("d1", which)
        panels = model["panels"]
        assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
        for p in panels:
            assert p["targets"] and all('deployment="$deployment"' in t["expr"] for t in p["targets"]), p
        assert model["templating"]["list"][1]["current"]["value"] == "d1"


def test_a_folder_with_files_of_its_own_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    plan = build_plan(load_topology(TOPOLOGIES[0]))
    files = render(plan)
    write(files, tmp_path / "p")
    again = write(files, tmp_path / "p")  # its own files: written again
    assert len(again) == len(files) and (tmp_path / "p" / MANIFEST).is_file()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "prometheus.yml").write_text("mine\n")
    with pytest.raises(UcmctlError, match=r"the folder holds files ucmctl did not write \(prometheus.yml\)"):
        write(files, theirs)
    assert sorted(p.name for p in theirs.iterdir()) == ["prometheus.yml"]
    assert (theirs / "prometheus.yml").read_text() == "mine\n"


def test_a_plan_without_any_metrics_endpoint_is_refused() -> None:
    plan = build_plan(load_topology(TOPOLOGIES[0]))
    bare = plan.model_copy(update={"processes": []})
    with pytest.raises(UcmctlError, match="has no /metrics endpoint to scrape"):
        render(bare)


def test_render_prometheus_as_typed_and_its_bad_input(tmp_path: Path) -> None:
    import os
    import sys

    env = {**os.environ, "UCMCTL_HOME": str(tmp_path / "home")}

    def ucmctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ucmctl", *args], capture_output=True, text=True, env=env
        )

    done = ucmctl("render", str(TOPOLOGIES[0]), "--prometheus", str(tmp_path / "p"))
    assert done.returncode == 0 and "prometheus --config.file=" in " ".join(done.stdout.split()), done.stderr
    for args, said in (
        (
            [str(TOPOLOGIES[0]), "--prometheus", str(tmp_path / "p"), "--k8s", str(tmp_path / "k")],
            "exactly one",
        ),
        (["no-such-deployment", "--prometheus", str(tmp_path / "q")], "file not found"),
        ([str(TOPOLOGIES[0]), "--prometheus", str(TOPOLOGIES[0])], "is a file, not a folder"),
    ):
        bad = ucmctl("render", *args)
        assert bad.returncode == 2 and said in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert not (tmp_path / "q").exists()
