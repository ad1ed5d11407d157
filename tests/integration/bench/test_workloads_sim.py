"""The workloads against real simulator processes, through `ucmctl bench` as users type it:
multi-turn (answers carried into the next round, measured hit rate equal to the workload's
ideal when the cache is large enough), long-doc (a tiled working set larger than the cache
misses, one that fits hits), trace replay (every line sent, its lengths, the ideal), sweeps
with goodput and preemptions, and bad input that sends nothing."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.integration.sim.test_sim_server import kv_flag, ucm_config
from tests.support.openai_checks import metric
from tests.support.processes import sim_server
from tests.unit.bench.helpers import invoke
from ucmctl.bench.workloads.trace import format as trace
from ucmctl.core.errors import ExitStatus

MODEL = Path(__file__).resolve().parents[3] / ".models" / "medium"
BLOCK = 16


def _vocab() -> list[str]:
    # The simulator's own tokenizer when the medium model is there; the bench draws below it.
    return ["--model-dir", str(MODEL)] if (MODEL / "config.json").is_file() else ["--vocab", "4000"]


def _requests(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    return metric(text, "vllm:prompt_tokens_total")


def _bench(url: str, out: Path, *args: str) -> tuple[int, str, dict]:
    code, text = invoke("--url", url, *_vocab(), "-q", "--save", str(out), *args)
    doc = json.loads(out.read_text()) if out.exists() else {}
    return code, text, doc


def test_multi_turn_carries_answers_and_hits_what_it_can(tmp_path: Path) -> None:
    with sim_server(tmp_path, "--block-size", str(BLOCK), "--decode-step-ms", "1") as sim:
        code, text, doc = _bench(
            sim.url, tmp_path / "mt.json", "--workload", "multi-turn", "--users", "4", "--rounds", "3",
            "--system-tokens", "256", "--question-tokens", "48", "--output-len", "40", "--concurrency", "1",
            "--csv", str(tmp_path / "mt.csv"), "--markdown", str(tmp_path / "mt.md"),
            "--plot", str(tmp_path / "mt.png"),
        )  # fmt: skip
    assert code == 0, text
    cells = doc["cells"]
    assert [c["label"] for c in cells] == ["round 1", "round 2", "round 3", "rounds 2-3"]
    # round r's prompt: system + r questions + (r - 1) answers of exactly 40 tokens
    assert [c["measure"]["input_len"] for c in cells[:3]] == [256 + 48, 256 + 2 * 48 + 40, 256 + 3 * 48 + 80]
    assert all(c["measure"]["completed"] == 4 and c["measure"]["failed"] == 0 for c in cells[:3])
    assert cells[3]["measure"]["completed"] == 8 and cells[3].get("aggregate") is True
    # One request at a time into a cache far larger than the working set: measured == ideal
    # (the ideal assumes each prompt is cached before the next is sent; with users in flight
    # together, those that arrive in the same engine step cannot share the system prompt yet)
    for c in cells:
        assert c["measure"]["hit_rate"]["total"]["local_hit_rate"] == pytest.approx(c["ideal_hit_rate"])
    # round 1: users 2-4 find the 256-token system prompt (16 blocks) that user 1 sent
    assert cells[0]["ideal_reused_tokens"] == 3 * 256
    # later rounds reuse the previous prompt and all but the last token of its answer
    assert cells[1]["ideal_reused_tokens"] == 4 * ((256 + 48 + 40 - 1) // BLOCK * BLOCK)
    assert cells[1]["ideal_hit_rate"] > 0.8
    assert doc["provenance"]["prompts_digest"] and doc["config"]["workload"] == "multi-turn"
    assert "round 1" in text and "rounds 2-3" in text
    # the same outputs as every workload: CSV rows per cell, a Markdown table, a plot
    import pandas as pd

    frame = pd.read_csv(tmp_path / "mt.csv")
    assert list(frame["label"]) == ["round 1", "round 2", "round 3", "rounds 2-3"]
    assert list(frame["workload"].unique()) == ["multi-turn"]
    assert frame["ideal_hit_rate"].iloc[1] == pytest.approx(cells[1]["ideal_hit_rate"], abs=1e-4)
    md = (tmp_path / "mt.md").read_text()
    assert md.startswith("| cell | output |") and "| round 2 | 40 |" in md
    assert (tmp_path / "mt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_multi_turn_store_serves_what_a_small_local_cache_cannot(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    args = ("--workload", "multi-turn", "--users", "8", "--rounds", "3", "--system-tokens", "512",
            "--question-tokens", "64", "--output-len", "32", "--concurrency", "1")  # fmt: skip
    # 64 blocks of 16 tokens: the longest request fits (800 tokens), the 8 users' histories
    # (~5,600 tokens) do not: they evict each other
    kv_gib = str(64 * BLOCK * 256 / 2**30)
    small = ["--block-size", str(BLOCK), "--kv-cache-gib", kv_gib, "--kv-bytes-per-token", "256"]
    with sim_server(tmp_path, *small) as sim:
        code, text, hbm = _bench(sim.url, tmp_path / "hbm.json", *args)
    assert code == 0, text
    with sim_server(tmp_path, *small, *kv_flag(ucm_config(tmp_path, store))) as sim:
        code, text, ucm = _bench(sim.url, tmp_path / "ucm.json", *args)
    assert code == 0, text
    later_hbm, later_ucm = hbm["cells"][-1], ucm["cells"][-1]
    ideal = later_hbm["ideal_hit_rate"]
    assert later_ucm["ideal_hit_rate"] == pytest.approx(ideal)  # the same token stream
    local = later_hbm["measure"]["hit_rate"]["total"]["local_hit_rate"]
    assert local < ideal - 0.3  # the local cache is too small
    total = later_ucm["measure"]["hit_rate"]["total"]
    # vLLM counts external queries as the tokens the local cache missed: the whole-prompt rate
    # is (local hits + external hits) / prompt tokens
    assert abs(total["hit_rate"] - ideal) <= 0.03
    assert total["external_hits"] > 0.3 * total["local_queries"]


def test_long_doc_tile_outgrows_the_cache_interleave_does_not(tmp_path: Path) -> None:
    blocks = 200  # 3200 tokens: less than 4 documents of 1024
    flags = [
        "--block-size",
        str(BLOCK),
        "--kv-cache-gib",
        str(blocks * BLOCK * 256 / 2**30),
        "--kv-bytes-per-token",
        "256",
    ]
    common = ("--workload", "long-doc", "--documents", "4", "--doc-tokens", "1024", "--repeat-count", "2",
              "--output-len", "4", "--concurrency", "1")  # fmt: skip
    with sim_server(tmp_path, *flags) as sim:
        code, text, tile = _bench(sim.url, tmp_path / "tile.json", *common, "--repeat-mode", "tile")
        assert code == 0, text
        code, text, inter = _bench(
            sim.url, tmp_path / "inter.json", *common, "--repeat-mode", "interleave", "--seed", "1"
        )
        assert code == 0, text
    (t,), (i,) = tile["cells"], inter["cells"]
    assert t["preseed"]["completed"] == 4 and t["measure"]["completed"] == 8
    assert t["ideal_hit_rate"] == pytest.approx(1008 / 1024)  # every document was warmed up
    assert t["measure"]["hit_rate"]["total"]["local_hit_rate"] == 0.0  # LRU: each evicted before it returns
    assert i["measure"]["hit_rate"]["total"]["local_hit_rate"] >= 0.45  # the second copy follows the first
    assert "warm-up" in text and "query" in text


def test_trace_replay_sends_every_line_on_time(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    code, text = invoke("make-trace", str(path), "--requests", "60", "--rate", "40", "--input-len", "700",
                        "--output-len", "6", "--pattern", "shared-prefix", "--groups", "2",
                        "--shared-fraction", "0.8")  # fmt: skip
    assert code == 0, text
    reqs = trace.load_trace(path)
    with sim_server(tmp_path, "--block-size", str(BLOCK)) as sim:
        code, text, doc = _bench(
            sim.url, tmp_path / "tr.json", "--workload", "trace", "--trace", str(path), "--speedup", "2"
        )
        prompt_tokens = _requests(sim.url)
    assert code == 0, text
    (cell,) = doc["cells"]
    m = cell["measure"]
    assert m["completed"] == 60 and m["total_input_tokens"] == sum(r.input_length for r in reqs)
    assert m["total_output_tokens"] == sum(r.output_length for r in reqs)
    # nothing else was sent but, without the model folder here, the 2-token vocabulary check
    probe = 0 if "--model-dir" in _vocab() else 2
    assert prompt_tokens == m["total_input_tokens"] + probe
    assert cell["ideal_hit_rate"] == pytest.approx(trace.ideal_hits(reqs).ratio)
    span = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000 / 2
    assert m["duration"] >= span  # sent on the trace's schedule, twice as fast
    assert m["send_lag_ms"]["p50"] < 50 and cell["speedup"] == 2
    assert m["hit_rate"]["total"]["local_hit_rate"] > 0.5


def test_sweep_goodput_and_preemptions(tmp_path: Path) -> None:
    # 40 blocks of 16: four 300-token prompts with 100-token answers do not fit at once
    flags = ["--block-size", str(BLOCK), "--kv-cache-gib", str(40 * BLOCK * 256 / 2**30),
             "--kv-bytes-per-token", "256", "--decode-step-ms", "1"]  # fmt: skip
    with sim_server(tmp_path, *flags) as sim:
        code, text, doc = _bench(
            sim.url, tmp_path / "sw.json", "--input-len", "300", "--prefix-ratio", "0", "--num-prompts", "4",
            "--output-len", "100", "--concurrency", "1,4", "--goodput", "ttft:100000", "e2el:100000",
        )  # fmt: skip
    assert code == 0, text
    cells = doc["cells"]
    assert [c["point"]["max_concurrency"] for c in cells] == [1, 4]
    assert [c["point_name"] for c in cells] == ["conc 1", "conc 4"]
    for c in cells:
        m = c["measure"]
        assert m["good_completed"] == 4 and m["request_goodput"] == pytest.approx(4 / m["duration"])
    assert cells[0]["measure"]["hit_rate"]["total"]["preemptions"] == 0  # one at a time fits
    assert cells[1]["measure"]["hit_rate"]["total"]["preemptions"] > 0
    assert "preemption(s)" in text and "conc 4" in text
    assert "warning:" in text and "tokens in flight" in text  # said before it ran
    assert [c["measure"]["total_output_tokens"] for c in cells] == [400, 400]  # preempted, not lost


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--workload", "trace", "--trace", "{bad}"), "bad.jsonl:2"),
        (("--workload", "trace", "--trace", "{empty}"), "empty"),
        (("--workload", "trace"), "--trace"),
        (("--goodput", "ttft:abc"), "--goodput"),
        (("--concurrency", "0,2"), "--concurrency"),
        (("--request-rate", "1,0"), "--request-rate"),
        (("--workload", "long-doc", "--repeat-mode", "shuffle"), "--repeat-mode"),
        (("--workload", "multi-turn", "--rounds", "40", "--output-len", "500"), "max_model_len"),
        (("--workload", "bogus"), "--workload"),
    ],
)
def test_bad_input_is_one_line_and_sends_nothing(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
                   '{"timestamp": 5, "input_length": 10, "output_length": 2}\n')  # fmt: skip
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    args = tuple(a.format(bad=bad, empty=empty) for a in args)
    with sim_server(tmp_path, "--max-model-len", "8192") as sim:
        code, text = invoke("--url", sim.url, *_vocab(), "-q", *args)
        sent = _requests(sim.url)
    assert code == ExitStatus.BAD_INPUT, text
    assert needle in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert sent == 0
