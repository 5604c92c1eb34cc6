"""Shedding a gateway's flood of foreign facts before it costs anything (issue #41).

A foreign fact (`provenance`: its epoch was never issued to its gateway) changes nothing,
but each still costs a decode, a check in PostgreSQL and an inbox row — and a consumer
reads its facts in stream order, so a gateway's flood of them (29,500 `closed` a second
from one compromised gateway) puts every other gateway's flushes behind it: the
controller goes blind to all of them.

So a consumer counts its foreign facts per gateway and fact type; once one (gateway, type)
passes `threshold` in a `window`, that gateway's facts of that type are *shed* for the
next window: acknowledged as they arrive, from their subject alone — no decode, no
database — and counted (`bcw_facts_total{outcome="shed"}`, logged once per window). An
honest gateway sends no foreign fact (its facts are about the epochs issued to it), so
only a flooding gateway is shed, and only the type it floods: its flushes and Hellos
still go through. What a shed gateway sent genuinely of that type in the window is lost
— a `closed` the liveness sweep makes up for, an answer the next Hello's replay.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from nats.aio.msg import Msg

from schemas.facts import Fact
from schemas.subjects import SubjectError, Subjects

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (gateway, fact type)


class Shedder:
    """Which (gateway, fact type) to shed now. Time is given (`now`, monotonic seconds)."""

    def __init__(self, worker: str, threshold: int = 1000, window: float = 10.0) -> None:
        self._worker = worker
        self._threshold = threshold
        self._window = window
        self._started = -window
        self._counts: dict[Key, int] = {}
        self._until: dict[Key, float] = {}
        self._shed: dict[Key, int] = {}

    def saw(self, fact: Fact, now: float | None = None) -> None:
        """Count one foreign fact; past the threshold, its gateway's type is shed."""
        now = time.monotonic() if now is None else now
        if now - self._started >= self._window:
            self._started, self._counts = now, {}
        key = (fact.gateway_id, fact.BC_TYPE)
        self._counts[key] = self._counts.get(key, 0) + 1
        if self._counts[key] > self._threshold and not self.sheds(key, now):
            self._until[key] = now + self._window
            log.warning(
                "%s: gateway %s sent over %d foreign %s facts in %g s: its %s facts are shed "
                "(acknowledged unread) for %g s",
                self._worker, key[0], self._threshold, key[1], self._window, key[1], self._window,
            )  # fmt: skip

    def sheds(self, key: Key, now: float | None = None) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until <= (time.monotonic() if now is None else now):
            del self._until[key]
            return False
        return True

    @property
    def shedding(self) -> bool:
        return bool(self._until)


async def shed(
    msgs: Sequence[Msg],
    shedder: Shedder,
    subjects: Subjects,
    settled: Callable[[Msg, str], None],
) -> list[Msg]:
    """The messages to handle; the others (their gateway's type is shed) acknowledged at
    once and handed to `settled` with their type (nothing is read of them but their
    subject)."""
    if not shedder.shedding:
        return list(msgs)
    now = time.monotonic()
    kept: list[Msg] = []
    for msg in msgs:
        try:
            key = subjects.parse_fact(msg.subject)
        except SubjectError:
            kept.append(msg)  # dead-lettered as any bad fact
            continue
        if not shedder.sheds(key, now):
            kept.append(msg)
            continue
        with contextlib.suppress(Exception):  # not acked: redelivered, and shed again
            await msg.ack()
        settled(msg, key[1])
    return kept
