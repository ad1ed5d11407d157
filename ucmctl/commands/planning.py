"""The commands that read a topology and print or write what follows from it, running nothing:
`validate`, `plan`, `render` (Kubernetes, Slurm, Prometheus) and `schema`."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from ucmctl.commands.shared import Format, TopologyArg, err, out, running_plan, topology_of
from ucmctl.core.errors import UcmctlError
from ucmctl.core.words import counted

if TYPE_CHECKING:
    from ucmctl.plan.model import Plan


def validate(topology: Path = TopologyArg) -> None:
    """Check a topology for the guides' pitfalls without starting anything."""
    from ucmctl.plan.build import build_plan
    from ucmctl.topology.load import load_topology

    plan = build_plan(load_topology(topology))
    servers = sum(1 for p in plan.processes if p.is_server)
    sized = f"{counted(servers, 'API server')} on {counted(len(plan.nodes), 'node')}"
    out.print(f"{escape(str(topology))}: ok ({plan.mode}, {sized})")


def plan(
    topology: Path = TopologyArg,
    format: Format = typer.Option(Format.text, "--format", "-f", help="text or json"),
    out_dir: Path | None = typer.Option(None, "--out", help="write the rendered files here"),
) -> None:
    """Print what `up` would run on every node; optionally write the rendered files."""
    from ucmctl.plan.build import build_plan
    from ucmctl.plan.show import plan_json, print_plan, write_bundle
    from ucmctl.topology.load import load_topology

    the_plan = build_plan(load_topology(topology))
    if format is Format.json:
        sys.stdout.write(plan_json(the_plan))
    else:
        print_plan(the_plan, out)
    if out_dir is not None:
        files = write_bundle(the_plan, out_dir)
        err.print(f"wrote {len(files)} files under {escape(str(out_dir))}")


def render(
    topology: Path = TopologyArg,
    k8s: Path | None = typer.Option(
        None, "--k8s", help="write Kubernetes manifests into this folder, one per object"
    ),
    slurm: Path | None = typer.Option(
        None, "--slurm", help="write a self-contained sbatch script into this folder (needs a Slurm cluster)"
    ),
    namespace: str = typer.Option("default", "--namespace", help="--k8s: namespace of every object"),
    image: list[str] | None = typer.Option(
        None,
        "--image",
        help="--k8s: container image, or PLATFORM=IMAGE for one platform's pods (repeatable; "
        "default: ucmctl:<version>)",
    ),
    storage_class: str | None = typer.Option(
        None, "--storage-class", help="--k8s: StorageClass of the store's claim"
    ),
    store_size: str = typer.Option(
        "1Ti", "--store-size", help="--k8s: size the store's ReadWriteMany claim asks"
    ),
    prometheus: Path | None = typer.Option(
        None,
        "--prometheus",
        help="write a Prometheus scrape config (file-discovered targets), alert rules and Grafana "
        "dashboards into this folder; TOPOLOGY may also name a running deployment",
    ),
    scrape_interval: float = typer.Option(5.0, "--scrape-interval", min=0.1, help="--prometheus: seconds"),
) -> None:
    """Write the plan for a scheduler, never run by ucmctl: Kubernetes manifests (--k8s:
    LeaderWorkerSets, Deployments, Services, a ConfigMap, the store's claim) or
    an sbatch script (--slurm: the deployment as one batch job; `ucmctl down` stops it)."""
    from ucmctl.plan.build import build_plan

    if sum(x is not None for x in (k8s, slurm, prometheus)) != 1:
        raise UcmctlError.one("ucmctl render: pass exactly one of --k8s DIR, --slurm DIR or --prometheus DIR")
    if prometheus is not None:
        _render_prometheus(topology, prometheus, scrape_interval)
        return
    topo = topology_of(topology)
    the_plan = build_plan(topo)
    if slurm is not None:
        _render_slurm(topology, the_plan, slurm)
        return
    assert k8s is not None
    _render_k8s(the_plan, k8s, namespace, image, storage_class, store_size)


def _render_prometheus(topology: Path, prometheus: Path, scrape_interval: float) -> None:
    """`render --prometheus`: the scrape config, alert rules and dashboards of a topology's plan
    or of a running deployment."""
    from ucmctl.monitor.prometheus import render as render_prometheus
    from ucmctl.monitor.prometheus import write
    from ucmctl.plan.build import build_plan

    plan_of_it = running_plan(topology) or build_plan(topology_of(topology))
    files = write(render_prometheus(plan_of_it, scrape_interval), prometheus)
    for path in files:
        out.print(escape(str(path)))
    config = shlex.quote(str(prometheus / "prometheus.yml"))
    out.print(
        f"wrote {len(files)} files under {escape(str(prometheus))}: run `prometheus "
        f"--config.file={escape(config)}`; import the dashboards/ into Grafana"
    )


def _render_slurm(topology: Path, the_plan: Plan, slurm: Path) -> None:
    """`render --slurm`: the plan as one sbatch script."""
    from ucmctl.launch.sbatch import log_pattern, write_script

    if the_plan.cluster.kind != "slurm":
        raise UcmctlError.one(
            "--slurm needs a Slurm cluster in the topology",
            file=str(topology),
            fix="add `cluster: {kind: slurm, partition: NAME}`",
        )
    path = write_script(the_plan, slurm)
    out.print(escape(str(path)))
    out.print(
        f"wrote the sbatch script of {the_plan.deployment}: submit it with `sbatch "
        f"{escape(shlex.quote(str(path)))}` (its output goes to {escape(log_pattern(the_plan))} "
        f"in the folder sbatch runs from); stop it with `ucmctl down {escape(str(topology))}` "
        "or `scancel`"
    )


def _render_k8s(
    the_plan: Plan,
    k8s: Path,
    namespace: str,
    image: list[str] | None,
    storage_class: str | None,
    store_size: str,
) -> None:
    """`render --k8s`: the plan as Kubernetes manifests, one file per object."""
    from ucmctl.k8s.manifests import write_manifests
    from ucmctl.k8s.options import Options, parse_images
    from ucmctl.k8s.render import render_manifests, restart_notes

    default_image, platform_images = parse_images(image or [])
    options = Options(
        namespace=namespace,
        image=default_image,
        platform_images=platform_images,
        storage_class=storage_class,
        store_size=store_size,
    )
    manifests = render_manifests(the_plan, options)
    for written in write_manifests(manifests, the_plan, k8s):
        out.print(escape(str(written)))
    out.print(
        f"wrote {len(manifests)} manifests under {escape(str(k8s))}: apply them with "
        f"`kubectl apply -f {escape(str(k8s))}` (needs the LeaderWorkerSet controller)"
    )
    for note in restart_notes(the_plan):
        err.print(f"note: {escape(note)}", soft_wrap=True)


def schema(
    format: Format = typer.Option(Format.text, "--format", "-f", help="text (Markdown) or json"),
) -> None:
    """Print the topology file reference (Markdown) or its JSON Schema."""
    from ucmctl.topology.schema_doc import json_schema, markdown

    sys.stdout.write(json_schema() if format is Format.json else markdown())
