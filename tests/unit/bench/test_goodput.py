from __future__ import annotations

import argparse
import random
from types import ModuleType
from typing import Any

import pytest

from ucmctl.bench.client import RequestResult
from ucmctl.bench.goodput import SLO_METRICS, good_count, goodput_fields, parse_goodput
from ucmctl.core.errors import ExitStatus, UcmctlError


def req(i: int, ttft: float, latency: float, out: int, ok: bool = True) -> RequestResult:
    itl = [(latency - ttft) / (out - 1)] * (out - 1) if out > 1 else []
    return RequestResult(
        index=i,
        prompt_len=100,
        ok=ok,
        output_tokens=out,
        ttft=ttft,
        latency=latency,
        itl=itl,
        error="" if ok else "HTTP 500: boom",
    )


# By hand, in ms:          ttft  tpot            e2el
RESULTS = [
    req(0, 0.050, 0.550, 11),  # 50   500/10 = 50     550
    req(1, 0.150, 0.250, 3),  # 150  100/2 = 50      250
    req(2, 0.080, 0.080, 1),  # 80   one token -> 0  80
    req(3, 0.010, 0.020, 5, ok=False),  # failed: never good, however fast
    req(4, 0.100, 1.100, 6),  # 100 (on the SLO)  1000/5 = 200  1100
]


@pytest.mark.parametrize(
    ("slos", "good"),
    [
        ({"ttft": 100}, 3),  # 0, 2, 4 (100 ms <= 100 ms is good); 1 too slow; 3 failed
        ({"tpot": 60}, 3),  # 0, 1, 2 (one token: tpot 0); 4 is 200 ms
        ({"tpot": 1}, 1),  # only the one-token request, whose tpot counts as 0
        ({"e2el": 500}, 2),  # 1, 2
        ({"ttft": 100, "tpot": 60}, 2),  # 0, 2: every given SLO must hold
        ({"ttft": 100, "tpot": 60, "e2el": 100}, 1),  # 2
        ({"ttft": 5}, 0),  # the failed request's 10 ms TTFT would not count anyway
        ({"ttft": 10_000, "tpot": 10_000, "e2el": 10_000}, 4),  # every successful one, not the failed
    ],
)
def test_good_count_by_hand(slos: dict[str, float], good: int) -> None:
    assert good_count(RESULTS, slos) == good


def test_zero_output_tokens_counts_as_zero_tpot() -> None:
    r = req(0, 0.2, 0.5, 0)
    assert good_count([r], {"tpot": 0.001}) == 1


def test_goodput_fields() -> None:
    assert goodput_fields(RESULTS, 2.0, {"ttft": 100.0}) == {
        "request_goodput": 1.5,  # 3 good / 2 s
        "good_completed": 3,
        "goodput_slos_ms": {"ttft": 100.0},
    }
    assert goodput_fields(RESULTS, 0.0, {"ttft": 100.0})["request_goodput"] is None
    assert goodput_fields(RESULTS, -1.0, {"ttft": 100.0})["request_goodput"] is None
    assert goodput_fields(RESULTS, float("nan"), {"ttft": 100.0})["request_goodput"] is None
    # no SLO: no goodput, as vLLM reports `request_goodput: null` without --goodput
    assert goodput_fields(RESULTS, 2.0, {}) == {
        "request_goodput": None,
        "good_completed": None,
        "goodput_slos_ms": {},
    }
    slos = {"tpot": 60.0}
    fields = goodput_fields(RESULTS, 4.0, slos)
    assert fields["request_goodput"] == 0.75 and fields["goodput_slos_ms"] is not slos


def test_good_count_rejects_unknown_metric() -> None:
    with pytest.raises(ValueError, match="itl"):
        good_count(RESULTS, {"itl": 10.0})


@pytest.mark.parametrize(
    ("items", "want"),
    [
        (["ttft:500", "tpot:50"], {"ttft": 500.0, "tpot": 50.0}),
        (["ttft:500 tpot:50"], {"ttft": 500.0, "tpot": 50.0}),
        (["ttft:500  tpot:50", "e2el:2000.5"], {"ttft": 500.0, "tpot": 50.0, "e2el": 2000.5}),
        ("e2el:1e3", {"e2el": 1000.0}),
        ([], {}),
    ],
)
def test_parse_goodput(items: Any, want: dict[str, float]) -> None:
    assert parse_goodput(items) == want


