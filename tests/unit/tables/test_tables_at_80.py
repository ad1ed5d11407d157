"""Every table at 80 columns off a terminal (a CI log): names, ports and figures whole, never
`…`, and `-` for a figure nothing measured. Exact text for representative inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.markup import escape

from tests.unit.bench.helpers import cell, invoke, write_result
from tests.unit.tables.render import at_width
from ucmctl.bench import report
from ucmctl.bench.client import RequestResult
from ucmctl.bench.metrics import summarize
from ucmctl.core.tables import FIGURE, NAME, PAIR, fitted, plain, table, widths
from ucmctl.deploy.health import HEALTHY, NOT_ASKED, UNKNOWN, Health
from ucmctl.deploy.inspect import Look, render_status
from ucmctl.deploy.state import ProcessState, Record
from ucmctl.nodes.run_state import Kind, RunState
from ucmctl.plan.build import build_plan
from ucmctl.plan.show import print_plan
from ucmctl.topology.load import load_topology

TOPOLOGIES = sorted((Path(__file__).resolve().parents[3] / "topologies").glob("*.yaml"))


def whole(text: str, width: int = 80) -> None:
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width, text


def phase(
    input_len: int,
    output_len: int,
    ttft: float,
    tpot: float,
    e2el: float,
    failed: int = 0,
    hit: tuple[float, float] = (0.0, 0.0),
    n: int = 8,
) -> dict[str, Any]:
    ok = [
        RequestResult(
            i,
            input_len,
            ok=True,
            output_tokens=output_len,
            ttft=ttft + i * 0.001,
            itl=[tpot] * (output_len - 1),
            latency=e2el + i * 0.001,
        )
        for i in range(n - failed)
    ]
    error = "HTTP 400: token id out of vocabulary (0..4867)"
    bad = [RequestResult(n - failed + i, input_len, error=error) for i in range(failed)]
    p = summarize(ok + bad, 2.0)
    p.update({"input_len": input_len, "output_len": output_len, "num_prompts": n,
              "hit_rate": {"total": {"local_hit_rate": hit[0], "external_hit_rate": hit[1]}}})  # fmt: skip
    return p


def run_cells() -> list[dict[str, Any]]:
    return [
        {"input_len": 4096, "repeat": 0, "prefix_ratio": 0.8, "preseed": phase(3276, 1, 0.25, 0, 0.25),
         "measure": phase(4096, 1000, 0.161, 0.0006, 0.758, hit=(0.797, 0.0))},
        {"input_len": 131072, "repeat": 0, "prefix_ratio": 0.8, "preseed": phase(104857, 1, 12.5, 0, 12.5),
         "measure": phase(131072, 1000, 0, 0, 0, failed=8)},
    ]  # fmt: skip


def suite_cells() -> list[dict[str, Any]]:
    out = []
    for scenario, (ttft, e2el) in {"recompute": (2.1, 9.9), "hbm": (0.4, 8.1), "ucm": (0.6, 8.3)}.items():
        hit = (0.8 if scenario == "hbm" else 0.0, 0.8 if scenario == "ucm" else 0.0)
        for n in (4096, 32768):
            m = phase(n, 1000, ttft * n / 4096, 0.0081, e2el * n / 4096, hit=hit)
            out.append({"scenario": scenario, "input_len": n, "repeat": 0, "prefix_ratio": 0.8,
                        "preseed": None, "measure": m})  # fmt: skip
    return out


BENCH_AT_80 = """\
latency, ms (mean / p99)
input   phase             TTFT         TPOT          ITL           E2EL
───────────────────────────────────────────────────────────────────────
4096    preseed      254 / 257        - / -        - / -      254 / 257
4096    measure      164 / 168  0.60 / 0.60  0.60 / 0.60      762 / 765
131072  preseed  12504 / 12507        - / -        - / -  12504 / 12507
131072  measure          - / -        - / -        - / -          - / -

throughput and hit rate (measured local, external; asked)
input   phase    ok  failed  req/s   tok/s  hit L  hit E  asked
───────────────────────────────────────────────────────────────
4096    preseed   8       0   4.00     4.0   0.0%   0.0%      -
4096    measure   8       0   4.00  4000.0  79.7%   0.0%  80.0%
131072  preseed   8       0   4.00     4.0   0.0%   0.0%      -
131072  measure   0       8      -       -   0.0%   0.0%  80.0%

measure 131072: 8 x HTTP 400: token id out of vocabulary (0..4867)
"""


def test_bench_tables_at_80_and_unmeasured_is_a_dash() -> None:
    text = at_width(lambda c: report.print_cells(run_cells(), c))
    assert text == BENCH_AT_80
    whole(text)
    assert "0.00 / 0.00" not in text


SUITE_AT_80 = """\
latency, ms (mean / p99)
scenario   input  phase            TTFT          TPOT          ITL          E2EL
────────────────────────────────────────────────────────────────────────────────
recompute  4096   measure   2104 / 2107   7.81 / 7.81  8.10 / 8.10   9904 / 9907
recompute  32768  measure       16804 /       62.46 /  8.10 / 8.10       79204 /
                                  16807         62.46                      79207
