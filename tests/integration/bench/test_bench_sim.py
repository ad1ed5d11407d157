"""`ucmctl bench` against real simulator processes: phases and exact lengths (their cells read as
typed and back unchanged), hit-rate deltas
(local, and external through the native store after --reset-hbm), failures, compare's exit
codes on a real slowdown, and a suite end to end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.integration.sim.test_sim_server import kv_flag, ucm_config
from tests.support.openai_checks import metric
from tests.support.processes import sim_server
from tests.unit.bench.helpers import invoke
from ucmctl.bench.hitrate import Instance
from ucmctl.bench.open_model import plain
from ucmctl.bench.results import Cell, cells_of
from ucmctl.bench.runner import BenchConfig, Target
from ucmctl.bench.workloads import PrefixSpec
from ucmctl.bench.workloads.prefix.runner import run_bench
from ucmctl.core.errors import ExitStatus

BLOCK = 16


def _bench(url: str, output_len: int = 12, **kw: object) -> list[Cell]:
    cfg = BenchConfig(concurrency=4, output_len=output_len)
    spec = PrefixSpec.model_validate({"input_lens": [1000], "num_prompts": 8, **kw})
    return asyncio.run(run_bench(cfg, spec, Target(url, [Instance("sim", "mixed", url)])))


def test_phases_exact_lengths_and_local_hit_rate(tmp_path: Path) -> None:
    with sim_server(tmp_path, "--block-size", str(BLOCK), "--decode-step-ms", "2") as sim:
        (cell,) = _bench(sim.url, input_lens=[1000], prefix_ratio=0.8)
        import urllib.request

        text = urllib.request.urlopen(f"{sim.url}/metrics").read().decode()
    pre, mea = cell.preseed, cell.measure
    assert pre is not None and mea is not None
    assert [r.usage_prompt_tokens for r in pre.requests()] == [800] * 8
    assert [r.output_tokens for r in pre.requests()] == [1] * 8
    assert [r.usage_prompt_tokens for r in mea.requests()] == [1000] * 8
    assert [r.output_tokens for r in mea.requests()] == [12] * 8  # --ignore-eos: exactly the length
    assert all(len(r.itl) == 11 for r in mea.requests())
    assert (pre.completed, pre.failed, mea.completed, mea.failed) == (8, 0, 8, 0)
    assert mea.total_input_tokens == 8000 and mea.total_output_tokens == 96
    # preseed: nothing cached yet; measure: the 800-token prefix (50 whole blocks) of each prompt
    assert pre.totals()["local_hit_rate"] == 0.0
    assert mea.totals()["local_queries"] == 8000
    assert mea.totals()["local_hit_rate"] == pytest.approx(0.8)
    assert mea.value("usage_cached_tokens") == 6400  # the server's own account agrees
    # the deltas cover the phases exactly: the server saw nothing else
    assert metric(text, "vllm:prefix_cache_queries_total") == 8 * 800 + 8 * 1000
    assert 0 < mea.mean_ttft_ms < mea.mean_e2el_ms  # type: ignore[operator]
    # one 2 ms decode step per token: the 11 after the first take 22 ms at least (a client that
    # stalls reads several at once, so its TPOT may look faster than a step: E2EL cannot), and
    # the client adds little
    assert mea.mean_e2el_ms >= 11 * 2.0  # type: ignore[operator]
    assert mea.mean_tpot_ms < 10.0  # type: ignore[operator]
    # the runner's typed cell saved and read back is the same JSON: keys in order, ints as ints
    saved = json.dumps(plain([cell]), default=str)
    assert list(json.loads(saved)[0]) == [
        "input_len", "repeat", "stream", "prefix_ratio", "preseed", "measure", "prompts_digest",
    ]  # fmt: skip
    (typed,) = cells_of(json.loads(saved))
    assert typed.measure is not None and typed.measure.total_input_tokens == 8000
    assert json.dumps(plain([typed]), default=str) == saved


def test_reset_hbm_leaves_only_the_store_to_hit(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    flags = ["--block-size", str(BLOCK), *kv_flag(ucm_config(tmp_path, store)), "--kv-bytes-per-token", "256"]
    with sim_server(tmp_path, *flags) as sim:
        (ucm,) = _bench(sim.url, input_lens=[4096], reset_hbm=True, output_len=4)
    with sim_server(tmp_path, "--block-size", str(BLOCK)) as sim:
        (hbm_reset,) = _bench(sim.url, input_lens=[4096], reset_hbm=True, output_len=4)
    assert ucm.measure is not None and hbm_reset.measure is not None
    rates = ucm.measure.totals()
    assert rates["local_hit_rate"] == 0.0
    assert abs(rates["external_hit_rate"] - 0.8) <= 0.02  # the target: within 2 points
    assert rates["external_hit_rate"] == pytest.approx(3264 / 4096)  # 204 whole blocks of 3276 tokens
    assert hbm_reset.measure.totals()["hit_rate"] == 0.0  # no store: nothing left to hit


def test_each_run_is_cold_by_its_own_cache_salt_and_a_salt_given_again_is_warm(tmp_path: Path) -> None:
    """The same seed twice on one server: each run salts its requests with a value of its own,
    so the second measures the 80% asked and no warning; `--cache-salt` given twice reuses the
    first's blocks, and the report says so. The salts are in the saved provenance."""
    store = tmp_path / "store"
    store.mkdir()
    flags = ["--block-size", str(BLOCK), *kv_flag(ucm_config(tmp_path, store)), "--kv-bytes-per-token", "256"]
    args = ["--input-len", "512", "--num-prompts", "8", "--output-len", "4", "--seed", "7", "-q"]
    with sim_server(tmp_path, *flags) as sim:
        runs = []
        for i, extra in enumerate([[], [], ["--cache-salt", "nightly"], ["--cache-salt", "nightly"]]):
            save = tmp_path / f"run{i}.json"
            code, text = invoke("--url", sim.url, *args, *extra, "--save", str(save))
            assert code == 0, text
            doc = json.loads(save.read_text())
            runs.append((doc, " ".join(text.split())))
    salts = [doc["provenance"]["cache_salt"] for doc, _ in runs]
    assert salts[0] != salts[1] and salts[0].startswith("ucmctl-") and salts[2:] == ["nightly", "nightly"]
    for doc, text in runs[:3]:  # cold: only its own preseed's 80% hit
        (cell,) = doc["cells"]
        assert cell["preseed"]["hit_rate"]["total"]["hit_rate"] == 0.0, cell["preseed"]["hit_rate"]
        assert cell["measure"]["hit_rate"]["total"]["hit_rate"] == pytest.approx(0.8, abs=0.02)
        assert "already cached" not in text, text
    (cell,) = runs[3][0]["cells"]  # the salt again: the first "nightly" run's blocks are hits
    assert cell["preseed"]["hit_rate"]["total"]["hit_rate"] > 0.95, cell["preseed"][
        "hit_rate"
    ]  # whole blocks
    assert "already cached (a run with the same --seed and --cache-salt before" in runs[3][1], runs[3][1]


