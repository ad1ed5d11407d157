"""Preflight of the processes a node runs in containers: the runtime, the devices, the images (a
derived one holding this ucmctl's wheel), whether this deployment's containers run already; and
of the OCI bundles a Slurm step runs in."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ucmctl.nodes.executor import Executor, NodeError
from ucmctl.plan.containers import LABEL_DEPLOYMENT
from ucmctl.plan.model import ContainerPlan, Process


def container_problems(
    where: str, ex: Executor, processes: list[Process], facts: dict[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """The runtime, the images (a derived one holding this ucmctl's wheel), the devices, and an
    image the user says has ucmctl inside importing it: one round trip, then one line each; and
    the processes whose containers run already. Each image's id goes into `facts` (as `image NAME`)."""
    plans = [p.container for p in processes if p.container is not None]
    runtimes = sorted({c.runtime for c in plans})
    images = list({c.image: c for c in plans if c.runtime in ("podman", "docker")}.values())
    done = ex.run(_facts_script(processes, plans, runtimes, images), timeout=60)
    running = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("running ")]
    have = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    if facts is not None:
        ids = {f"image {c.image}": have.get(f"image_id{i}", "").strip() for i, c in enumerate(images)}
        facts.update({k: v for k, v in ids.items() if v})
    problems = [
        f"{where}: {rt} is not installed (container.runtime {rt}): install it, or set another runtime"
        for rt in runtimes
        if have.get(rt) != "1"
    ]
    problems += [
        f"{where}: device {line.split(' ', 1)[1]} does not exist on the node: check its cards "
        "and container.devices"
        for line in done.stdout.splitlines()
        if line.startswith("nodevice ")
    ]
    if problems or running:
        return problems, running
    return image_problems(where, ex, plans), running


def _facts_script(
    processes: list[Process], plans: list[ContainerPlan], runtimes: Sequence[str], images: list[ContainerPlan]
) -> str:
    """Shell that prints `RUNTIME=1|0`, `nodevice PATH`, `running PROCESS` (its container runs,
    labelled with this deployment) and `image_idI=ID` of the node's images, by number."""
    script = [f'echo "{rt}=$(command -v {rt} >/dev/null 2>&1 && echo 1 || echo 0)"' for rt in runtimes]
    devices = sorted({d for c in plans for d in c.devices})
    script += [f'[ -e {shlex.quote(d)} ] || echo "nodevice {d}"' for d in devices]
    fmt = shlex.quote('{{.State.Status}} {{index .Config.Labels "' + LABEL_DEPLOYMENT + '"}}')
    for p in processes:
        c = p.container
        assert c is not None
        rt, mine = shlex.quote(c.runtime), shlex.quote(f"running {c.labels[LABEL_DEPLOYMENT]}")
        script.append(
            f'[ "$({rt} inspect --type container --format {fmt} {shlex.quote(c.name)} 2>/dev/null)" '
            f'= {mine} ] && echo "running {p.name}"'
        )
    for i, c in enumerate(images):  # by number: the name never reaches the shell but quoted
        rt, image = shlex.quote(c.runtime), shlex.quote(c.image)
        script.append(
            f"echo \"image_id{i}=$({rt} image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null)\""
        )
    return "\n".join(script) + "\nexit 0"


def image_problems(where: str, ex: Executor, plans: list[ContainerPlan]) -> list[str]:
    """Each image once: a derived one built and holding this ucmctl's wheel, a pull-never one on
    the node, and one the user gives importing ucmctl's connector and store."""
    from ucmctl.deploy.images import image_wheel
    from ucmctl.deploy.wheel import installed_wheel

    problems: list[str] = []
    wheel = installed_wheel()
    seen: set[str] = set()
    for c in plans:
        if c.image in seen:
            continue
        seen.add(c.image)
        held = image_wheel(ex, c)
        if c.derived and held is None:
            problems.append(
                f"{where}: image {c.image} (derived from {c.base_image}) is missing: "
                "run `ucmctl image build TOPOLOGY`"
            )
        elif c.derived and held != wheel.sha256:
            problems.append(
                f"{where}: image {c.image} holds another ucmctl than this one (wheel "
                f"{(held or 'unknown')[:12]}, this {wheel.sha256[:12]}): run `ucmctl image build TOPOLOGY`"
            )
        elif not c.derived and held is None and c.pull == "never":
            problems.append(
                f"{where}: image {c.image} is not on the node and container.pull is never: "
                f"load it there (`{c.runtime} load`), or set pull to missing"
            )
        elif not c.derived and held is not None:
            rt, image, py = (shlex.quote(x) for x in (c.runtime, c.image, c.python))
            probe = ex.run(
                f"{rt} run --rm --network none --pull never {image} {py} -c "
                "'import ucm_connector, ucm_store' 2>&1 | tail -n 1",
                timeout=120,
            )
            said = probe.stdout.strip()
            if said:
                problems.append(
                    f"{where}: image {c.image} has no ucmctl ({said}): set container.derived "
                    "true and run `ucmctl image build TOPOLOGY`, or install ucmctl in it"
                )
    return problems


def bundle_problems(where: str, ex: Executor, processes: list[Process]) -> list[str]:
    """Each OCI bundle the node's steps run: made by `ucmctl image build` from the topology's
    bundle as it is now, holding this ucmctl's wheel when derived."""
    from ucmctl.deploy.images import bundle_record, bundle_state, read_base_config
    from ucmctl.deploy.wheel import installed_wheel

    problems: list[str] = []
    seen: set[str] = set()
    for p in processes:
        c = p.container
        assert c is not None
        if c.image in seen:
            continue
        seen.add(c.image)
        try:
            want = bundle_record(read_base_config(ex, c), c, installed_wheel())
        except NodeError as exc:
            problems.append(f"{where}: {exc.reason}")
            continue
        have = bundle_state(ex, c)
        if have is None:
            problems.append(
                f"{where}: OCI bundle {c.image} (from {c.base_image}) is missing: "
                "run `ucmctl image build TOPOLOGY`"
            )
        elif have != want:
            changed = have.get("wheel") != want["wheel"]
            why = "another ucmctl" if changed else f"{c.base_image} as it was before"
            problems.append(f"{where}: OCI bundle {c.image} holds {why}: run `ucmctl image build TOPOLOGY`")
    return problems
