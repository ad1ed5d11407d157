"""The proxy's `--p2p mooncake` router against simulators speaking vLLM's MooncakeConnector
protocol: a transfer_id on both legs, the prefiller's engine from its bootstrap server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.support.processes import free_port

from .procs import Proc, get, metric, pd_flags, post, proxy, sim

PRODUCER = json.dumps({"kv_connector": "MooncakeConnector", "kv_role": "kv_producer",
                       "kv_connector_extra_config": {"mooncake_protocol": "tcp"}})  # fmt: skip
CONSUMER = json.dumps({"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer",
                       "kv_connector_extra_config": {"mooncake_protocol": "tcp"}})  # fmt: skip


def prompt(n: int = 700) -> dict[str, object]:
    return {"model": "sim-model", "prompt": list(range(5, 5 + n)), "max_tokens": 3, "temperature": 0}


def transferred(p: Proc) -> float:
    return metric(p.url, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")


def mooncake_pair(tmp: Path) -> tuple[Proc, Proc, str]:
    boot = free_port()
    pre = sim(tmp, "--kv-transfer-config", PRODUCER)
    pre.env = {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(boot)}
    dec = sim(tmp, "--kv-transfer-config", CONSUMER)
    return pre, dec, f"http://127.0.0.1:{boot}"


def test_kv_moves_only_with_the_transfer_id_and_the_prefillers_engine(
    tmp_path: Path, launch: Callable[..., list[Proc]]
) -> None:
    pre, dec, boot = mooncake_pair(tmp_path)
    router = proxy(tmp_path, *pd_flags([pre], [dec]), "--p2p", "mooncake", "--bootstrap", boot)
    # the same instances behind the old flow: no transfer_id, no engine for decode
    legacy = proxy(tmp_path, *pd_flags([pre], [dec]), "--p2p", "ascend")
    launch(pre, dec, router, legacy)

    status, _, raw = post(router.url + "/v1/completions", prompt())
    assert status == 200, raw
    assert json.loads(raw)["usage"]["completion_tokens"] == 3
    assert transferred(dec) == 699  # the whole prompt but the last token came over, none computed
    assert transferred(pre) == 0

    before = transferred(dec)
    status, _, raw = post(legacy.url + "/v1/completions", prompt())
    assert status == 200  # the client sees an answer...
    assert transferred(dec) == before  # ...but decode recomputed: nothing moved
    assert "Missing transfer_id in kv_transfer_params from router!" in pre.log.read_text()

    # a decode leg without the prefiller's engine is refused as vLLM refuses it: recompute
    partial = {**prompt(), "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": "xfer-1"}}
    assert post(dec.url + "/v1/completions", partial)[0] == 200
    assert transferred(dec) == before
    assert "This request will not utilize KVTransfer" in dec.log.read_text()
    # a transfer this prefiller never ran is a KV load failure: vLLM's default policy fails it
    engine = json.loads(get(boot + "/query")[2])["0"]["engine_id"]
    unknown = {**prompt(), "kv_transfer_params": {
        "do_remote_prefill": True, "transfer_id": "xfer-never", "remote_engine_id": engine,
        "remote_bootstrap_addr": boot}}  # fmt: skip
    status, _, raw = post(dec.url + "/v1/completions", unknown)
    assert status == 500 and json.loads(raw)["error"]["message"] == "Internal server error"
    assert transferred(dec) == before


def test_a_wrong_bootstrap_fails_the_request_with_one_line(
    tmp_path: Path, launch: Callable[..., list[Proc]]
) -> None:
    pre, dec, _ = mooncake_pair(tmp_path)
    nowhere = f"http://127.0.0.1:{free_port()}"
    router = proxy(tmp_path, *pd_flags([pre], [dec]), "--p2p", "mooncake", "--bootstrap", nowhere)
    launch(pre, dec, router)
    status, _, raw = post(router.url + "/v1/completions", prompt())
    assert status == 502
    message = json.loads(raw)["error"]["message"]
    assert f"Mooncake bootstrap {nowhere} gave no engine" in message and "\n" not in message
    assert transferred(dec) == 0


def test_a_failed_pull_is_not_sent_to_another_decoder(
    tmp_path: Path, launch: Callable[..., list[Proc]]
) -> None:
    """The prefiller hands its KV over once: a decode leg that failed its pull is not retried
    (a second decoder would wait for a transfer that is gone); the client sees the failure."""
    pre_a, dec_a, boot_a = mooncake_pair(tmp_path)
    pre_b, dec_b, boot_b = mooncake_pair(tmp_path)
    # each prefiller given the other's bootstrap server: decode is sent to the wrong engine
    router = proxy(tmp_path, *pd_flags([pre_a, pre_b], [dec_a, dec_b]), "--p2p", "mooncake",
                   "--bootstrap", boot_b, "--bootstrap", boot_a)  # fmt: skip
    launch(pre_a, dec_a, pre_b, dec_b, router)
    status, _, raw = post(router.url + "/v1/completions", prompt())
    assert status == 502
    assert "answered 500" in json.loads(raw)["error"]["message"]
    asked = [metric(d.url, "vllm:prompt_tokens_total") for d in (dec_a, dec_b)]
    assert sorted(asked) == [0, 0]  # no decoder prefilled anything: the one asked failed its pull
    failed_pulls = [d.log.read_text().count("pulling kv_caches failed") for d in (dec_a, dec_b)]
    assert sorted(failed_pulls) == [0, 1]  # one decode leg, sent once
