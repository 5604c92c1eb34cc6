"""The quarantine enforcer's rules, pure: no await, no clock of its own, no I/O.

A Hello with a duplicate identity (the previous session was live, from another boot)
counts one alternation in the node's window; one alternation more than the limit
quarantines the node. Applied by `workers.quarantine.apply`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

REASON = "duplicate-identity"


@dataclass(frozen=True)
class Limits:
    max_alternations: int = 3
    window: timedelta = timedelta(minutes=10)


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
