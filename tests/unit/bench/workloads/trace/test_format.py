from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from ucmctl.bench.workloads.trace.format import (
    BLOCK_TOKENS,
    SESSION_CAP,
    IdealHits,
    TraceRequest,
    ideal_hits,
    load_trace,
    make_trace,
    prompt_ids,
    send_schedule,
    write_trace,
)
from ucmctl.core.errors import ExitStatus, UcmctlError

# Six requests; blocks of 512 tokens. Expected reuse worked out by hand below.
HAND = """\
{"timestamp": 0, "input_length": 1300, "output_length": 20, "hash_ids": [1, 2, 3]}
{"timestamp": 10, "input_length": 1100, "output_length": 20, "hash_ids": [1, 2, 4]}

{"timestamp": 20, "input_length": 1700, "output_length": 20, "hash_ids": [1, 2, 3, 5]}
{"timestamp": 30.5, "input_length": 1040, "output_length": 20, "hash_ids": [1, 2, 3]}
{"timestamp": 40, "input_length": 1200, "output_length": 20, "hash_ids": [7, 2, 3]}
{"timestamp": 50, "input_length": 100, "output_length": 20, "hash_ids": [1]}
"""
# 1: nothing earlier                                                     -> 0
# 2: [1] 512 + [1,2] 512; [1,2,4] is new                                 -> 1024
# 3: 512 + 512 + [1,2,3] only 276 tokens long in request 1, walk stops   -> 1300, floor 16 -> 1296
#    (block size 1: 1300; 256: 1280)
# 4: 512 + 512 + 16 (request 3 had [1,2,3] whole) = 1040 = input_length;
#    cap at 1039 -> floor 16 -> 1024                                     (1: 1039; 256: 1024)
# 5: [7] was never a first block: prefix semantics, nothing reused       -> 0
# 6: [1] covers 100 of 100; cap 99 -> floor 16 -> 96                     (1: 99; 256: 0)
TOTAL = 1300 + 1100 + 1700 + 1040 + 1200 + 100


