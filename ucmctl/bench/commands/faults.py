"""`ucmctl bench --fault` (parsed, armed for the first measure phase, reported when it came too
late) and the log tails of the processes a run lost."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ucmctl.bench.commands.common import err
from ucmctl.bench.commands.workload import foreign_option
from ucmctl.core.errors import UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.fault import FaultSpec
    from ucmctl.bench.results import Cell
    from ucmctl.bench.workloads import WorkloadSpec


def fault_spec(
    text: str | None, workload: WorkloadSpec, url: str | None, rates: list[float]
) -> FaultSpec | None:
    """--fault parsed and checked against the run before anything is sent (exit 2)."""
    if text is None:
        return None
    from ucmctl.bench.fault import parse_fault

    spec = parse_fault(text)
    if url is not None:
        raise UcmctlError.one(
            "--fault signals a process of a deployment; with --url there is none",
            key="--fault",
            fix="bench a deployment (-d NAME)",
        )
    if "--fault" not in workload.own_options:
        raise foreign_option(workload.kind, "--fault")
    num_prompts = workload.measure_requests()
    if num_prompts is not None and not math.isinf(rates[0]) and spec.at_s >= num_prompts / rates[0]:
        raise UcmctlError.one(
            f"'{text}': the measure phase sends its {num_prompts} requests within about "
            f"{num_prompts / rates[0]:.0f} s at {rates[0]:g}/s, before {spec.at_s:g} s",
            key="--fault",
            fix="pick an earlier time, or more --num-prompts",
        )
    return spec


@contextlib.contextmanager
def faulting(record: Any, spec: FaultSpec | None, target: Any) -> Iterator[None]:
    """The fault armed for the first measure phase, its node reached beforehand."""
    if spec is None:
        yield
        return
    from ucmctl.bench.fault import ALL, Fault
    from ucmctl.deploy.fault import process_named, signaller

    victim = process_named(record, spec.process)
    with signaller(record, victim, spec.action) as (fire, release):
        proxies = [url.rstrip("/") for url in record.plan.proxy_urls()]
        victim_url = victim.url.rstrip("/") if victim.is_server and victim.url else None
        victim_proxy = None
        if victim.role == "proxy":
            victim_url = ALL  # its gauges are read for every instance, and it has no store
            victim_proxy = str(victim.url).rstrip("/")
        target.fault = Fault(
            spec,
            fire,
            release=release,
            proxy_urls=proxies,
            victim_url=victim_url,
            victim_proxy=victim_proxy,
            watch=target.watch,
            metrics=target.metrics,
        )
        try:
            yield
        finally:  # a run that ended before its report: a hung process is let go all the same
            target.fault.let_go()


def fault_not_injected(cells: list[Cell]) -> None:
    """A fault whose time came after its phase ended: one line, exit 2 (its figures are saved)."""
    for cell in cells:
        f = cell.measure.fault if cell.measure else None
        if f and not f.get("injected"):
            raise UcmctlError.one(
                f"--fault {f['spec']} was not injected: {f.get('why')}",
                key="--fault",
                fix="pick an earlier time, a lower --request-rate or more --num-prompts",
            )


def save_log_tails(target: Any, save: Path | None) -> None:
    """The last log lines of each process lost, beside the saved result: RESULT.lost-PROCESS.log."""
    watch = getattr(target, "watch", None)
    if watch is None or save is None:
        return
    for loss in watch.losses:
        path = save.with_name(f"{save.stem}.lost-{loss.process}.log")
        path.write_text(f"# {loss.line()}\n{loss.log_tail}")
        err.print(f"its last log lines: {path}", soft_wrap=True)
