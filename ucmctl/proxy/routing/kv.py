"""`kv`: each leg to the instance of least expected time to first token, from where the prompt's
KV is: computing what neither the instance's own cache nor the store holds, loading what only
the store holds, and the prompts queued there ahead of it (sent, not answered yet: a stream
already answering is decode work, not prefill).

    expected = prefill_s * (tokens queued there + tokens to compute) + load_s * tokens to load

With the store, every instance can load every stored prefix, so missing the instance that
holds a prefix in its own cache costs a load, not a recompute: a busy holder loses to an idle
instance that loads. A decode leg (pd) costs its load; it goes among the decode instances
within 1.25x the average streams, so that a hot prefix does not pile every stream on one.

Where the KV is comes from the proxy's own routing history (kv_index: approximate). The two
speeds are measured from the deployment's own legs (each leg's time against what it computed
and loaded, a moving average); until a leg has measured one, a prior stands in for it, and
/routing says which.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ucmctl.core.routing_names import SUMMARIES
from ucmctl.proxy.kv_index import KvIndex, new_index
from ucmctl.proxy.pool import Instance, load_of
from ucmctl.proxy.routing.base import Ask, Policy
from ucmctl.proxy.routing.least_loaded import LeastLoaded

PRIOR_PREFILL_S = 1e-4  # s per token: 10k tokens/s, until a prefill is measured
PRIOR_LOAD_RATIO = 0.1  # a token loaded costs this much of one computed, until a load is measured
EWMA = 0.2  # the weight of a new measurement
BOUND = 1.25  # decode legs: candidates within this times the average streams


@dataclass
class Speed:
    """A cost per token, measured as a moving average (None: not measured yet)."""

    seconds_per_token: float | None = None
    samples: int = 0

    def add(self, sample: float) -> None:
        old = self.seconds_per_token
        self.seconds_per_token = sample if old is None else old + EWMA * (sample - old)
        self.samples += 1


class Guess(NamedTuple):  # a tuple: made for every candidate of every leg, 5x cheaper than a dataclass
    """What the policy expected of a leg on the instance it chose."""

    inst: Instance
    ahead: int  # prompt tokens of the legs queued there (sent, not answered yet)
    compute: int  # tokens neither its cache nor the store held
    load: int  # tokens only the store held
    local: int  # tokens the engine takes from its own cache (vLLM's local prefix-cache hits)
    external: int  # tokens it loads from the store (vLLM's external hits)


@dataclass
class Predicted:
    """What the policy expected of the legs an instance computed a prompt in (prefill, mixed),
    summed, against what the engine counts (vLLM's prefix-cache queries and hits)."""

    legs: int = 0
    prompt: int = 0  # prompt tokens
    local: int = 0
    external: int = 0


class Kv(Policy):
    name = "kv"
    summary = SUMMARIES["kv"]
    needs_blocks = True

    def __init__(self, block_size: int = 16, index: KvIndex | None = None, *, store: bool = True) -> None:
        self.index = new_index() if index is None else index  # the proxy's: its request path fills it
        self.block_size = block_size
        # False, an ablation: what only the store holds counts as computed (the store term's worth)
        self.store = store
        self.prefill = Speed()
        self.loading = Speed()
        self._by_load = LeastLoaded()
        self._next: dict[str, int] = {}
        self._guesses: OrderedDict[int, Guess] = OrderedDict()  # id(ask) -> the guess, until done
        self.predicted: dict[str, Predicted] = {}  # by instance URL

    def _seconds(self) -> tuple[float, float]:
        a = self.prefill.seconds_per_token or PRIOR_PREFILL_S
        b = self.loading.seconds_per_token
        return a, (b if b is not None else a * PRIOR_LOAD_RATIO)

    def _guess(self, inst: Instance, ask: Ask, held: int, stored: int) -> Guess:
        bs = self.block_size
        cached = max(held, stored) * bs
        compute = max(ask.tokens - cached, 0)
        load = max(stored - held, 0) * bs
        ahead = inst.waiting if ask.role != "decode" else 0  # prompts queued there, not answered yet
        # vLLM computes at least a prompt's last token: its hits are the whole blocks before it
        usable = max(ask.tokens - 1, 0) // bs * bs
        local = min(held * bs, usable)
        return Guess(inst, ahead, compute, load, local, min(cached, usable) - local)

    def choose(self, cands: Sequence[Instance], ask: Ask) -> Instance:
        if not ask.blocks:
            return self._by_load.choose(cands, ask)
        if ask.role == "decode":
            # consistent hashing's bound on loads: this stream included, within 1.25x the mean
            cap = math.ceil(BOUND * (sum(i.requests for i in cands) + 1) / len(cands))
            cands = [i for i in cands if i.requests + 1 <= cap] or list(cands)
        a, b = self._seconds()
        # scanned from a rotating start, so that equal costs are served round-robin
        start = self._next.get(ask.role, 0) % len(cands)
        turn = [*cands[start:], *cands[:start]]
        held, stored = self.index.leading(ask.blocks, turn)
        stored = stored if self.store else 0
        guesses = [self._guess(i, ask, h, stored) for i, h in zip(turn, held, strict=True)]
        k, best = min(
            enumerate(guesses),
            key=lambda kg: (
                a * (kg[1].ahead + kg[1].compute) + b * kg[1].load,
                load_of(kg[1].inst, ask.load),
            ),
        )
        self._next[ask.role] = start + k + 1
        self._guesses[id(ask)] = best
        while len(self._guesses) > 4096:  # legs that never came back (failed): forgotten
            self._guesses.popitem(last=False)
        return best.inst

    def done(self, inst: Instance, ask: Ask, seconds: float) -> None:
        """The speeds learn from the leg (the index learns from the request path)."""
        guess = self._guesses.pop(id(ask), None)
        if not ask.blocks or guess is None or guess.inst is not inst:
            return
        if ask.role != "decode":  # the leg that computed the prompt there
            p = self.predicted.setdefault(inst.url, Predicted())
            p.legs += 1
            p.prompt += ask.tokens
            p.local += guess.local
            p.external += guess.external
        a, _ = self._seconds()
        worked = guess.ahead + guess.compute
        if guess.load == 0 and worked >= self.block_size and ask.role != "decode":
            self.prefill.add(seconds / worked)
        elif guess.load >= self.block_size:
            self.loading.add(max(seconds - a * worked, 0.0) / guess.load)

    def describe(self) -> dict[str, object]:
        def speed(s: Speed, prior: float) -> dict[str, object]:
            measured = s.seconds_per_token is not None
            value = s.seconds_per_token if measured else prior
            return {"seconds_per_token": value, "measured": measured, "samples": s.samples}

        a, b = self._seconds()
        return {
            "policy": self.name if self.store else f"{self.name} (without the store term)",
            "index": "approximate (the proxy's routing history)",
            "blocks": len(self.index),
            "block_size": self.block_size,
            "prefill": speed(self.prefill, a),
            "load": speed(self.loading, b),
            "predicted": {url: vars(p).copy() for url, p in self.predicted.items()},
        }
