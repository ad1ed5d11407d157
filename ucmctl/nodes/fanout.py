"""Fan-out: the same work on many nodes or processes at once, one thread each."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Set on Ctrl-C so that threads waiting for health give up at once.
cancelled = threading.Event()


def parallel(items: Iterable[T], work: Callable[[T], R]) -> list[R]:
    """`work` on every item at once (processes, nodes); Ctrl-C also stops health waits.

    One thread per item: the work waits on nodes (SSH, health), and a cap would make item 33
    wait for another item's whole health gate before its own start."""
    items = list(items)
    if not items:
        return []
    pool = ThreadPoolExecutor(max_workers=len(items))
    try:
        return list(pool.map(work, items))
    except KeyboardInterrupt:
        cancelled.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