hbm        4096   measure     404 / 407   7.71 / 7.71  8.10 / 8.10   8104 / 8107
hbm        32768  measure   3204 / 3207       61.66 /  8.10 / 8.10       64804 /
                                                61.66                      64807
ucm        4096   measure     604 / 607   7.71 / 7.71  8.10 / 8.10   8304 / 8307
ucm        32768  measure   4804 / 4807       61.66 /  8.10 / 8.10       66404 /
                                                61.66                      66407

throughput and hit rate (measured local, external; asked)
scenario   input  phase    ok  failed  req/s   tok/s  hit L  hit E  asked
─────────────────────────────────────────────────────────────────────────
recompute  4096   measure   8       0   4.00  4000.0   0.0%   0.0%  80.0%
recompute  32768  measure   8       0   4.00  4000.0   0.0%   0.0%  80.0%
hbm        4096   measure   8       0   4.00  4000.0  80.0%   0.0%  80.0%
hbm        32768  measure   8       0   4.00  4000.0  80.0%   0.0%  80.0%
ucm        4096   measure   8       0   4.00  4000.0   0.0%  80.0%  80.0%
ucm        32768  measure   8       0   4.00  4000.0   0.0%  80.0%  80.0%

"""


def test_suite_tables_at_80() -> None:
    text = at_width(lambda c: report.print_cells(suite_cells(), c))
    assert text == SUITE_AT_80
    whole(text)


def test_repeats_and_long_scenario_names_split_rather_than_cut() -> None:
    cells = suite_cells()
    for c in cells:
        c["scenario"] = f"{c['scenario']}-with-a-very-long-scenario-name"
        c["repeat"] = 11
    text = at_width(lambda c: report.print_cells(cells, c))
    whole(text)
    # parts that each repeat the leading columns: latency in two, throughput in three
    assert "(mean / p99) (2/2)" in text and "asked) (3/3)" in text
    assert text.count("recompute-with-a-very-long-scenario-name") == 2 * 5
    for figure in ("16804", "79207", "4000.0", "80.0%"):
        assert figure in text


def test_a_wide_terminal_shows_one_line_per_row() -> None:
    text = at_width(lambda c: report.print_cells(suite_cells(), c), width=200)
    assert "16804 / 16807" in text and "(1/2)" not in text


STATUS_AT_80 = """\
deployment 2p2d-centralized (up)
process    node  role     ports      state                      uptime  restarts
────────────────────────────────────────────────────────────────────────────────
prefill-0  a     prefill  http:7800  running, healthy              62m         0
prefill-1  a     prefill  http:7801  running, unhealthy            62m         1
                                     (http://192.168.10.1:7800
                                     /health: connection
                                     refused)
