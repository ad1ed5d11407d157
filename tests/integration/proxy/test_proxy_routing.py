"""The proxy's routing policies against running simulator instances: `session` keeps a
conversation on one instance (the `user` field, or the `X-Session-Id` header over it) and spreads
conversations; `round-robin` turns whatever the load; the policy is named where it starts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .procs import Proc, completion, metric, pd_flags, post, proxy, sim

Launch = Callable[..., list[Proc]]


def served(instances: list[Proc]) -> list[float]:
    return [metric(m.url, "vllm:request_success_total", absent=0.0) for m in instances]


def delta(before: list[float], after: list[float]) -> list[int]:
    return [int(a - b) for a, b in zip(after, before, strict=True)]


def test_session_keeps_each_conversation_on_one_instance(launch: Launch, tmp_path: Path) -> None:
    mixed = [sim(tmp_path) for _ in range(3)]
    flags = [f for m in mixed for f in ("--instance", m.url)]
    px = proxy(tmp_path, "--mode", "mixed", *flags, "--routing", "session")
    launch(*mixed, px)
    assert "routing session" in px.log.read_text()
    url = px.url + "/v1/completions"
    homes: dict[str, int] = {}
    for user in ("ana", "bo", "cy", "di", "ed", "flo"):
        before = served(mixed)
        for turn in range(4):  # each turn a different prompt, as a conversation's are
            body = {**completion(2, prompt=[turn + 1] * (50 + turn)), "user": user}
            assert post(url, body)[0] == 200
        moved = delta(before, served(mixed))
        assert sorted(moved) == [0, 0, 4], (user, moved)  # every turn on one instance
        homes[user] = moved.index(4)
    assert len(set(homes.values())) >= 2, homes  # conversations spread
    # the header names the conversation over the body's user
    before = served(mixed)
    for turn in range(3):
        body = {**completion(2, prompt=[7] * 40), "user": f"someone-{turn}"}
        assert post(url, body, headers={"X-Session-Id": "ana"})[0] == 200
    assert delta(before, served(mixed))[homes["ana"]] == 3


def test_round_robin_turns_whatever_the_load(launch: Launch, tmp_path: Path) -> None:
    prefill, decode = [sim(tmp_path)], [sim(tmp_path), sim(tmp_path)]
    px = proxy(tmp_path, *pd_flags(prefill, decode), "--routing", "round-robin")
    launch(*prefill, *decode, px)
    before = served(decode)
    for i in range(6):
        assert post(px.url + "/v1/completions", completion(2, prompt=[i + 1] * 30))[0] == 200
    assert delta(before, served(decode)) == [3, 3]
