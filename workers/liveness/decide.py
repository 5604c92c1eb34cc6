"""The liveness controller's rules, pure: no await, no clock of its own, no I/O.

What a Hello announces, which `closed` facts may write, and what a sweep may do at
`now` given when the previous successful sweep ran (the outage grace). Applied by
`workers.liveness.apply` and `workers.liveness.sweep`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from schemas.events import NodeConnected
from schemas.facts import Closed, Hello

#: `closed` reasons whose session no longer owns its row: nothing to write, nothing to say.
NOT_OURS = frozenset({"superseded", "fenced"})


@dataclass(frozen=True)
class Rules:
    stale_after: timedelta = timedelta(seconds=45)
    gateway_grace: timedelta = timedelta(seconds=120)
    outage_threshold: timedelta = timedelta(seconds=20)
    outage_grace: timedelta = timedelta(minutes=5)


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
