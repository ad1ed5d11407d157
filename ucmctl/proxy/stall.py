"""Instances that stopped generating: alive to the kernel (their sockets open, their /health
perhaps answering, as a vLLM's API server does while its engine hangs on its device, or a node
cut off the network without a reset) but sending nothing.

An instance streaming answers has stalled when none of its streams brought a byte for the stall
timeout: a decode step takes milliseconds and a step that also prefills a chunk seconds at most,
so a streaming engine silent far longer has stopped stepping. An instance with requests waiting
for their first bytes and nothing from it for as long is only suspected (one long prompt may
take that long to prefill): it is asked for a one-token completion, and has stalled when that
does not come within the timeout either. A working engine may queue that token behind the prompt
it computes, so a prompt that takes longer than twice the timeout to prefill, alone on its
instance, looks the same (the topology's `stall_timeout` says to raise it then).

A stalled instance goes out of routing and everything waiting on it is cut: each answer it
streams goes on on another instance where it can (flow's migration, as after a failure) or ends
with an error that says why; each request waiting for its first bytes goes to another instance
(nothing of it reached a client). Without this they wait for the read timeout (minutes). It
comes back into routing when it answers a one-token completion: its /health answering is not
enough (a hung engine's API server still answers it).
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from ucmctl.proxy.health import log
from ucmctl.proxy.pool import Instance, Pool

TICK_S = 1.0  # the watch looks this often at most (a quarter of the timeout where that is shorter)
PAUSED_S = 1.0  # a look this much later than due: the proxy itself did not run (paused, starved)
PROBE_PROMPT = "ping"
Probes = dict[Instance, asyncio.Task[bool]]


def stalled(inst: Instance, now: float, timeout: float) -> bool:
    """Whether `inst` streams answers and none of them brought a byte for `timeout` seconds, none
    held by a client slow to take its last bytes (the relay reads nothing from it meanwhile)."""
    if not inst.streams or inst.stalled or now - inst.output_at <= timeout:
        return False
    return not any(leg.client_slow() for leg in inst.streams)


def suspected(inst: Instance, now: float, timeout: float) -> bool:
    """Whether requests wait on `inst` for their first bytes and nothing came from it since the
    oldest began, for `timeout` seconds (it may be prefilling a long prompt: a probe decides)."""
    if inst.stalled or not inst.first_waits:
        return False
    return now - max(inst.output_at, min(inst.first_waits.values())) > timeout


def cut_off(inst: Instance, timeout: float, why: str = "streamed") -> int:
    """Take a stalled instance out of routing and cut every answer it streams and every request
    waiting for its first bytes there; how many were cut."""
    inst.stalled = True
    inst.stalls_total += 1
    legs, waiting = list(inst.streams), list(inst.first_waits)
    log.warning(
        "instance %s (%s) %s nothing for %g s (%d answer(s) streaming, %d waiting): out of routing "
        "until it answers a completion; they go on elsewhere",
        inst.url,
        inst.role,
        why,
        timeout,
        len(legs),
        len(waiting),
    )
    for leg in legs:
        leg.cut("stall")
    for wait in waiting:  # nothing of these went to a client: tried on another instance
        wait.close()
    return len(legs) + len(waiting)


async def probe(
    session: aiohttp.ClientSession, inst: Instance, model: str | None, timeout: float, headers: dict[str, str]
) -> bool:
    """True when `inst` answers a one-token completion within `timeout` seconds: it steps.
    `headers`: the proxy's to its instances (an API key of theirs)."""
    errors = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError, IndexError, TypeError)
    with contextlib.suppress(*errors):
        limit = aiohttp.ClientTimeout(total=timeout)
        if model is None:  # the model it serves, as it says
            async with session.get(inst.endpoint("/v1/models"), headers=headers, timeout=limit) as r:
                model = str((await r.json())["data"][0]["id"])
        body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
        async with session.post(
            inst.endpoint("/v1/completions"), json=body, headers=headers, timeout=limit
        ) as r:
            return r.status == 200 and bool((await r.json()).get("choices"))
    return False


async def stall_loop(
    session: aiohttp.ClientSession, pool: Pool, *, timeout: float, model: str | None, headers: dict[str, str]
) -> None:
    """Watch every instance until cancelled: cut off the stalled ones (probing the suspected
    first), and bring them back once they answer a probe (one probe at a time per instance)."""
    probes: Probes = {}
    tick = min(TICK_S, timeout / 4)
    loop = asyncio.get_running_loop()
    last = loop.time()
    try:
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            if now - last > tick + PAUSED_S:  # a silence the proxy did not hear is no instance's
                for inst in pool.all():
                    inst.output_at = max(inst.output_at, now)
            last = now
            for inst in pool.all():
                if stalled(inst, now, timeout):
                    cut_off(inst, timeout)
                if inst.stalled or suspected(inst, now, timeout) or inst in probes:
                    _probe(session, inst, model, timeout, headers, probes)
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
    headers: dict[str, str],
    probes: Probes,
) -> None:
    """Start a probe of a stalled or suspected instance, or read the one that ended: a stalled
    one that answered comes back into routing; a suspected one that did not is cut off."""
    task = probes.get(inst)
    if task is None:
        probes[inst] = asyncio.create_task(probe(session, inst, model, timeout, headers))
        return
    if not task.done():
        return
    del probes[inst]
    now = asyncio.get_running_loop().time()
    answered = task.result()
    if inst.stalled and answered:
        inst.stalled = False
        inst.output_at = now
        inst.cache_lost()  # it may have been restarted meanwhile
        log.warning("instance %s (%s) answers a completion again: back in routing", inst.url, inst.role)
    elif not inst.stalled and answered:
        inst.output_at = now  # it steps: what waits there is a long prefill
    elif not inst.stalled and suspected(inst, now, timeout):  # nothing came, not even a token
        cut_off(inst, 2 * timeout, "answered")
