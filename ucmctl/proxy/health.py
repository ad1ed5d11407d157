"""Instance health: a background check, and the passive marks that the request path leaves."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from ucmctl.proxy.pool import Instance, Pool

log = logging.getLogger("ucmctl.proxy")


def record_success(inst: Instance) -> None:
    """The instance answered: back into routing if it was out."""
    inst.consecutive_failures = 0
    if not inst.healthy and not inst.removed:
        inst.healthy = True
        inst.cache_lost()  # it may have restarted
        log.warning("instance %s (%s) is back in routing", inst.url, inst.role)


def record_failure(inst: Instance, unhealthy_after: int, *, refused: bool = False) -> None:
    """The instance failed; out of routing after `unhealthy_after` in a row, at once when it refused."""
    inst.consecutive_failures += 1
    inst.failures_total += 1
    # a refused connection means nothing listens there: waiting for more failures only loses requests
    if inst.healthy and (refused or inst.consecutive_failures >= unhealthy_after):
        inst.healthy = False
        log.warning(
            "instance %s (%s) is out of routing after %d failure(s)",
            inst.url,
            inst.role,
            inst.consecutive_failures,
        )


async def check(session: aiohttp.ClientSession, inst: Instance, timeout: float) -> bool:
    """True when the instance's /health answers 200 within `timeout` seconds."""
    try:
        async with session.get(inst.endpoint("/health"), timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            await r.read()
            return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


async def check_all(session: aiohttp.ClientSession, pool: Pool, timeout: float, unhealthy_after: int) -> None:
    """Check every instance at once and update its state."""
    insts = pool.all()
    results = await asyncio.gather(*(check(session, i, timeout) for i in insts))
    for inst, ok in zip(insts, results, strict=True):
        if ok:
            record_success(inst)
        else:
            record_failure(inst, unhealthy_after)


async def health_loop(
    session: aiohttp.ClientSession, pool: Pool, *, interval: float, timeout: float, unhealthy_after: int
) -> None:
    """Check all instances every `interval` seconds until cancelled."""
    while True:
        try:
            await check_all(session, pool, timeout, unhealthy_after)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not stop health checking for good
            log.exception("health check round failed")
        await asyncio.sleep(interval)
