"""The liveness controller's rules, pure: no await, no clock of its own, no I/O.

What a Hello announces, which `closed` facts may write, what a sweep may do at `now`
given when the previous successful sweep ran (the outage grace), which gateways it can
see (a gateway whose flushes stopped arriving is blind: its sessions' ages say nothing),
and when the fleet breaker holds a gateway's stale sessions. Applied by
`workers.liveness.apply` and `workers.liveness.sweep`.

Where a mistake hurts: a rule too eager here disconnects a healthy fleet at once (and
its gateways then drop every stream); a rule too lax keeps a dead node "connected".
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from schemas.events import NodeConnected
from schemas.facts import HASH_SPACE, ROW_OF_ANOTHER, Closed, Hello, Liveness

#: `closed` reasons whose session no longer owns its row: nothing to write, nothing to say.
NOT_OURS = ROW_OF_ANOTHER


@dataclass(frozen=True)
class Rules:
    stale_after: timedelta = timedelta(seconds=45)
    #: the silence its gateway closes a session for (the daemons' heartbeat times the missed
    #: ones): what a stale session shows in the flushes the controller applied
    silent_after: timedelta = timedelta(seconds=30)
    gateway_grace: timedelta = timedelta(seconds=120)
    outage_threshold: timedelta = timedelta(seconds=20)
    outage_grace: timedelta = timedelta(minutes=5)
    #: a gateway none of whose flushes was applied for this long is blind
    blind_after: timedelta = timedelta(seconds=30)
    #: the breaker opens when one sweep would disconnect more than this share of one
    #: gateway's connected sessions, and at least `breaker_minimum` of them
    breaker_share: float = 0.5
    breaker_minimum: int = 20


def newest_ranges(flushes: Iterable[tuple[Liveness, int]]) -> list[tuple[Liveness, int]]:
    """Of a batch's range facts (each with its stream sequence), those its range rows are
    written from: newest first, a fact is kept unless a kept one of its gateway, published
    later, overlaps its range (a gateway that re-cut its ranges between two flushes of
    the batch: the newer cut wins where they overlap). In gateway and range order: the
    order their rows are written in. Facts without a range are not range facts. Pure."""
    kept: dict[str, list[tuple[Liveness, int]]] = {}
    ranged = [(f, seq) for f, seq in flushes if f.range_start is not None]
    for fact, seq in sorted(ranged, key=lambda pair: -pair[1]):
        mine = kept.setdefault(fact.gateway_id, [])
        if not any(_overlap(fact, other) for other, _ in mine):
            mine.append((fact, seq))
    return sorted(
        (pair for pairs in kept.values() for pair in pairs),
        key=lambda pair: (pair[0].gateway_id, pair[0].range_start),
    )


def remainders(
    replaced: Sequence[tuple[int, int]], written: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The parts of the `replaced` ranges (`[start, end)`) that no `written` range covers,
    in order: what a gateway's re-cut flush has not named anew yet. Pure."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(replaced):
        at = start
        for w_start, w_end in sorted(written):
            if w_end <= at or w_start >= end:
                continue
            if w_start > at:
                out.append((at, w_start))
            at = max(at, w_end)
        if at < end:
            out.append((at, end))
    return out


#: how much later the facts stream must have stored a fact of a lower sequence for it to
#: be newer (a stream made anew): beyond any clock skew of a cluster's servers, within a
#: flush period (migration 0040's `range_fact_replaces`, which `replaces` mirrors)
STORED_APART = timedelta(seconds=10)


def replaces(f_seq: int, f_at: datetime | None, r_seq: int, r_at: datetime | None) -> bool:
    """Whether a range fact (`f_*`) is newer than a range row's fact (`r_*`): by its
    sequence in the facts stream — one stream's order, exact — or, a lower sequence, by
    the stream having stored it more than `STORED_APART` later: a stream deleted and made
    again numbers from 1. (A later sequence stored "earlier" — the leader's clock
    stepped back — is newer by its sequence.) Pure."""
    later_by_time = f_at is not None and r_at is not None and f_at - r_at > STORED_APART
    return f_seq > r_seq or later_by_time


def _overlap(a: Liveness, b: Liveness) -> bool:
    assert a.range_start is not None and a.range_end is not None
    assert b.range_start is not None and b.range_end is not None
    return a.range_start < b.range_end and b.range_start < a.range_end


def connected(hello: Hello, current_epoch: int | None) -> NodeConnected | None:
    """`node.connected` for a Hello that still holds its row; None for a late, stale one. Pure."""
    if current_epoch != hello.epoch:
        return None
    return NodeConnected(
        node_id=hello.node_id,
        epoch=hello.epoch,
        gateway_id=hello.gateway_id,
        boot_id=hello.boot_id,
        journal_changed=hello.journal_changed,
        boot_changed=hello.boot_changed,
        duplicate_identity=hello.duplicate_identity,
    )


def closes_its_row(closed: Closed) -> bool:
    """Whether a `closed` fact may write the disconnect (it may still be fenced out). Pure."""
    return closed.reason not in NOT_OURS


@dataclass(frozen=True)
class SweepState:
    """`liveness_sweeps`: the last successful sweep and the end of the outage grace."""

    last_sweep_at: datetime | None
    grace_until: datetime | None


@dataclass(frozen=True)
class SweepPlan:
    state: SweepState  # what to record if the sweep commits
    age_transitions: bool  # False while the outage grace holds
    stale_before: datetime  # sessions last seen before this are stale
    gateway_expired_before: datetime  # gateways whose lease expired before this are lost


def plan_sweep(state: SweepState, now: datetime, rules: Rules) -> SweepPlan:
    """What a sweep at `now` may do. Pure.

    A sweep more than `outage_threshold` after the previous successful one (or the first
    sweep ever) follows an outage: ages nobody could flush would read as dead nodes, so
    age-based transitions (stale sessions, lost gateways) wait `outage_grace` from now.
    """
    grace_until = state.grace_until
    if state.last_sweep_at is None or now - state.last_sweep_at > rules.outage_threshold:
        grace_until = now + rules.outage_grace
    return SweepPlan(
        state=SweepState(now, grace_until),
        age_transitions=grace_until is None or now >= grace_until,
        stale_before=now - rules.stale_after,
        gateway_expired_before=now - rules.gateway_grace,
    )


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
    if not sight.ranges:
        return sight.last_flush_at
    seen = [at for at in (covered_at(sight.ranges), sight.whole_flush_at) if at is not None]
    return max(seen, default=None)


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
    `blind_after`: a gateway's start is not news.
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


@dataclass(frozen=True)
class BreakerView:
    """One gateway in one sweep: how many of its sessions the stale rule would take."""

    gateway_id: str
    would_disconnect: int
    connected: int
    open: bool  # the breaker was open after the previous sweep
    released: bool  # an operator released it since it opened (`bcw liveness release`)


@dataclass(frozen=True)
class BreakerDecision:
    hold: bool  # disconnect none of the gateway's stale sessions in this sweep
    open: bool  # the breaker's state after this sweep
    opened: bool  # it opens now: say `liveness.breaker-open`
    closed: bool  # it closes now (the share fell back, or an operator released it)


def trips(would_disconnect: int, connected: int, rules: Rules) -> bool:
    """Too many of one gateway's sessions at once to be believed. Pure."""
    return (
        would_disconnect >= rules.breaker_minimum
        and would_disconnect > rules.breaker_share * connected
    )


