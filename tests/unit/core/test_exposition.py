"""The one reader of Prometheus text: samples with and without labels, timestamps, label values
that hold braces, quotes and spaces, and lines that are not samples."""

from __future__ import annotations

from ucmctl.core.exposition import samples, total

TEXT = r"""# HELP vllm:num_preemptions Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="1",model_name="m"} 4 1733300000000
vllm:cache_config_info{block_size="16",num_gpu_blocks="512",note="a } and a \" here"} 1.0
ucmctl_proxy_retries_total 2
vllm:broken{engine="0"} NaNx
not a sample line
process_start_time_seconds 1.7e9
"""


NOTE = r"a } and a \" here"


def test_samples_names_labels_values() -> None:
    got = [(s.name, s.labels, s.value) for s in samples(TEXT)]
    assert got == [
        ("vllm:num_preemptions_total", {"engine": "0", "model_name": "m"}, 3.0),
        ("vllm:num_preemptions_total", {"engine": "1", "model_name": "m"}, 4.0),  # not the timestamp
        ("vllm:cache_config_info", {"block_size": "16", "num_gpu_blocks": "512", "note": NOTE}, 1.0),
        ("ucmctl_proxy_retries_total", {}, 2.0),
        ("process_start_time_seconds", {}, 1.7e9),
    ]  # fmt: skip
    assert [s.name for s in samples(TEXT, ("ucmctl_",))] == ["ucmctl_proxy_retries_total"]
    assert total(TEXT, frozenset({"vllm:num_preemptions_total", "vllm:num_preemptions"})) == 7.0
    assert total(TEXT, frozenset({"vllm:nothing"})) is None
