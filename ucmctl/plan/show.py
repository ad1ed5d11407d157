"""Human-readable and JSON views of a Plan, and the on-disk bundle of its files."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ucmctl.core import routing_names
from ucmctl.core.words import counted
from ucmctl.plan.model import Plan


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.model_dump(mode="json"), indent=2) + "\n"


def _print(console: Console, text: str, *, soft_wrap: bool = False) -> None:
    # emoji=False: rich would show a `:smile:` in a path or value as an emoji, not as written.
    console.print(text, emoji=False, soft_wrap=soft_wrap)


def print_plan(plan: Plan, console: Console) -> None:
    _print(
        console,
        f"[bold]deployment {escape(plan.deployment)}[/] mode {plan.mode}, engine {plan.engine}, "
        f"{counted(len(plan.processes), 'process')} on {counted(len(plan.nodes), 'node')} "
        f"(topology {plan.topology_digest[:12]})",
    )
    for node in plan.nodes.values():
        procs = plan.on_node(node.name)
        if not procs:
            continue
        _print(
            console,
            f"\n[bold cyan]node {escape(node.name)}[/] {escape(node.host)} ({node.transport}, "
            f"{node.platform}, {node.devices} devices) run dir {escape(node.run_dir)}",
        )
        for p in procs:
            ports = ", ".join(f"{k} {v}" for k, v in p.ports.items())
            extra = f" devices {','.join(map(str, p.devices))}" if p.devices else ""
            extra += f" dp_rank {p.dp_rank}" if p.dp_rank is not None else ""
            _print(console, f"  [bold]{escape(p.name)}[/] ({p.role}, stage {p.stage}) ports {ports}{extra}")
            for key, value in p.env.items():
                _print(console, f"    env {key}={escape(shlex.quote(value))}", soft_wrap=True)
            if p.container is not None and p.detached:  # the env above is what it sees inside
                _print(console, f"    container {escape(shlex.join(p.container.argv))}", soft_wrap=True)
            else:
                if p.container is not None:  # a Slurm job step in the image (pyxis, oci)
                    _print(console, f"    srun {escape(shlex.join(p.container.argv))}", soft_wrap=True)
                if p.container is not None and p.container.mounts:  # the OCI bundle's
                    _print(console, f"    mounts {escape(' '.join(p.container.mounts))}", soft_wrap=True)
                _print(console, f"    cmd {escape(shlex.join(p.argv))}", soft_wrap=True)
            if p.proxy is not None:
                what = routing_names.SUMMARIES[p.proxy.routing]
                _print(console, f"    routing {p.proxy.routing}: {escape(what)}", soft_wrap=True)
            if p.health:
                _print(console, f"    health {' then '.join(p.health)}")
            if p.restart is not None:
                _print(console, f"    restart {escape(p.restart.words())}")
            for f in p.files:
                _print(console, f"    file {escape(f.path)}")
            if p.depends_on:
                _print(console, f"    after {', '.join(p.depends_on)}")


def write_bundle(plan: Plan, out: Path) -> list[Path]:
    """Write every rendered file under out/<node>/<path on node>, plus out/plan.json."""
    written: list[Path] = []
    out.mkdir(parents=True, exist_ok=True)
    for p in plan.processes:
        for f in p.files:
            target = out / p.node / f.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f.content, encoding="utf-8")
            os.chmod(target, f.mode)
            written.append(target)
    summary = out / "plan.json"
    summary.write_text(plan_json(plan), encoding="utf-8")
    written.append(summary)
    return written
