"""The multi-turn workload (multi-round QA): U users x R rounds over one shared system prompt.

Round r of user u sends the system prompt, that user's whole history (every earlier question
and the answer the server actually returned, as token ids) and a new question; the answer is
kept for the next round. A round's requests go out at the request rate (all at once when
infinite) with at most `concurrency` in flight (default: one per user); the next round starts
when every answer of this one is in, so each round's hit rates are exact counter deltas.

Each round reports TTFT/TPOT/E2EL, the measured hit rates, and the ideal hit rate of an
unbounded cache, computed from the workload's own token stream (`reuse.ReuseTracker`): the
prompts in the order they were sent and the answers as they came back.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import TYPE_CHECKING

from ucmctl.bench import client, goodput, hitrate, metrics, prompts
from ucmctl.bench.results import Cell, ErrorCount, Phase
from ucmctl.bench.reuse import ReuseTracker
from ucmctl.bench.runner import BenchConfig, NoProgress, Progress, Target, measure, phase_of

if TYPE_CHECKING:
    from ucmctl.bench.workloads.multi_turn.spec import MultiTurnSpec


def _question(cfg: BenchConfig, spec: MultiTurnSpec, user: int, round_: int, stream: int) -> list[int]:
    return prompts.prompt_ids(
        cfg.seed, 1 + user * spec.rounds + round_, spec.question_tokens, cfg.vocab, stream
    )


async def run_multi_turn(
    cfg: BenchConfig, spec: MultiTurnSpec, target: Target, progress: Progress | None = None
) -> list[Cell]:
    """One cell per round, then one for rounds 2..R together (when R > 1)."""
    progress = progress or NoProgress()
    stream = cfg.stream_base
    concurrency = cfg.concurrency if cfg.concurrency else spec.users
    cfg = BenchConfig(**{**cfg.__dict__, "concurrency": min(concurrency, spec.users)})
    system = (
        prompts.prompt_ids(cfg.seed, 0, spec.system_tokens, cfg.vocab, stream) if spec.system_tokens else []
    )
    history: list[list[int]] = [[] for _ in range(spec.users)]
    alive = [True] * spec.users
    ideal = ReuseTracker(cfg.block_size)
    digest = hashlib.sha256()
    cells: list[Cell] = []
    async with client.session(cfg.concurrency, cfg.timeout_s) as http:
        for r in range(spec.rounds):
            users = [u for u in range(spec.users) if alive[u]]
            lost = spec.users - len(users)
            asked = [system + history[u] + _question(cfg, spec, u, r, stream) for u in users]
            reusable = 0
            for p in asked:  # in the order they are sent: a prompt sent earlier is cached first
                reusable += ideal.reusable(p)
                ideal.add(p)
                digest.update(len(p).to_bytes(4, "little") + array("q", p).tobytes())
            bodies = [  # each conversation its OpenAI `user`, as a chat client sends it
                client.make_body(
                    p,
                    cfg.output_len,
                    cfg.model,
                    cfg.ignore_eos,
                    cfg.temperature,
                    True,
                    cfg.cache_salt,
                    user=f"ucmctl-bench-{cfg.seed}-{stream}-{u}",
                )
                for u, p in zip(users, asked, strict=True)
            ]
            phase = await measure(
                http,
                cfg,
                target,
                f"round {r + 1}/{spec.rounds}",
                bodies,
                [len(p) for p in asked],
                progress,
                collect_tokens=True,
            )
            for u, p, res in zip(users, asked, phase.requests(), strict=True):
                if res.ok and res.token_ids is not None:
                    history[u] = p[len(system) :] + res.token_ids
                    ideal.add(p + res.token_ids[:-1])  # the last answer token's KV is never computed
                else:
                    alive[u] = False  # no answer: this user's conversation cannot go on
            total = sum(len(p) for p in asked)
            phase.input_len = round(total / len(asked)) if asked else 0
            phase.output_len = cfg.output_len
            phase.put("users_lost", lost)
            if lost:
                phase.failed += lost
                phase.errors = [
                    *phase.errors,
                    ErrorCount(error="an earlier round of this user failed", count=lost),
                ]
            cells.append(_round_cell(spec, r, stream, phase, reusable, total))
    if len(cells) > 1:
        cells.append(_later_rounds(cells[1:], cfg))
    for cell in cells:
        cell.prompts_digest = digest.hexdigest()[:16]
    cells[-1].primary = True
    return cells


def _round_cell(spec: MultiTurnSpec, r: int, stream: int, phase: Phase, reusable: int, total: int) -> Cell:
    """The cell of round r + 1: its measurement and the ideal hit rate of its prompts."""
    return Cell(
        workload=spec.kind,
        label=f"round {r + 1}",
        round=r + 1,
        input_len=phase.input_len,
        repeat=0,
        stream=stream,
        preseed=None,
        measure=phase,
        ideal_hit_rate=reusable / total if total else None,
        ideal_reused_tokens=reusable,
        ideal_total_tokens=total,
    )


def _later_rounds(cells: list[Cell], cfg: BenchConfig) -> Cell:
    """Rounds 2..R as one measurement: every request of them, over their summed wall time."""
    phases = [c.measure for c in cells if c.measure is not None]
    results = [r for p in phases for r in p.requests()]
    duration = sum(p.duration or 0 for p in phases)
    summary = metrics.summarize(results, duration)
    lost = sum(p.value("users_lost") for p in phases)
    summary["failed"] += lost
    if cfg.goodput:
        summary.update(goodput.goodput_fields(results, duration, cfg.goodput))
    summary["num_prompts"] = len(results) + lost
    summary["hit_rate"] = hitrate.merge([p.hit_rates() for p in phases])
    summary["input_len"] = round(sum(r.prompt_len for r in results) / len(results)) if results else 0
    summary["output_len"] = phases[0].output_len
    phase = phase_of(summary, results)
    reused = sum(c.ideal_reused_tokens or 0 for c in cells)
    total = sum(c.ideal_total_tokens or 0 for c in cells)
    first, last = cells[0].round, cells[-1].round
    return Cell(
        workload=cells[0].workload,
        label=f"rounds {first}-{last}",
        round=None,
        aggregate=True,
        input_len=phase.input_len,
        repeat=0,
        stream=cells[0].stream,
        preseed=None,
        measure=phase,
        ideal_hit_rate=reused / total if total else None,
        ideal_reused_tokens=reused,
        ideal_total_tokens=total,
    )
