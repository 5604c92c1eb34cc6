"""Shedding a gateway's flood of foreign or stale facts before it costs anything (issues
#41, #59).

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
— a `closed` the sweep of stale sessions makes up for, an answer its command sent again
at the node's next Hello.

A *stale* fact (issue #59) is bound — its epoch was issued to its gateway — but fenced
out: the gateway no longer holds that epoch. It costs the same (a check in PostgreSQL, a
write fenced to nothing), and a compromised gateway has all the epochs it was ever
issued to send again: 231,445 `closed` facts for them in 20 s made every other gateway's
flushes 12.9 s late, and blind. So stale facts are counted too, against a threshold of
their own (`stale_threshold`): an honest gateway sends some (a session's close after its
node moved on, one per session that moved), a flood of them is its own. Hellos are not
counted: a stale Hello is superseded by its node's next one (a reconnect storm makes
many), and shedding Hellos would lose the commands each session is sent again.
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

    def __init__(
        self,
        worker: str,
        threshold: int = 1000,
        window: float = 10.0,
        stale_threshold: int = 5000,
    ) -> None:
        self._worker = worker
        self._thresholds = {"foreign": threshold, "stale": stale_threshold}
        self._window = window
        self._started = -window
        self._counts: dict[tuple[str, str, str], int] = {}
        self._until: dict[Key, float] = {}

    def saw(self, fact: Fact, now: float | None = None, *, stale: bool = False) -> None:
        """Count one foreign (or, `stale`, one stale) fact; past its threshold, its
        gateway's type is shed. A stale Hello is not counted."""
        if stale and fact.BC_TYPE == "hello":
            return
        now = time.monotonic() if now is None else now
        if now - self._started >= self._window:
            self._started, self._counts = now, {}
        kind = "stale" if stale else "foreign"
        threshold = self._thresholds[kind]
        counted = (fact.gateway_id, fact.BC_TYPE, kind)
        self._counts[counted] = self._counts.get(counted, 0) + 1
        key = (fact.gateway_id, fact.BC_TYPE)
        if self._counts[counted] > threshold and not self.sheds(key, now):
            self._until[key] = now + self._window
            log.warning(
                "%s: gateway %s sent over %d %s %s facts in %g s: its %s facts are shed "
                "(acknowledged unread) for %g s",
                self._worker,
                key[0],
                threshold,
                kind,
                key[1],
                self._window,
                key[1],
                self._window,
            )

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
