"""KV blocks and preemption in the simulator's engine, and their exposition as vLLM's."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.http import get, post
from tests.support.openai_checks import metric
from tests.support.processes import sim_server
from ucmctl.bench.capacity import parse_capacity, parse_preemptions
from ucmctl.sim.engine import FINISHED, Engine, SimRequest, continuation
from ucmctl.sim.metrics import exposition
from ucmctl.sim.prefix_cache import PrefixCache, block_keys
from ucmctl.sim.profile import Profile

BLOCK = 16
VOCAB = 1000


class Watched(Engine):
    """An engine that remembers the most blocks its running requests ever held."""

    peak = 0

    def _hold(self, r: SimRequest, blocks: int) -> None:
        super()._hold(r, blocks)
        self.peak = max(self.peak, self.held_blocks)
        assert len(self.cache) <= self.num_blocks - self.held_blocks or self.held_blocks > self.num_blocks


def engine(blocks: int, *, max_num_seqs: int = 16, budget: int = 2048) -> Watched:
    return Watched(0, Profile(), block_size=BLOCK, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                   cache=PrefixCache(blocks), external=None, vocab=VOCAB)  # fmt: skip


def request(i: int, prompt_len: int, max_tokens: int) -> SimRequest:
    prompt = [(i * 7919 + t) % VOCAB for t in range(prompt_len)]
    return SimRequest(f"r{i}", prompt, max_tokens, block_keys(prompt, BLOCK, b"t"))


def expected(r: SimRequest) -> list[int]:
    """The engine's deterministic continuation: any token lost or sent twice would show."""
    return continuation(r.prompt, r.max_tokens, VOCAB)


async def collect(r: SimRequest) -> list[int]:
    tokens = []
    while (token := await r.out.get()) != FINISHED:
        tokens.append(token)
    return tokens


def run(e: Engine, *batches: list[SimRequest]) -> list[list[int]]:
    """Each batch submitted at once, after the previous one finished; every request's tokens."""

    async def main() -> list[list[int]]:
        e.start()
        outputs: list[list[int]] = []
        try:
            for batch in batches:
                for r in batch:
                    e.submit(r)
                outputs += await asyncio.wait_for(asyncio.gather(*(collect(r) for r in batch)), 60)
            return outputs
        finally:
            await e.stop()

    return asyncio.run(main())


def test_requests_outgrowing_the_kv_cache_are_preempted_and_still_complete() -> None:
    e = engine(64)  # 1,024 tokens; four requests of 300 + 200 need 4 x 32 = 128 blocks
    requests = [request(i, 300, 200) for i in range(4)]
    outputs = run(e, requests)
    assert e.stats.preemptions > 0
    assert sum(r.preemptions for r in requests) == e.stats.preemptions
    for r, tokens in zip(requests, outputs, strict=True):
        assert tokens == expected(r)  # every token once, in order, despite recomputation
    assert e.stats.generation_tokens == 4 * 200 and e.stats.finished == 4
    assert e.peak <= 64  # never more than the engine has
    assert e.held_blocks == 0 and not e.running and not e.waiting
    assert any(r.recompute > 0 for r in requests)  # preempted while decoding: generated tokens recomputed
    assert e.stats.prompt_tokens == 4 * 300  # a readmission is not a new prompt


def test_the_same_workload_with_ten_times_the_blocks_is_never_preempted() -> None:
    e = engine(640)
    requests = [request(i, 300, 200) for i in range(4)]
    outputs = run(e, requests)
    assert e.stats.preemptions == 0
    assert [len(t) for t in outputs] == [200] * 4
    assert e.peak == 4 * 32  # each holds ceil((300 + 200 - 1 + 1) / 16) = 32 blocks at its end
    assert e.held_blocks == 0


def test_admission_waits_for_the_prompts_blocks() -> None:
    """Two prompts of 40 blocks do not fit 64 blocks together: the second waits, no preemption."""
    e = engine(64)
    requests = [request(i, 640, 1) for i in range(2)]
    run(e, requests)
    assert e.stats.preemptions == 0 and e.peak == 40


def test_a_request_larger_than_the_cache_runs_alone_instead_of_hanging() -> None:
    e = engine(8)  # 128 tokens
    requests = [request(0, 200, 20), request(1, 50, 5)]
    outputs = run(e, requests)
    assert [len(t) for t in outputs] == [20, 5]
    assert e.peak == 14  # ceil(220 / 16): overcommitted while alone