def write(tmp_path: Path, text: str, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_hand_trace(tmp_path: Path) -> None:
    reqs = load_trace(write(tmp_path, HAND))
    assert [r.line for r in reqs] == [1, 2, 4, 5, 6, 7]  # the blank line 3 is skipped, still counted
    assert reqs[0] == TraceRequest(1, 0.0, 1300, 20, (1, 2, 3))
    assert reqs[3].timestamp_ms == 30.5


@pytest.mark.parametrize(
    ("block_size", "expected"),
    [
        (16, (0, 1024, 1296, 1024, 0, 96)),
        (1, (0, 1024, 1300, 1039, 0, 99)),
        (256, (0, 1024, 1280, 1024, 0, 0)),
    ],
)
def test_ideal_hits_by_hand(tmp_path: Path, block_size: int, expected: tuple[int, ...]) -> None:
    hits = ideal_hits(load_trace(write(tmp_path, HAND)), block_size=block_size)
    assert hits.per_request == expected
    assert hits.reused_tokens == sum(expected)
    assert hits.total_tokens == TOTAL
    assert hits.ratio == pytest.approx(sum(expected) / TOTAL)


def test_ideal_hits_counts_in_timestamp_order_and_empty() -> None:
    later = TraceRequest(1, 100.0, 1024, 1, (5, 6))
    earlier = TraceRequest(2, 0.0, 1024, 1, (5, 6))
    assert ideal_hits([later, earlier]).per_request == (1008, 0)  # per_request follows the input
    assert ideal_hits([]) == IdealHits(0, 0, ())
    assert IdealHits(0, 0, ()).ratio is None


def test_unsorted_file_is_sorted_stably(tmp_path: Path) -> None:
    text = "\n".join(
        json.dumps({"timestamp": t, "input_length": 1, "output_length": 1, "hash_ids": [h]})
        for t, h in [(5, 0), (1, 1), (5, 2), (0, 3)]
    )
    reqs = load_trace(write(tmp_path, text))
    assert [(r.timestamp_ms, r.hash_ids[0], r.line) for r in reqs] == [
        (0.0, 3, 4),
        (1.0, 1, 2),
        (5.0, 0, 1),
        (5.0, 2, 3),
    ]


def test_no_timestamps_anywhere_means_back_to_back(tmp_path: Path) -> None:
    text = '{"input_length": 5, "output_length": 1, "hash_ids": [0]}\n' * 3
    reqs = load_trace(write(tmp_path, text))
    assert [r.timestamp_ms for r in reqs] == [0.0, 0.0, 0.0]
    assert send_schedule(reqs, None) == [0.0, 0.0, 0.0]


def test_other_block_tokens(tmp_path: Path) -> None:
    text = '{"timestamp": 0, "input_length": 33, "output_length": 1, "hash_ids": [0, 1, 2]}\n'
    assert load_trace(write(tmp_path, text), block_tokens=16)[0].input_length == 33
    with pytest.raises(UcmctlError, match="between 1025 and 1536"):
        load_trace(write(tmp_path, text))


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object, found a list"),
        ("42", "found a number"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 5}', "hash_ids: missing"),
        ('{"timestamp": 1, "output_length": 5, "hash_ids": [0, 1]}', "input_length: missing"),
        ('{"timestamp": 1, "input_length": 600, "hash_ids": [0, 1]}', "output_length: missing"),
        ('{"input_length": 600, "output_length": 5, "hash_ids": [0, 1]}', "has no timestamp but line 1"),
        ('{"timestamp": -1, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}', "ms >= 0"),
        ('{"timestamp": "0", "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}', "ms >= 0"),
        ('{"timestamp": true, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}', "ms >= 0"),
        ('{"timestamp": NaN, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}', "ms >= 0"),
        ('{"timestamp": 1, "input_length": 600.0, "output_length": 5, "hash_ids": [0, 1]}', "integer >= 1"),
        ('{"timestamp": 1, "input_length": -600, "output_length": 5, "hash_ids": [0, 1]}', "integer >= 1"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 0, "hash_ids": [0, 1]}', "output_length"),
        ('{"timestamp": 1, "input_length": 600, "output_length": true, "hash_ids": [0, 1]}', "integer"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": []}', "non-empty list"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, -1]}', "integers >= 0"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, true]}', "integers"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, 1.5]}', "integers"),
        ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": "0 1"}', "list"),
        (
            '{"timestamp": 1, "input_length": 1025, "output_length": 5, "hash_ids": [0, 1]}',
            "between 513 and 1024",
        ),
        (
            '{"timestamp": 1, "input_length": 512, "output_length": 5, "hash_ids": [0, 1]}',
            "between 513 and 1024",
        ),
    ],
)
def test_bad_line_is_reported_once_with_its_number(tmp_path: Path, bad: str, needle: str) -> None:
    # good line, blank line, the bad line (line 3), then another bad line that must not be the one reported
    path = write(tmp_path, f"{GOOD}\n\n{bad}\n[]\n")
    with pytest.raises(UcmctlError) as info:
        load_trace(path)
    err = info.value
    assert err.status == ExitStatus.BAD_INPUT == 2
    assert len(err.problems) == 1
    problem = err.problems[0]
    assert (problem.file, problem.line) == (str(path), 3)
    text = str(err)
    assert "\n" not in text
    assert text.startswith(f"{path}:3")
    assert needle in text
    assert problem.fix  # says what to do


def test_timestamp_present_after_lines_without(tmp_path: Path) -> None:
    path = write(tmp_path, '{"input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n' + GOOD + "\n")
    with pytest.raises(UcmctlError, match="has a timestamp but line 1 has none") as info:
        load_trace(path)
    assert info.value.problems[0].line == 2


def test_not_utf8_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(UcmctlError, match="UTF-8") as info:
        load_trace(path)
    assert info.value.problems[0].line == 2


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_trace(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UcmctlError, match="no requests") as info:
        load_trace(path)
    assert info.value.status == 2 and info.value.problems[0].file == str(path)
    assert "\n" not in str(info.value)


def test_missing_or_unreadable_file(tmp_path: Path) -> None:
    for path in (tmp_path / "nope.jsonl", tmp_path):
        with pytest.raises(UcmctlError, match="cannot read the trace") as info:
            load_trace(path)
        assert info.value.status == 2 and info.value.problems[0].file == str(path)
        assert "\n" not in str(info.value)


def req(ids: tuple[int, ...], length: int) -> TraceRequest:
    return TraceRequest(1, 0.0, length, 1, ids)


def test_prompt_ids_blocks_follow_hash_ids() -> None:
    a = prompt_ids(req((3, 4, 5), 1100), seed=1, stream=0, vocab=1000)
    assert len(a) == 1100
    assert a == prompt_ids(req((3, 4, 5), 1100), seed=1, stream=0, vocab=1000)  # deterministic
    b = prompt_ids(req((9, 4, 3), 1536), seed=1, stream=0, vocab=1000)
    # the same id is the same tokens wherever it sits
    assert b[512:1024] == a[512:1024]  # id 4, block 1 in both
    assert b[1024:1536] == a[:512]  # id 3: block 0 of a, block 2 of b
    assert b[:512] != a[:512]
    # a partial last block is a prefix of the id's whole block
    c = prompt_ids(req((5,), 76), seed=1, stream=0, vocab=1000)
    assert c == a[1024:1100]
    assert len(prompt_ids(req((5, 6), 513), seed=1, stream=0, vocab=1000)) == 513


