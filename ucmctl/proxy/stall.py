"""Instances that stopped generating: alive to the kernel (their sockets open, their /health
perhaps answering, as a vLLM's API server does while its engine hangs on its device, or a node
cut off the network without a reset) but sending no token.

An instance streaming answers has stalled when none of its streams brought a byte for the stall
timeout: a decode step takes milliseconds and a step that also prefills a chunk seconds at most,
so a streaming engine that is silent far longer has stopped stepping. It goes out of routing and
every answer it streams is cut there: each goes on on another instance where it can (flow's
migration, as after a failure) or ends with an error that says why; the requests still waiting
for its first token are sent to another instance (nothing of them reached a client). Without
this, those answers wait for the read timeout (minutes).

It comes back into routing when it answers a one-token completion: its /health answering is not
enough (a hung engine's API server still answers it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from ucmctl.proxy.pool import Instance, Pool

log = logging.getLogger("ucmctl.proxy")

TICK_S = 1.0  # the watch looks this often at most (a quarter of the timeout where that is shorter)
PROBE_PROMPT = "ping"


def stalled(inst: Instance, now: float, timeout: float) -> bool:
    """Whether `inst` streams answers and none of them brought a byte for `timeout` seconds."""
    return bool(inst.streams) and not inst.stalled and now - inst.output_at > timeout


def cut_off(inst: Instance, timeout: float) -> int:
    """Take a stalled instance out of routing and cut every answer it streams and every request
    waiting for its first token there; how many were cut."""
    inst.stalled = True
    inst.stalls_total += 1
    legs, waiting = list(inst.streams), list(inst.first_waits)
    log.warning(
        "instance %s (%s) sent no token for %g s while streaming %d answer(s): out of routing until "
        "it answers a completion; its answers go on elsewhere",
        inst.url,
        inst.role,
        timeout,
        len(legs),
    )
    for leg in legs:
        leg.cut("stall")
    for wait in waiting:  # nothing of these went to a client: tried on another instance
        wait.close()
    return len(legs) + len(waiting)


async def probe(session: aiohttp.ClientSession, inst: Instance, model: str | None, timeout: float) -> bool:
    """True when `inst` answers a one-token completion within `timeout` seconds: it steps."""
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError):
        limit = aiohttp.ClientTimeout(total=timeout)
        if model is None:  # the model it serves, as it says
            async with session.get(inst.endpoint("/v1/models"), timeout=limit) as r:
                model = str((await r.json())["data"][0]["id"])
        body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
        async with session.post(inst.endpoint("/v1/completions"), json=body, timeout=limit) as r:
            return r.status == 200 and bool((await r.json()).get("choices"))
    return False


async def stall_loop(
    session: aiohttp.ClientSession, pool: Pool, *, timeout: float, model: str | None
) -> None:
    """Watch every instance's streams until cancelled: cut off the stalled ones, and bring them
    back once they answer a probe (one probe at a time per instance)."""
    probes: dict[Instance, asyncio.Task[bool]] = {}
    tick = min(TICK_S, timeout / 4)
    try:
        while True:
            await asyncio.sleep(tick)
            now = asyncio.get_running_loop().time()
            for inst in pool.all():
                if stalled(inst, now, timeout):
                    cut_off(inst, timeout)
                if inst.stalled:
                    _probe(session, inst, model, timeout, probes)
            for inst in [i for i in probes if i.removed]:
                probes.pop(inst).cancel()
    finally:
        for task in probes.values():
            task.cancel()


def _probe(
    session: aiohttp.ClientSession,
    inst: Instance,
    model: str | None,
    timeout: float,
    probes: dict[Instance, asyncio.Task[bool]],
) -> None:
    """Start a probe of a stalled instance, or read the one that ended: back into routing when
    it answered."""
    task = probes.get(inst)
    if task is None:
        probes[inst] = asyncio.create_task(probe(session, inst, model, timeout))
        return
    if not task.done():
        return
    del probes[inst]
    if task.result():
        inst.stalled = False
        inst.output_at = asyncio.get_running_loop().time()
        inst.cache_lost()  # it may have been restarted meanwhile
        log.warning("instance %s (%s) answers a completion again: back in routing", inst.url, inst.role)