def decide_breaker(view: BreakerView, rules: Rules) -> BreakerDecision:
    """The fleet breaker for one gateway in one sweep. Pure.

    When the stale rule would take more than `breaker_share` of a gateway's connected
    sessions (and at least `breaker_minimum`), something other than the nodes is likely
    wrong (a half-broken gateway, a clock, the controller): none is disconnected, the
    breaker opens, and every sweep looks again. It closes when the share falls back, or
    when an operator releases it — then that sweep disconnects them. A real rack failure
    is still recorded by the gateway's own `closed` facts, which the breaker never holds;
    lost gateways are the gateway-loss rule's, which it never holds either.
    """
    if not trips(view.would_disconnect, view.connected, rules):
        return BreakerDecision(hold=False, open=False, opened=False, closed=view.open)
    if view.open and view.released:
        return BreakerDecision(hold=False, open=False, opened=False, closed=True)
    return BreakerDecision(hold=True, open=True, opened=not view.open, closed=False)


#: The migration that marks sessions ranged (0.4.0): the release that applied it was the
#: first on this database whose sweep reads range rows.
RANGED_MIGRATION = "0039_range_sight_marks.sql"


def range_sight_on(
    setting: bool | str, ledger: dict[str, str | None], own: str
) -> tuple[bool, str]:
    """Whether range facts write only the session rows that change, and why.

    `setting` is `BCW_LIVENESS_RANGE_SIGHT`: True or False decide; "auto" decides from
    `ledger` (migration name → the release that applied it; None: a release before
    0.4.0, which did not record it) and `own` (this release). Range sight is unsafe only
    while a liveness worker before 0.4 runs (its sweep reads only `last_seen`). One may
    run only during the rollout that took the schema from before 0.4: the one in which
    this release applied `RANGED_MIGRATION` over migrations a release before 0.4 had
    applied. A schema every migration of which a release of 0.4 or later applied, or
    whose `RANGED_MIGRATION` another release applied (an earlier one, whose rollout is
    over, or a later one this is a rollback from), has had no such worker since."""
    if isinstance(setting, bool):
        return setting, f"BCW_LIVENESS_RANGE_SIGHT={str(setting).lower()}"
    if RANGED_MIGRATION not in ledger:
        return False, f"the schema lacks {RANGED_MIGRATION}"
    if all(applied is not None for applied in ledger.values()):
        return True, "every migration was applied by 0.4.0 or later: no older liveness worker"
    if ledger[RANGED_MIGRATION] != own:
        return True, (
            f"{RANGED_MIGRATION} was applied by {ledger[RANGED_MIGRATION]}, before this "
            f"release: its liveness workers were 0.4.0 or later"
        )
    return False, (
        f"this release ({own}) upgraded the schema from before 0.4.0, whose liveness "
        "workers may still run (their sweep reads only last_seen); on from the next "
        "release, or set BCW_LIVENESS_RANGE_SIGHT=true once none runs"
    )