def test_prompt_ids_seed_and_stream_change_every_block() -> None:
    r = req((0, 1, 2, 2**40 + 7), 2048)
    base = prompt_ids(r, seed=1, stream=0, vocab=5000)
    for other in (
        prompt_ids(r, seed=1, stream=1, vocab=5000),
        prompt_ids(r, seed=2, stream=0, vocab=5000),
    ):
        for k in range(4):
            block, other_block = base[k * 512 : (k + 1) * 512], other[k * 512 : (k + 1) * 512]
            assert sum(x == y for x, y in zip(block, other_block, strict=True)) < 20  # chance matches only


def test_prompt_ids_stay_in_vocab() -> None:
    ids = prompt_ids(req(tuple(range(20)), 20 * 512), seed=5, stream=3, vocab=300, first_id=10)
    assert min(ids) >= 10 and max(ids) < 300
    assert len(set(ids)) == 290  # every allowed id shows up in 10240 draws
    ids = prompt_ids(req((1,), 512), seed=5, stream=3, vocab=300, first_id=100)
    assert min(ids) >= 100
    with pytest.raises(UcmctlError, match="--vocab"):
        prompt_ids(req((1,), 10), seed=0, stream=0, vocab=100)


def test_prompt_ids_refuses_too_few_hash_ids() -> None:
    with pytest.raises(UcmctlError, match="between 1 and 512"):
        prompt_ids(req((1,), 513), seed=0, stream=0, vocab=1000)


