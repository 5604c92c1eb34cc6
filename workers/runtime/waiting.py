"""Waiting that a stop cuts short. Used by every loop of the runtime and the workers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence


async def wait_any(events: Sequence[asyncio.Event], seconds: float) -> None:
    """Return when one of `events` is set, or after `seconds`."""
    waiters = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def sleep_or_stop(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stopping` is set meanwhile."""
    await wait_any((stopping,), seconds)