def test_running_requests_take_blocks_from_the_prefix_cache() -> None:
    e = engine(64)
    seen: list[int] = []
    grow = e._grow_running

    def watch() -> bool:
        seen.append(len(e.cache))
        return grow()

    e._grow_running = watch  # type: ignore[method-assign]
    run(e, [request(0, 320, 1)], [request(1, 800, 1)])
    # The first leaves its 20 prompt blocks cached. The second holds 50 of the 64 blocks while it
    # runs, so only 14 cached blocks fit next to it: 6 of the first's go at its admission, then
    # its own 50 new blocks push out the rest and 36 of their own (the model counts a running
    # request's blocks apart from the cache's, where vLLM shares them).
    assert seen[0] == 0 and 20 in seen
    assert e.cache.evictions == 6 + 50
    assert len(e.cache) == 14


def test_exposition_matches_the_engine_and_parses_as_vllm() -> None:
    e = engine(64)
    requests = [request(i, 300, 200) for i in range(4)]
    run(e, requests)
    other = engine(64)
    other.index = 1
    text = exposition("m", [e, other])
    assert parse_preemptions(text) == e.stats.preemptions > 0
    assert metric(text, "vllm:num_preemptions_total") == e.stats.preemptions
    assert parse_capacity(text) == (128, BLOCK)  # summed over engines by the front end, as vLLM
    info = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert len(info) == 2 and all(line.endswith("} 1.0") for line in info)
    for label in ('block_size="16"', 'num_gpu_blocks="128"', 'enable_prefix_caching="True"',
                  'cache_dtype="auto"', 'kv_cache_size_tokens="1024"', 'num_cpu_blocks="None"'):  # fmt: skip
        assert all(label in line for line in info)
    assert 'engine="0"' in info[0] and 'engine="1"' in info[1]
    assert metric(text, "vllm:kv_cache_usage_perc") == 0.0
    e.held_blocks = 16
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25' in exposition("m", [e])


def test_sim_server_metrics_through_capacity_parser(tmp_path: Path) -> None:
    # 64 blocks of 16 tokens per engine: 1 MiB at 1,024 KV bytes per token
    flags = ["--block-size", str(BLOCK), "--kv-bytes-per-token", "1024", "--kv-cache-gib", str(1 / 1024),
             "--data-parallel-size", "2", "--decode-step-ms", "2"]  # fmt: skip
    with sim_server(tmp_path, *flags) as sim:
        text = get(f"{sim.url}/metrics")
        assert parse_capacity(text) == (128, BLOCK)
        assert parse_preemptions(text) == 0.0

        def one(i: int) -> tuple[int, dict]:
            prompt = [(i * 7919 + t) % 1000 + 1 for t in range(300)]
            return post(f"{sim.url}/v1/completions", {"prompt": prompt, "max_tokens": 200})

        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(one, range(8)))
        assert all(status == 200 for status, _ in replies)
        assert all(body["usage"]["completion_tokens"] == 200 for _, body in replies)
        text = get(f"{sim.url}/metrics")
        assert parse_preemptions(text) > 0
        assert parse_preemptions(text) == metric(text, "vllm:num_preemptions_total")
        assert metric(text, "vllm:generation_tokens_total") == 8 * 200
        assert metric(text, "vllm:kv_cache_usage_perc") == 0.0  # all done: nothing held
        # A request that could never fit one engine's KV cache is refused, not left to hang.
        status, body = post(f"{sim.url}/v1/completions", {"prompt": list(range(1, 1000)), "max_tokens": 100})
        assert status == 400 and "KV cache" in body["error"]["message"]


def test_a_continued_answer_equals_the_uninterrupted_one() -> None:
    """The engine's tokens are a function of the context: the prompt and the first k tokens of an
    answer, sent again as a prompt, go on with that answer's tokens from k (token for token)."""
    prompt = [(n * 37) % 500 + 3 for n in range(300)]
    whole = continuation(prompt, 64, VOCAB)
    for k in (0, 1, 5, 16, 17, 40):
        assert continuation([*prompt, *whole[:k]], 64 - k, VOCAB) == whole[k:], k
    assert continuation([5], 20, VOCAB) == continuation([5], 30, VOCAB)[:20]  # a prompt under the window
    assert len(set(whole)) > 16  # not a constant or a short cycle
