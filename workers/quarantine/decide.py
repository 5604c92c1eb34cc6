"""The quarantine enforcer's rules, pure: no await, no clock of its own, no I/O.

A Hello with a duplicate identity (the previous session was live, from another boot)
counts one alternation in the node's window; one alternation more than the limit
quarantines the node. Applied by `workers.quarantine.apply`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

REASON = "duplicate-identity"


@dataclass(frozen=True)
class Breaker:
    """What may revoke at once: at most `quarantines` per gateway in `window` (charged to
    the gateway a quarantine is blamed on, `blamed`), and across the fleet at most the larger
    of `quarantines` and `share` of its nodes in the same window."""

    quarantines: int = 3
    window: timedelta = timedelta(minutes=10)
    share: float = 0.01


@dataclass(frozen=True)
class Limits:
    max_alternations: int = 3
    window: timedelta = timedelta(minutes=10)
    breaker: Breaker = Breaker()


@dataclass(frozen=True)
class Counter:
    """`node_sessions.duplicate_hellos` and `duplicate_since`."""

    alternations: int = 0
    since: datetime | None = None


@dataclass(frozen=True)
class Verdict:
    alternations: int  # this alternation's number in its window
    quarantined: bool
    counter: Counter  # what the row holds afterwards (reset after a quarantine)


def count(counter: Counter, now: datetime, limits: Limits) -> Verdict:
    """Count one alternation at `now`. Pure.

    The count restarts when the window has passed since the first alternation it holds;
    more than `max_alternations` inside the window quarantines, and resets the counter so
    a re-joined machine starts afresh.
    """
    if counter.since is None or counter.alternations == 0 or now - counter.since > limits.window:
        counted = Counter(1, now)
    else:
        counted = Counter(counter.alternations + 1, counter.since)
    if counted.alternations > limits.max_alternations:
        return Verdict(counted.alternations, True, Counter())
    return Verdict(counted.alternations, False, counted)


@dataclass(frozen=True)
class Alternation:
    """One alternation: a duplicate-identity Hello's epoch and when its Hello transaction
    issued that epoch (`session_epochs.issued_at`)."""

    epoch: int
    at: datetime
    gateway_id: str | None = None  # the gateway its epoch was issued to (None: not recorded)
    #: its Hello proven, and the live session before it (what no gateway can make up)
    proven: bool = False


@dataclass(frozen=True)
class Judged:
    epoch: int
    number: int  # its number in its window
    quarantined: bool


def judge(alternations: Iterable[Alternation], limits: Limits) -> tuple[dict[int, Judged], Counter]:
    """Every alternation of a node (its last day), counted as of its Hello: in
    epoch order, each at its epoch's issue time, whatever order or delay they were applied
    in. One per epoch (a second one of an epoch is dropped). Returns the verdict of each
    epoch and the counter left afterwards. Pure."""
    counter = Counter()
    judged: dict[int, Judged] = {}
    for alternation in sorted(alternations, key=lambda a: a.epoch):
        if alternation.epoch in judged:
            continue
        verdict = count(counter, alternation.at, limits)
        counter = verdict.counter
        judged[alternation.epoch] = Judged(
            alternation.epoch, verdict.alternations, verdict.quarantined
        )
    return judged, counter


def to_act_on(
    judged: Mapping[int, Judged], acted_up_to: int, epochs: Collection[int]
) -> tuple[Judged, int] | None:
    """The first quarantine the count holds that nobody acted on yet (of an epoch after
    `acted_up_to`), and which of the batch's Hello `epochs` acts on it: that epoch's own
    Hello, else the batch's latest (the late one that completed the count). None when
    there is nothing to act on. Pure."""
    first = next(
        (
            j
            for j in sorted(judged.values(), key=lambda j: j.epoch)
            if j.quarantined and j.epoch > acted_up_to
        ),
        None,
    )
    if first is None:
        return None
    return first, first.epoch if first.epoch in epochs else max(epochs)


def serials_to_revoke(
    presented: str | None, live: Collection[str], recorded: bool = True
) -> list[str]:
    """The presented certificate if it is one of the node's live ones, or if it has no
    record at all (admission lets such a serial in: revoking it records it revoked);
    else every live one of the node. Pure."""
    if presented is not None and (presented in live or not recorded):
        return [presented]
    return sorted(live)


#: why a quarantine's revocation is held for an operator (`bcw quarantine release`)
ONE_GATEWAY = "one-gateway"  # every alternation of its window came through one gateway
BREAKER = "breaker"  # its gateway, or the fleet, revoked as many as the breaker allows


def hold_revocation(
    gateways: Collection[str],
    gateway: str,
    recent: Mapping[str, int],
    fleet_nodes: int,
    breaker: Breaker,
    proven: bool = False,
) -> str | None:
    """Whether a quarantine's revocation waits for an operator, and why; None: revoke now.
    Pure.

    `gateways`: those the quarantine's alternations came through; `gateway`: the one it
    is blamed on (`blamed`); `recent`: per gateway, the revocations made at once in the
    breaker's window; `proven`: every alternation of its window was proven (its Hello and
    the session before it). The breaker holds only what an unproven Hello could have made
    up: unproven alternations that all come through one gateway may all be that gateway's
    invention (they alert, they do not revoke), and a gateway that already led to
    `breaker.quarantines` revocations is held — one gateway's credentials revoke a few
    certificates at most. Proven ones revoke whatever gateways they came through. Past
    the fleet's share, every quarantine is held: never a fleet's certificates at once."""
    if not proven:
        if len(set(gateways)) < 2:
            return ONE_GATEWAY
        if recent.get(gateway, 0) >= breaker.quarantines:
            return BREAKER
    if sum(recent.values()) >= max(breaker.quarantines, int(breaker.share * fleet_nodes)):
        return BREAKER
    return None


def blamed(window: Sequence[Alternation], completed_by: str) -> str:
    """The gateway a quarantine is blamed on and its breaker charged to: the one its
    window's first duplicate came through, as the record has it (the epoch's gateway) —
    the Hello that found the node's session live from another boot and began the count —
    not the one whose Hello completed it (`completed_by`, when the record names none):
    a clone's gateway that makes the node's honest reconnects duplicates does not charge
    the honest gateway with them. Pure."""
    first = min(window, key=lambda a: a.epoch, default=None)
    return first.gateway_id if first is not None and first.gateway_id else completed_by


def window_of(alternations: Iterable[Alternation], quarantine: Judged) -> list[Alternation]:
    """The alternations `quarantine` counted: its own and the ones before it in its window
    (the last `quarantine.number` up to its epoch). Pure."""
    upto = sorted((a for a in alternations if a.epoch <= quarantine.epoch), key=lambda a: a.epoch)
    return upto[-quarantine.number :]


def proven_window(window: Sequence[Alternation]) -> bool:
    """Whether a quarantine's window holds proven alternations only. Pure."""
    return bool(window) and all(a.proven for a in window)
