"""The liveness controller's rules, pure: no await, no clock of its own, no I/O.

What a Hello announces, which `closed` facts may write, which range rows a flush keeps,
what a sweep may do at `now` given when the previous successful sweep ran (the outage
grace), and when the fleet breaker holds a gateway's stale sessions. Applied by
`workers.liveness.apply` and `workers.liveness.sweep`; which gateways the controller can
see is `workers.liveness.seeing`'s.

Where a mistake hurts: a rule too eager here disconnects a healthy fleet at once (and
its gateways then drop every stream); a rule too lax keeps a dead node "connected".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from schemas.events import NodeConnected
from schemas.facts import ROW_OF_ANOTHER, Closed, Hello, Liveness

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


def connected(
    hello: Hello, current_epoch: int | None, at: datetime | None = None
) -> NodeConnected | None:
    """`node.connected` for a Hello that still holds its row, connected `at` (when the bus
    stored the Hello); None for a late, stale one. Pure."""
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
        connected_at=at,
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
