"""Waiting that a stop cuts short, and the stop signals that set it. Used by every loop of
the runtime and the workers."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tenacity.wait import wait_base

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_asked_early: list[int] = []


def defer_stop_signals() -> None:
    """From now until `stop_on_signals` hands them to an event loop, SIGTERM and SIGINT are
    remembered instead of ending the process: one that is told to stop while it starts
    (a pod deleted as it comes up) stops cleanly, exit 0, as soon as it can drain."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: _asked_early.append(signum))


def stop_on_signals(stopping: asyncio.Event) -> None:
    """SIGTERM and SIGINT set `stopping` from now on; so does one that came earlier, while
    deferred (`defer_stop_signals`). Call from the running loop."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stopping.set)
    if _asked_early:
        _asked_early.clear()
        stopping.set()


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


class Patience:
    """Back-off and logging for one thing waited on (a server, a batch, a loop).

    `failed()` returns how long to wait before the next try: jittered, doubling from
    `base` to `cap` (`backoff`: tenacity's, as the consumer's batch retries use). It logs the first failure, then at most one line every `every`
    seconds while the wait lasts; `succeeded()` logs one summary when it ends. So an
    outage of any length costs a handful of log lines, not one a try.
    """

    def __init__(
        self,
        what: str,
        logger: logging.Logger,
        *,
        base: float = 0.2,
        cap: float = 5.0,
        every: float = 30.0,
        level: int = logging.WARNING,
    ) -> None:
        self.what = what
        self._log = logger
        self._every = every
        self._level = level
        self.failures = 0
        self._since = 0.0
        self._logged_at = 0.0
        self._announced = False
        self.backoff = backoff(base, cap)

    @property
    def waiting(self) -> bool:
        return self.failures > 0

    def failed(self, error: BaseException, *, quiet: bool = False) -> float:
        """Count a failure; returns the back-off. `quiet`: count it, log nothing."""
        now = time.monotonic()
        if self.failures == 0:
            self._since = now
        if not quiet:
            if not self._announced:
                self._announced = True
                self._logged_at = now
                self._log.log(self._level, "%s: %s; waiting", self.what, _brief(error))
            elif now - self._logged_at >= self._every:
                self._logged_at = now
                self._log.log(
                    self._level,
                    "%s: still waiting after %.0fs (%d tries): %s",
                    self.what,
                    now - self._since,
                    self.failures + 1,
                    _brief(error),
                )
        self.failures += 1
        return waited(self.backoff, self.failures)

    def succeeded(self) -> None:
        if self._announced:
            self._log.log(
                self._level,
                "%s: recovered after %.1fs (%d failed tries)",
                self.what,
                time.monotonic() - self._since,
                self.failures,
            )
        self.failures = 0
        self._announced = False


def _brief(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def backoff(base: float, cap: float) -> wait_base:
    """The wait after a failure, tenacity's strategies composed: at the n-th failure in a
    row, uniformly in [c/2, c] where c = min(cap, base·2ⁿ) — half of it fixed, half full
    jitter, so replicas that failed together do not try again together, and none tries
    again at once. (tenacity is imported here, not at the module's top: `bcw run` defers
    its stop signals with this module before anything heavy is imported.)"""
    from tenacity import wait_exponential, wait_random_exponential

    half = {"multiplier": base / 2, "max": cap / 2}
    return wait_exponential(**half) + wait_random_exponential(**half)


def waited(strategy: wait_base, failures: int) -> float:
    """How long `strategy` waits after the `failures`-th failure in a row (1 or more)."""
    from tenacity import RetryCallState, Retrying

    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = failures + 1  # tenacity's exponent is attempt_number - 1
    return float(strategy(state))