def blocks_of(r: TraceRequest) -> int:
    return -(-r.input_length // BLOCK_TOKENS)


def common(**kw: object) -> dict[str, object]:
    args: dict[str, object] = {
        "requests": 400,
        "rate": None,
        "input_len": 4096,
        "output_len": 100,
        "pattern": "unique",
        "groups": 4,
        "shared_fraction": 0.5,
        "seed": 3,
    }
    args.update(kw)
    return args


def test_make_trace_is_deterministic_and_consistent() -> None:
    for pattern in ("unique", "shared-prefix", "sessions"):
        reqs = make_trace(**common(pattern=pattern, rate=2.0))  # type: ignore[arg-type]
        assert reqs == make_trace(**common(pattern=pattern, rate=2.0))  # type: ignore[arg-type]
        assert reqs != make_trace(**common(pattern=pattern, rate=2.0, seed=4))  # type: ignore[arg-type]
        for r in reqs:
            assert len(r.hash_ids) == blocks_of(r)
            assert 50 <= r.output_length <= 150
        if pattern != "sessions":
            assert all(2048 <= r.input_length <= 6144 for r in reqs)


def test_make_trace_unique_has_no_reuse() -> None:
    reqs = make_trace(**common(pattern="unique"))  # type: ignore[arg-type]
    ids = [h for r in reqs for h in r.hash_ids]
    assert len(ids) == len(set(ids))
    hits = ideal_hits(reqs)
    assert hits.reused_tokens == 0 and hits.ratio == 0.0


def test_make_trace_shared_prefix_one_group_half() -> None:
    reqs = make_trace(**common(pattern="shared-prefix", groups=1))  # type: ignore[arg-type]
    hits = ideal_hits(reqs)
    longest_shared = 0
    for i, r in enumerate(reqs):
        shared = round(0.5 * r.input_length / BLOCK_TOKENS)
        # the first `shared` ids are the group's run: the same for every request
        assert r.hash_ids[:shared] == tuple(range(shared))
        assert all(h >= 12 for h in r.hash_ids[shared:])  # fresh ids come after the run of 12
        # a shared part within half a block of half the prompt
        assert abs(shared * BLOCK_TOKENS - r.input_length / 2) <= BLOCK_TOKENS / 2
        # reuse: the shared blocks that an earlier request already had, no more
        assert hits.per_request[i] == min(shared, longest_shared) * BLOCK_TOKENS
        if i == 0:
            assert hits.per_request[0] == 0
        longest_shared = max(longest_shared, shared)
    later = hits.per_request[20:]
    ratio = sum(later) / sum(r.input_length for r in reqs[20:])
    assert 0.45 < ratio < 0.55


def test_make_trace_shared_prefix_groups_do_not_share() -> None:
    reqs = make_trace(**common(pattern="shared-prefix", groups=3, shared_fraction=1.0))  # type: ignore[arg-type]
    firsts = {r.hash_ids[0] for r in reqs}
    assert len(firsts) == 3  # one run per group, every request picks one
    hits = ideal_hits(reqs)
    assert 0.85 < hits.ratio < 1.0  # type: ignore[operator]
    none = make_trace(**common(pattern="shared-prefix", shared_fraction=0.0))  # type: ignore[arg-type]
    assert ideal_hits(none).reused_tokens == 0


def test_make_trace_sessions_reuse_the_previous_turn() -> None:
    reqs = make_trace(**common(pattern="sessions", groups=8, shared_fraction=0.75))  # type: ignore[arg-type]
    hits = ideal_hits(reqs)
    last: dict[int, TraceRequest] = {}  # each conversation's latest turn, by its first hash id
    resets = 0
    for i, r in enumerate(reqs):
        assert r.input_length <= SESSION_CAP * 4096
        prev = last.get(r.hash_ids[0])
        if prev is None:
            resets += 1
            assert hits.per_request[i] == 0
        else:
            # the whole previous turn's ids, then fresh ones; the previous partial block is full context
            assert r.hash_ids[: len(prev.hash_ids)] == prev.hash_ids
            assert r.input_length > len(prev.hash_ids) * BLOCK_TOKENS
            assert hits.per_request[i] == prev.input_length - prev.input_length % 16
        last[r.hash_ids[0]] = r
    assert resets > 8  # conversations hit the cap and start over
    assert hits.ratio is not None and hits.ratio > 0.8


def test_write_then_load_round_trip(tmp_path: Path) -> None:
    reqs = make_trace(**common(pattern="sessions", rate=5.0, requests=50))  # type: ignore[arg-type]
    path = tmp_path / "out.jsonl"
    write_trace(reqs, path)
    assert load_trace(path) == reqs
    lines = path.read_text().splitlines()
    for line in lines[:5]:
        obj = json.loads(line)
        assert list(obj) == ["timestamp", "input_length", "output_length", "hash_ids"]
        assert isinstance(obj["timestamp"], int)  # whole ms are written as integers
        assert line.startswith('{"timestamp": ')
    half = [TraceRequest(1, 1.5, 1, 1, (0,))]
    write_trace(half, path)
    assert path.read_text() == '{"timestamp": 1.5, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n'
    assert load_trace(path) == half


def test_poisson_arrivals() -> None:
    reqs = make_trace(**common(requests=2000, rate=10.0))  # type: ignore[arg-type]
    stamps = [r.timestamp_ms for r in reqs]
    assert stamps[0] == 0.0
    assert all(a <= b for a, b in itertools.pairwise(stamps))
    assert all(t == int(t) for t in stamps)
    rate = (len(stamps) - 1) / (stamps[-1] / 1000)
    assert 9.0 < rate < 11.0
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    # exponential gaps: about 1 - e^-1 = 63% are shorter than the mean
    assert 0.58 < sum(g < 100 for g in gaps) / len(gaps) < 0.68
    assert all(r.timestamp_ms == 0.0 for r in make_trace(**common(rate=None)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"requests": 0}, "--requests"),
        ({"rate": 0.0}, "--rate"),
        ({"rate": -1.0}, "--rate"),
        ({"input_len": 0}, "--input-len"),
        ({"output_len": 0}, "--output-len"),
        ({"groups": 0}, "--groups"),
        ({"shared_fraction": 1.5}, "--shared-fraction"),
        ({"shared_fraction": -0.1}, "--shared-fraction"),
        ({"pattern": "zipf"}, "--pattern"),
    ],
)
def test_make_trace_validates(change: dict[str, object], key: str) -> None:
    with pytest.raises(UcmctlError) as info:
        make_trace(**common(**change))  # type: ignore[arg-type]
    assert info.value.status == 2 and info.value.problems[0].key == key
    assert "\n" not in str(info.value)


def test_send_schedule() -> None:
    reqs = [TraceRequest(i + 1, t, 1, 1, (0,)) for i, t in enumerate([1000.0, 1500.0, 4000.0])]
    assert send_schedule(reqs, 1.0) == [0.0, 0.5, 3.0]
    assert send_schedule(reqs, 2.0) == [0.0, 0.25, 1.5]
    assert send_schedule(reqs, None) == [0.0, 0.0, 0.0]
    assert send_schedule([], 1.0) == []
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(UcmctlError) as info:
            send_schedule(reqs, bad)
        assert info.value.problems[0].key == "--speedup" and info.value.status == 2
