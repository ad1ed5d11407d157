"""Preflight of a containerized node, against a node that answers as one without the runtime and
as one whose derived image holds another ucmctl (the real runtime's answers are tested in
tests/integration/deploy/test_containers_local.py)."""

from __future__ import annotations

import json

import pytest

from ucmctl.deploy.container_preflight import container_problems, image_problems
from ucmctl.deploy.images import read_base_config
from ucmctl.deploy.wheel import installed_wheel
from ucmctl.nodes.executor import NodeError, Result
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import ContainerPlan, NodePlan
from ucmctl.topology.load import parse_topology

TOPOLOGY = """
name: pf
mode: centralized
engine: sim
model: {path: sim-model}
nodes:
  a: {host: 10.0.0.1, platform: cpu, devices: 0, container: {runtime: docker, image: vllm/vllm-openai}}
prefill: {nodes: [a], port: 8000}
decode: {nodes: [a], port: 8001}
proxy: {node: a, port: 8002}
"""


class Node:
    """Answers each command with the first canned reply whose key it contains."""

    def __init__(self, node: NodePlan, replies: dict[str, str]) -> None:
        self.node, self.replies, self.asked = node, replies, []

    def run(self, command: str, *, timeout: float = 60) -> Result:
        self.asked.append(command)
        for key, out in self.replies.items():
            if key in command:
                return Result(command, 0, out, "")
        return Result(command, 1, "", "")


def test_a_node_without_the_runtime_is_one_line_and_nothing_more_is_asked() -> None:
    plan = build_plan(parse_topology(TOPOLOGY))
    ex = Node(plan.nodes["a"], {"command -v docker": "docker=0\n"})
    problems, running = container_problems("node a (10.0.0.1)", ex, plan.on_node("a"))  # type: ignore[arg-type]
    assert problems == ["node a (10.0.0.1): docker is not installed (container.runtime docker): "
                        "install it, or set another runtime"]  # fmt: skip
    assert running == [] and len(ex.asked) == 1


def test_a_derived_image_with_another_wheel_is_stale() -> None:
    plan = build_plan(parse_topology(TOPOLOGY))
    ex = Node(plan.nodes["a"], {"command -v docker": "docker=1\n", "image inspect": "0123456789abcdef\n"})
    problems, _ = container_problems("node a (10.0.0.1)", ex, plan.on_node("a"))  # type: ignore[arg-type]
    this = installed_wheel().sha256[:12]
    assert problems == [
        "node a (10.0.0.1): image localhost/ucmctl/vllm/vllm-openai:latest holds another ucmctl than this "
        "one "
        f"(wheel 0123456789ab, this {this}): run `ucmctl image build TOPOLOGY`"
    ]


class CutShort:
    """A Slurm node whose step output reaches this machine cut at a line's end `cuts` times."""

    def __init__(self, node: NodePlan, config: str, cuts: int) -> None:
        self.node, self.config, self.cuts, self.asked = node, config, cuts, 0

    def run(self, command: str, *, timeout: float = 60) -> Result:
        self.asked += 1
        whole = f"{len(self.config.encode())}\n{self.config}"
        if self.asked <= self.cuts:
            whole = whole[: whole.index('"root"')]
        return Result(command, 0, whole, "")


def test_a_base_config_read_cut_short_is_read_again_never_taken_as_broken() -> None:
    plan = build_plan(parse_topology(TOPOLOGY))
    c = ContainerPlan.model_construct(base_image="/b/base")
    config = json.dumps({"process": {"env": ["A=1"]}, "root": {"path": "rootfs"}}, indent=1)
    once = CutShort(plan.nodes["a"], config, cuts=1)
    assert read_base_config(once, c) == config and once.asked == 2  # type: ignore[arg-type]
    always = CutShort(plan.nodes["a"], config, cuts=9)
    with pytest.raises(NodeError, match=r"/b/base/config.json came back cut short three times"):
        read_base_config(always, c)  # type: ignore[arg-type]
    assert always.asked == 3


def test_the_images_are_asked_once_each_and_a_pull_never_image_must_be_there() -> None:
    given = "image: vllm/vllm-openai, derived: false, pull: never}"
    text = TOPOLOGY.replace("image: vllm/vllm-openai}", given)
    plan = build_plan(parse_topology(text))
    plans = [p.container for p in plan.on_node("a") if p.container is not None]
    assert len(plans) == 3 and len({c.image for c in plans}) == 1  # prefill, decode, proxy: one image
    ex = Node(plan.nodes["a"], {})  # `image inspect` fails: the image is not on the node
    assert image_problems("node a (10.0.0.1)", ex, plans) == [  # type: ignore[arg-type]
        "node a (10.0.0.1): image vllm/vllm-openai is not on the node and container.pull is never: "
        "load it there (`docker load`), or set pull to missing"
    ]
    assert len(ex.asked) == 1