@pytest.mark.parametrize(
    ("items", "says"),
    [
        (["itl:50"], "unknown metric 'itl'"),
        (["TTFT:50"], "unknown metric 'TTFT'"),
        (["ttft500"], "'ttft500' is not KEY:VALUE"),
        (["ttft:5:0"], "is not KEY:VALUE"),
        (["ttft:abc"], "'abc' in 'ttft:abc' is not a number"),
        (["ttft:"], "is not a number"),
        (["ttft:nan"], "not a finite number"),
        (["ttft:inf"], "not a finite number"),
        (["ttft:0"], "must be > 0"),
        (["tpot:-5"], "must be > 0"),
        (["ttft:500", "ttft:600"], "ttft given twice"),
        (["ttft:500 ttft:500"], "ttft given twice"),
        (["  "], "no SLO given"),
        (["ttft:1\ntpot"], "is not KEY:VALUE"),
    ],
)
def test_parse_goodput_rejects(items: list[str], says: str) -> None:
    with pytest.raises(UcmctlError) as caught:
        parse_goodput(items)
    err = caught.value
    text = str(err)
    assert err.status == ExitStatus.BAD_INPUT == 2
    assert "\n" not in text  # one line
    assert text.startswith("--goodput: ")
    assert says in text
    assert "ttft:500 tpot:50" in text  # an example of what works


# ---- against vLLM's own implementation -----------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_serve() -> ModuleType:
    return pytest.importorskip("vllm.benchmarks.serve")


def _vllm_good(serve: ModuleType, results: list[RequestResult], slos: dict[str, float], dur: float) -> Any:
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    outputs = [
        RequestFuncOutput(
            success=r.ok,
            latency=r.latency,
            output_tokens=r.output_tokens,
            ttft=r.ttft,
            itl=list(r.itl),
            prompt_len=r.prompt_len,
            error=r.error,
            start_time=r.start_time,
        )
        for r in results
    ]
    inputs = [SampleRequest(prompt="x", prompt_len=r.prompt_len, expected_output_len=8) for r in results]
    metrics, _ = serve.calculate_metrics(inputs, outputs, dur, None, [99.0], slos)
    return metrics


def test_matches_vllm_calculate_metrics(vllm_serve: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(1234)
    slo_sets = [
        {"ttft": 100.0},
        {"tpot": 20.0},
        {"e2el": 800.0},
        {"ttft": 150.0, "tpot": 25.0, "e2el": 900.0},
    ]
    checked = 0
    for trial in range(60):
        results = []
        for i in range(rng.randint(1, 30)):
            ttft = rng.choice([0.1, 0.15, 0.025, rng.uniform(0.0, 0.3)])  # some exactly on an SLO
            out = rng.choice([0, 1, 2, rng.randint(2, 60)])
            latency = ttft + (out - 1) * rng.uniform(0.0, 0.04) if out > 1 else ttft
            r = req(i, ttft, latency, out, ok=rng.random() > 0.15)
            r.start_time = rng.uniform(0.0, 3.0)
            results.append(r)
        dur = rng.uniform(0.5, 5.0)
        for slos in slo_sets:
            theirs = _vllm_good(vllm_serve, results, slos, dur)
            mine = goodput_fields(results, dur, slos)
            assert mine["request_goodput"] == theirs.request_goodput, (trial, slos)
            assert mine["good_completed"] == round(theirs.request_goodput * dur)
            checked += 1
    assert checked == 240
    # the hand-made set too
    assert _vllm_good(vllm_serve, RESULTS, {"ttft": 100.0}, 2.0).request_goodput == 1.5
    capsys.readouterr()


@pytest.mark.parametrize(
    "items",
    [["ttft:500", "tpot:50"], ["ttft:500 tpot:50"], ["e2el:2000.5"], ["tpot:1e1", "e2el:3", "ttft:7"]],
)
def test_accepts_what_vllm_accepts(vllm_serve: ModuleType, items: list[str]) -> None:
    split = [pair for item in items for pair in item.split()]  # vLLM's nargs="+" gets them from the shell
    assert parse_goodput(items) == vllm_serve.check_goodput_args(argparse.Namespace(goodput=split))


@pytest.mark.parametrize("pair", ["itl:50", "ttft500", "ttft:5:0", "ttft:abc", "tpot:-5"])
def test_rejects_what_vllm_rejects(vllm_serve: ModuleType, pair: str) -> None:
    with pytest.raises((ValueError, argparse.ArgumentTypeError)):
        vllm_serve.check_goodput_args(argparse.Namespace(goodput=[pair]))
    with pytest.raises(UcmctlError):
        parse_goodput([pair])


def test_metric_names_are_vllms() -> None:
    assert SLO_METRICS == ("ttft", "tpot", "e2el")
