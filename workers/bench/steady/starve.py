"""`bcw bench steady --starve F`: the liveness processes starved of CPU for a while, as a
noisy neighbour, a PostgreSQL vacuum, a pod's CPU limit or a reconnect herd would starve
them — each stopped and continued in a duty cycle (running `F` of every second), then
given their CPU back. The run then shows what overload does to the controller: how far
behind its facts it falls, that it says its gateways are blind for lag and holds their
sessions instead of disconnecting them, and how long it takes to catch up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

#: one turn of the duty cycle: the process runs `fraction` of it, is stopped for the rest
PERIOD = 1.0


@dataclass(frozen=True)
class Starving:
    """When and how hard: from `at` (monotonic) for `seconds`, running `fraction`."""

    fraction: float
    seconds: float
    at: float

    @property
    def until(self) -> float:
        return self.at + self.seconds


def _signal(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def starve(pids: Sequence[int], starving: Starving) -> None:
    """Run the duty cycle on `pids` (a fraction of 1 or more: nothing), and always leave
    them running."""
    if starving.fraction >= 1.0:
        return
    await asyncio.sleep(max(0.0, starving.at - time.monotonic()))
    print(
        f"starving the liveness process(es) for {starving.seconds:g} s: "
        f"{starving.fraction:.0%} of each second",
        flush=True,
    )
    try:
        while time.monotonic() < starving.until:
            _signal(pids, signal.SIGCONT)
            await asyncio.sleep(PERIOD * starving.fraction)
            _signal(pids, signal.SIGSTOP)
            await asyncio.sleep(PERIOD * (1.0 - starving.fraction))
    finally:
        _signal(pids, signal.SIGCONT)
    print("the liveness process(es) have their CPU back", flush=True)
