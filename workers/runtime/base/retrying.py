"""How a batch is retried: the tenacity policy and the two ways a try can fail.

Used by the consumer's `_apply_patiently`. A try that fails transiently raises `Waiting`
(tried again, for as long as an outage lasts); one that fails because of the batch
itself raises `Pinned` (the fact behind it is found and dead-lettered). No I/O here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_random_exponential

from workers.runtime.base.waiting import Patience, sleep_or_stop


class Waiting(Exception):
    """A transient failure: the batch is tried again (an outage when `healthy` is false)."""

    def __init__(self, error: Exception, healthy: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.healthy = healthy


class Pinned(Exception):
    """A failure the batch itself causes: its fact is found and dead-lettered (or, for a
    row another session keeps locked, `cause` "locked", handed back for later)."""

    def __init__(self, error: Exception, cause: str, tries: int = 0) -> None:
        super().__init__(str(error))
        self.error = error
        self.cause = cause
        detail = f"{type(error).__name__}: {error}"
        self.reason = (
            f"failed {tries} times while PostgreSQL and NATS answered: {detail}"
            if cause == "retries"
            else detail
        )


def patiently(stopping: asyncio.Event, max_wait: float, patience: Patience) -> AsyncRetrying:
    """Retry `Waiting` with jittered exponential back-off up to `max_wait` seconds, until
    `stopping` (then the last `Waiting` is raised); the sleep is cut short by a stop, and
    an outage is logged by `patience` when it starts and now and then while it lasts.

    A new object per batch: tenacity's state must not be shared between coroutines.
    """
    return AsyncRetrying(
        retry=retry_if_exception_type(Waiting),
        wait=wait_random_exponential(multiplier=0.2, max=max_wait),
        stop=_when(stopping),
        sleep=lambda seconds: sleep_or_stop(stopping, seconds),
        before_sleep=lambda state: _tell(patience, state),
        reraise=True,
    )


def _when(stopping: asyncio.Event) -> Callable[[RetryCallState], bool]:
    return lambda _state: stopping.is_set()


def _tell(patience: Patience, state: RetryCallState) -> None:
    failure = state.outcome.exception() if state.outcome else None
    if isinstance(failure, Waiting):
        patience.failed(failure.error, quiet=failure.healthy)