def test_failures_are_counted_and_fail_the_run(tmp_path: Path) -> None:
    with sim_server(tmp_path, "--max-model-len", "900") as sim:
        code, text = invoke(
            "--url",
            sim.url,
            "--input-len",
            "500,1000",
            "--num-prompts",
            "4",
            "--concurrency",
            "2",
            "--output-len",
            "8",
            "--prefix-ratio",
            "0.5",
            "-q",
        )
    assert code == ExitStatus.REQUESTS_FAILED == 6
    said = " ".join(text.split())  # messages wrap at the width
    assert "4 x HTTP 400" in said and "maximum context length is 900" in said
    assert "4 request(s) failed" in text  # the 1000-token measure fails; its 500-token preseed fits


def test_save_then_compare_catches_a_real_slowdown(tmp_path: Path) -> None:
    runs = {}
    for name, step in (("fast", "2"), ("fast2", "2"), ("slow", "8")):
        with sim_server(tmp_path, "--decode-step-ms", step, "--block-size", str(BLOCK)) as sim:
            out = tmp_path / f"{name}.json"
            code, _ = invoke(
                "--url",
                sim.url,
                "--input-len",
                "256",
                "--num-prompts",
                "4",
                "--concurrency",
                "4",
                "--output-len",
                "20",
                "--save",
                str(out),
                "-q",
            )
            assert code == 0
            runs[name] = out
    doc = json.loads(runs["fast"].read_text())
    assert doc["schema_version"] == 2 and doc["provenance"]["ucmctl_version"]
    assert doc["cells"][0]["workload"] == "prefix" and doc["cells"][0]["label"] == "256"
    assert doc["completed"] == 4 and doc["mean_tpot_ms"] == doc["cells"][0]["measure"]["mean_tpot_ms"]
    # every step sleeps 2 ms (the slow run's 8): a busy machine adds to it, a late first token takes
    # a little off
    assert 1.5 <= doc["mean_tpot_ms"] < 5
    code, text = invoke("compare", str(runs["fast"]), str(runs["slow"]), "--max-regression", "tpot_mean=20%")
    assert code == ExitStatus.REGRESSION and "regression" in text
    code, text = invoke(
        "compare", str(runs["fast"]), str(runs["fast2"]), "--max-regression", "tpot_mean=100%"
    )
    assert code == 0


@pytest.mark.slow  # ~40 s: the CI suite twice
def test_ci_suite_end_to_end_and_resume(tmp_path: Path) -> None:
    suite = Path(__file__).resolve().parents[3] / "benchmarks" / "suites" / "ci.yaml"
    results, save = tmp_path / "ci.jsonl", tmp_path / "ci.json"
    code, text = invoke("suite", str(suite), "--results", str(results), "--save", str(save), "-q")
    assert code == 0, text
    cells = json.loads(save.read_text())["cells"]
    assert [(c["scenario"], c["input_len"]) for c in cells] == [
        (s, n) for s in ("recompute", "hbm", "ucm") for n in (1024, 2048)
    ]
    for c in cells:
        total = c["measure"]["hit_rate"]["total"]
        assert c["measure"]["failed"] == 0 and c["measure"]["lost"] == []  # watched, none lost
        if c["scenario"] == "ucm":
            assert abs(total["external_hit_rate"] - 0.8) <= 0.02
        else:
            assert total["hit_rate"] == 0.0
    code, text = invoke("suite", str(suite), "--results", str(results), "-q")  # all done: nothing redeploys
    assert code == 0 and "all 2 cells already done" in text
    # the same suite again, same seed, on the same store: cold again (its own cache salt and
    # prompt streams), so the same hit rates, and nothing found cached before its preseed
    again = tmp_path / "again.json"
    code, text = invoke(
        "suite", str(suite), "--results", str(tmp_path / "again.jsonl"), "--save", str(again), "-q"
    )
    assert code == 0 and "already cached" not in text, text
    second = json.loads(again.read_text())
    assert second["provenance"]["cache_salt"] != json.loads(save.read_text())["provenance"]["cache_salt"]
    for a, b in zip(cells, second["cells"], strict=True):
        ra, rb = (c["measure"]["hit_rate"]["total"]["hit_rate"] for c in (a, b))
        assert abs(ra - rb) <= 0.02, (a["scenario"], a["input_len"], ra, rb)
