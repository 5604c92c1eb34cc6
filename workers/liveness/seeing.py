"""Which gateways the liveness controller can see, pure: as of when the flushes it applied
cover each gateway (one clock, the bus's: docs/workers.md, "One clock for sight"), when a
session of a seen gateway is stale, why a gateway it cannot see is blind, and which
change of sight to say. No await, no clock of its own, no I/O. Applied by
`workers.liveness.blindness` and `workers.liveness.sweep`; the other rules are
`workers.liveness.decide`'s.

Where a mistake hurts: a gateway seen by a flush that does not cover it lets the sweep
take healthy sessions a few at a time, under the breaker (a busy day: 42,759 of a
million); a gateway never seen again holds its dead nodes for ever.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from schemas.facts import HASH_SPACE
from workers.liveness.decide import Rules

#: A range row as the sweep reads it: `(range_start, range_end, bus time)` — the hashes
#: `[range_start, range_end)` its fact named every session of, and when the bus stored
#: that fact (`bus_time`, migration 0043).
RangeSight = tuple[int, int, datetime]

#: why a gateway is blind (`gateway.blind`'s `reason`): the controller's own consumer holds
#: flushes stored before the blind threshold, or none of the gateway's flushes reached it
BlindReason = Literal["lag", "no-flush"]


@dataclass(frozen=True)
class GatewaySight:
    """What the controller knows of one gateway's flushes (`liveness_gateways`, and the
    gateway's range rows), every time on the bus's clock: when the bus stored the flush."""

    gateway_id: str
    last_flush_at: datetime | None  # the newest of its flushes the controller applied
    blind_since: datetime | None  # set while it is blind (a `gateway.blind` was said)
    known_since: datetime | None = None  # when the controller first heard of the gateway
    #: its range rows (none: it cuts no ranges, each flush is whole)
    ranges: tuple[RangeSight, ...] = ()
    #: the newest of its flushes applied that named no range (each names every session)
    whole_flush_at: datetime | None = None

    @functools.cached_property
    def seen(self) -> datetime | None:
        """`seen_at`, worked out once: a sweep asks it of each gateway several times (is it
        seen, what changed, why it is blind, its stale bound)."""
        if not self.ranges:
            return self.last_flush_at
        seen = [at for at in (covered_at(self.ranges), self.whole_flush_at) if at is not None]
        return max(seen, default=None)


def covered_at(ranges: Sequence[RangeSight], space: int = HASH_SPACE) -> datetime | None:
    """The time as of which `ranges` see every hash of `[0, space)`: over every hash, the
    newest row covering it; of those, the earliest. None when a hash has no row. Pure.

    A gateway's flush names every range, so its rows tile the hash space; the controller
    applies the facts of one flush unevenly when it is behind (a replica stopped with a
    batch in hand, a fact redelivered), and then the oldest range is what it knows of the
    sessions there: one range applied late must not stand for another.

    One pass over the rows' bounds, left to right, the rows covering each piece in a heap
    by time (O(n log n): a gateway that floods narrow ranges costs the sweep a sort, never
    a pass per row)."""
    rows = sorted((max(0, s), min(space, e), at) for s, e, at in ranges if s < space and e > 0)
    cuts = sorted({0, space, *(p for s, e, _ in rows for p in (s, e))})
    heap: list[tuple[timedelta, int]] = []  # (how much before _EPOCH it was, end)
    oldest: datetime | None = None
    i = 0
    for piece_start, _piece_end in itertools.pairwise(cuts):
        while i < len(rows) and rows[i][0] <= piece_start:
            _start, end, at = rows[i]
            heapq.heappush(heap, (_EPOCH - at, end))  # the newest first
            i += 1
        while heap and heap[0][1] <= piece_start:
            heapq.heappop(heap)  # the newest row ends before this piece: the next newest
        if not heap:
            return None
        newest = _EPOCH - heap[0][0]
        oldest = newest if oldest is None else min(oldest, newest)
    return oldest


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def seen_at(sight: GatewaySight) -> datetime | None:
    """As of when the flushes the controller applied cover every session of the gateway,
    on the bus's clock; None: they do not (it never flushed, or the range rows of its
    flushes leave a hash uncovered). A gateway that cuts no ranges: its newest flush; one
    that does: its range rows (`covered_at`), or a newer whole flush. Pure."""
    return sight.seen


def stale_before(seen: datetime, now: datetime, rules: Rules) -> datetime:
    """A session of a gateway seen as of `seen` is stale when last seen before this:
    `stale_after` ago (the seed's 45 s: three heartbeats and a flush period) — and, on
    the clock of the flushes the controller applied, `silent_after` before what they
    cover, so that a controller behind them (the flush period and its lag) never takes a
    session that missed a heartbeat or two for one its gateway no longer hears. Pure."""
    return min(now - rules.stale_after, seen - rules.silent_after)


@dataclass(frozen=True)
class SightChange:
    """A gateway went blind (`blind=True`) or sees again; said once per transition."""

    gateway_id: str
    blind: bool
    last_flush_age: timedelta | None  # None: no flush of it was ever applied
    reason: BlindReason | None = None  # why it is blind (None when it sees again)


def behind(lag: float | None, rules: Rules) -> bool:
    """Whether the controller is behind its facts, as the reason a gateway it cannot see is
    blind: the oldest flush its consumer has not applied was stored more than half of
    `blind_after` ago (a flush period, by default: a gateway goes blind when what was
    applied of it is older than two, and a healthy consumer is seconds behind at most), or
    its consumer's state could not be read (its own link to the bus is down: it cannot
    read its facts either). Pure."""
    return lag is None or lag > rules.blind_after.total_seconds() / 2


def sees(sight: GatewaySight, now: datetime, rules: Rules) -> bool:
    """Whether the controller can see the gateway: what it applied of the gateway's flushes
    covers every session of it as of `blind_after` ago at most. Pure.

    Whatever stops flushes from being applied — the controller's own bus connection, its
    consumer's lag (also on one range of the gateway's), the gateway's link, a gateway
    that never flushed — makes it blind: its sessions are held. Sights are on the bus's
    clock, so a controller behind its facts by more than `blind_after` sees no gateway.
    """
    seen = seen_at(sight)
    return seen is not None and now - seen <= rules.blind_after


def blind_reason(
    sight: GatewaySight, now: datetime, rules: Rules, lag: float | None
) -> BlindReason:
    """Why a gateway the controller cannot see is blind, given how far behind its facts
    the controller is (`lag`: seconds since the bus stored the oldest flush it has not
    applied; None: not known). Pure.

    `lag` when the controller holds its flushes: it applied the gateway's ranges unevenly
    (a later one before an earlier: some wait), or its own consumer cannot be read, or it
    is `behind` and the gateway flushed within two flush periods of what it has applied
    (the rest waits with everything after). `no-flush` otherwise: none of the gateway's
    flushes reached the controller lately — its link, or the gateway itself."""
    period = rules.blind_after / 2  # a flush period, at the defaults
    seen, newest = seen_at(sight), sight.last_flush_at
    if seen is not None and newest is not None and newest - seen > period:
        return "lag"
    if lag is None:
        return "lag"
    if not behind(lag, rules):
        return "no-flush"
    applied_through = now - timedelta(seconds=lag)
    return "lag" if newest is not None and newest >= applied_through - 2 * period else "no-flush"


def sight_change(
    sight: GatewaySight, now: datetime, rules: Rules, lag: float | None = 0.0
) -> SightChange | None:
    """The transition to say for a gateway at `now`, if its sight changed; `lag`: how far
    behind its facts the controller is (`blind_reason`). Pure.

    A gateway that just appeared and whose flushes do not cover it yet is not seen (its
    sessions are held) but not said to be blind either, until it has been known for
    `blind_after`: a gateway's start is not news (nor a restart's: `restarting`).
    """
    blind = not sees(sight, now, rules)
    if blind == (sight.blind_since is not None):
        return None
    seen = seen_at(sight)
    just_started = (
        seen is None
        and sight.known_since is not None
        and now - sight.known_since <= rules.blind_after
    )
    if blind and just_started:
        return None
    last = seen if seen is not None else sight.last_flush_at
    # a clock that stepped back (NTP; the tests' compute_now offset) gives no negative age
    age = None if last is None else max(timedelta(0), now - last)
    reason = blind_reason(sight, now, rules, lag) if blind else None
    return SightChange(sight.gateway_id, blind, age, reason)


def restarting(
    change: SightChange,
    lease_since: datetime | None,
    after_drain: bool,
    earlier: int,
    now: datetime,
    rules: Rules,
) -> bool:
    """Whether a gateway the controller stops seeing has just restarted, its start not news
    yet: its lease began at `lease_since`, within `blind_after` of `now`, taken after a
    drained life (`after_drain`), and it holds none (`earlier`) of the sessions it had
    before that lease — a gateway that just appeared, the sight of its last life
    notwithstanding: held, not said. Pure.

    A rolling restart's gateway is drained, closes its sessions and gives its lease up;
    back under a new lease it holds nothing of its last life and flushes at once — until
    that flush is applied, the sight of its last life (older than `blind_after` after a
    slow drain) must not call it blind (a false alarm seen in a rollout). One that holds a
    session from before its lease (its closes not written) is blind as ever: those
    sessions are unseen, and held. So is a lease after an undrained life — a crash, a
    takeover: restarting faster than `blind_after`, its daemons redialling it at once, a
    crash-looping gateway would otherwise never be said blind."""
    return (
        change.blind
        and lease_since is not None
        and after_drain
        and not earlier
        and now - lease_since <= rules.blind_after
    )


def gone(change: SightChange, sessions: int, drained: bool) -> bool:
    """Whether a gateway the controller stops seeing is gone rather than blind: it is
    drained and holds no session — nothing of it is held, and a draining gateway takes no
    Hello, so nothing can be: nothing is said (a rolling restart would otherwise call
    every gateway blind while it is away, or while it stops: it closes its sessions and
    publishes their `closed` facts, its flush stopped, before it gives its lease up). A
    gateway with sessions, or not drained (one that crashed, say), is blind as ever. Pure."""
    return change.blind and drained and sessions == 0