decode-0   b     decode   http:7802  node unreachable                -         0
decode-1   b     decode   http:7803  running, healthy              62m         1
proxy      a     proxy    http:7805  running, healthy              62m         0
"""


def status_record(topology: Path) -> Record:
    plan = build_plan(load_topology(topology))
    procs = {p.name: ProcessState(name=p.name, node=p.node, started_at=1000.0, restarts=i % 2)
             for i, p in enumerate(plan.processes)}  # fmt: skip
    return Record(deployment=plan.deployment, topology_path=str(topology),
                  topology_digest=plan.topology_digest, plan=plan, processes=procs, status="up")  # fmt: skip


def draw_status(record: Record, looks: list[Look]) -> Any:
    def draw(console: Console) -> None:
        for t in render_status(record, looks, 1000.0 + 3725, console.width):
            console.print(t)

    return draw


def test_status_at_80() -> None:
    record = status_record(next(t for t in TOPOLOGIES if t.name == "2p2d-centralized.yaml"))
    looks = [Look(RunState.up(), HEALTHY)] * len(record.plan.processes)
    looks[1] = Look(RunState.up(), Health.of("http://192.168.10.1:7800/health: connection refused"))
    looks[2] = Look(RunState(Kind.unreachable), UNKNOWN)
    assert at_width(draw_status(record, looks)) == STATUS_AT_80


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=[t.stem for t in TOPOLOGIES])
def test_status_and_plan_of_every_topology_keep_names_and_ports_whole(topology: Path) -> None:
    record = status_record(topology)
    looks = [Look(RunState.up(), HEALTHY)] * len(record.plan.processes)
    text = at_width(draw_status(record, looks))
    whole(text)
    words = set(text.split())
    for p in record.plan.processes:
        assert p.name in words and p.node in words
        for name, port in p.ports.items():
            assert f"{name}:{port}" in words, (p.name, name, port)
    assert "…" not in at_width(lambda c: print_plan(record.plan, c))  # commands stay one line to copy


def test_compare_summary_at_80(tmp_path: Path) -> None:
    base = write_result(tmp_path / "base.json", [cell(1024, 100.0), cell(8192, 900.0, scenario="ucm")])
    new = write_result(tmp_path / "new.json", [cell(1024, 120.0), cell(8192, 905.0, scenario="ucm")])
    code, text = invoke("compare", str(base), str(new))
    assert code == 5
    assert "…" not in text and "| run/1024 | ttft_mean | 100.00 | 120.00 | +20.0% |" in text


def test_widths_keep_every_word_or_say_none() -> None:
    cols = [("name", NAME), ("n", FIGURE), ("mean / p99", PAIR)]
    rows = [["a-long-process-name", "123456", "12345 / 67890"]]
    assert widths(cols, rows, 200) == [19, 6, 13]
    assert widths(cols, rows, 19 + 6 + 7 + 4) == [19, 6, 7]  # the pair wraps after its slash
    assert widths(cols, rows, 19 + 6 + 6 + 4) is None
    tables = fitted(30, "t", cols[:1], cols[1:], rows)
    assert len(tables) == 2  # split, never cut


def test_plain_text_is_the_table_rich_draws_where_every_cell_fits() -> None:
    columns = [("run", FIGURE), ("name", NAME), ("TTFT mean / p99", PAIR), ("tok/s", FIGURE)]
    rows = [["#1", "nightly [main]", "4.2 / 4.8", "3314.7"], ["#1000", "pr-7", "123456.7 / 9.0", "1.0"]]
    console = Console(width=80, record=True, highlight=False)
    console.print(table("trend of ucm/1024", columns, [[escape(c) for c in r] for r in rows], width=80))
    drawn = [line.rstrip() for line in console.export_text().splitlines()]
    text = plain("trend of ucm/1024", columns, rows, 80)
    assert text is not None and [line.rstrip() for line in text.splitlines()] == drawn
    assert plain(None, columns, rows, 40) is None  # does not fit: rich's wrapping tables draw it
    assert plain(None, columns, [["a\nb", "x", "y", "z"]], 80) is None


def test_the_lines_under_the_tables_wrap_between_words_at_80() -> None:
    """A PD trace cell's hit rates by role, its send lag and its KV handover: lines of 85-95
    characters that a terminal would break mid-number, wrapped between words instead."""
    c = cell(4096, 812.0, scenario="ucm-with-a-long-scenario-name")
    c.update(workload="trace", label="trace mooncake-long-conversations.jsonl")
    m = c["measure"]
    m["hit_rate"] = {"total": {"hit_rate": 0.5}, "by_role": {
        "prefill": {"local_hit_rate": 0.123456, "external_hit_rate": 0.654321},
        "decode": {"local_hit_rate": 0.0, "external_hit_rate": 0.937500}}}  # fmt: skip
    m["send_lag_ms"] = {"p50": 12.345678, "p99": 123.456789, "max": 1234.567891}
    m["kv_handover"] = {"count": 1234, "mean_ms": 21.234, "p50_ms": 18.5, "p99_ms": 64.25}
    console = Console(width=80, record=True, highlight=False)
    report.print_cells([c], console)
    text = console.export_text()
    whole(text)
    joined = " ".join(text.split())
    for words in (
        "prefill local 12.3%, external 65.4%; decode local 0.0%, external 93.8%",
        "by 12.35 ms p50, 123.46 ms p99, 1234.57 ms max",
        "KV handover (proxy, 1234 streamed): mean 21.23, p50 18.50, p99 64.25 ms; TTFT mean 812 ms",
    ):
        assert words in joined, joined  # fmt: skip


def test_the_kv_probe_line_of_status_wraps_between_words_at_80() -> None:
    from ucmctl.deploy.kv_probe import ProbeResult

    record = status_record(next(t for t in TOPOLOGIES if t.name == "2p2d-centralized.yaml"))
    detail = ("decode-0's external prefix cache hits grew by 160 tokens (10 blocks of 16) after prefill-0 "
              "stored a 160-token prompt through the proxy at http://192.168.10.1:8000")  # fmt: skip
    record.kv_probe = ProbeResult(mode="centralized", ok=True, detail=detail, at=1000.0)
    text = at_width(draw_status(record, [Look(RunState.up(), HEALTHY)] * len(record.plan.processes)))
    whole(text)
    assert detail in " ".join(text.split()), text


def test_status_counts_restarts_whatever_words_the_state_has() -> None:
    """The restarts column adds the policy's count to those ucmctl made, from the look's count:
    a process whose supervisor gave up, or one waiting to be started again, has restarted too."""
    record = status_record(next(t for t in TOPOLOGIES if t.name == "2p2d-centralized.yaml"))
    looks = [Look(RunState.up(), HEALTHY)] * len(record.plan.processes)
    looks[0] = Look(RunState.gave_up(137, 3), NOT_ASKED)
    looks[1] = Look(RunState.restarting(137, 1, 3), NOT_ASKED)
    looks[2] = Look(RunState.up(2, last_exit=1), HEALTHY)
    text = at_width(draw_status(record, looks))
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.split()}
    for p, now in zip(record.plan.processes, looks, strict=True):
        by_ucmctl = record.processes[p.name].restarts  # `ucmctl restart`s, kept in the record
        assert rows[p.name][-1] == str(by_ucmctl + now.restarts), (p.name, text)
    assert [rows[p.name][-2] for p in record.plan.processes[:3]] == ["-", "-", "-"]
    assert rows["decode-1"][-2] == "62m"  # not restarted by its policy: up since `up`
