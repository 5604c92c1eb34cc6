"""The replay dispatcher's rules, pure: no await, no clock of its own, no I/O.

This is where a mistake sends a command twice or never. `plan_replay` decides what a
Hello at epoch E does to the node's commands in flight; `plan_dispatch` which pending
commands a session gets now; `busy_delay` the back-off of a BUSY answer; `progress_to`
the forward-only moves of progress (which answers count at all: `deliveries`). Applied
by `workers.replay.apply` and `workers.replay.dispatch`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from schemas.facts import Hello

IN_FLIGHT = frozenset({"dispatched", "acked", "running"})
TERMINAL = frozenset({"done", "failed", "cancelled"})
UPGRADE = "daemon.upgrade"

# Kinds whose success ends the daemon's process, so no result can report it; the next
# Hello carries the proof instead. The one place these kinds are listed.
REBOOT = "node.reboot"
RESTART = "daemon.restart"
PROCESS_ENDING = frozenset({REBOOT, RESTART, UPGRADE})


@dataclass(frozen=True)
class Command:
    command_id: Any
    node_id: str
    seq: int
    kind: str
    lane: str
    state: str
    session_epoch: int | None = None
    delivery_attempt: int = 0
    payload: Mapping[str, Any] = field(default_factory=dict)
    signature: str | None = None
    not_before: datetime | None = None
    #: when the command last changed (dispatched, acked, running, moved to a new epoch)
    updated_at: datetime | None = None
    #: the epochs it was delivered at, ascending (`workers/replay/deliveries.py`)
    delivered_epochs: tuple[int, ...] = ()

    @property
    def signed(self) -> bool:
        return self.signature is not None


@dataclass(frozen=True)
class Session:
    """What dispatch needs to know of a node's current session."""

    node_id: str
    epoch: int
    gateway_id: str
    transport: str = "grpc"
    upgrade_required: bool = False
    allowed_kinds: frozenset[str] | None = None  # None: the certificate does not restrict


def allowed(kind: str, allowed_kinds: Collection[str] | None) -> bool:
    """The certificate lets the node run this kind. Pure."""
    return allowed_kinds is None or kind in allowed_kinds


def deliverable(command: Command, transport: str, upgrade_required: bool) -> bool:
    """This session can take the command now; otherwise it waits for another one. Pure.

    An upgrade-only session gets only `daemon.upgrade`; a websocket session gets no
    unsigned command.
    """
    if upgrade_required and command.kind != UPGRADE:
        return False
    return not (transport == "websocket" and not command.signed)


def proof_of_completion(command: Command, hello: Hello) -> str | None:
    """The reason a process-ending command is done, if the Hello proves it. Pure.

    Proof, never absence: a reboot by a changed boot id, an upgrade by the target
    version, a restart by a daemon process started after the command last changed
    (dispatched, or reported running). A restart command missing from
    `running_command_ids` proves nothing (it may have been lost before delivery): it is
    replayed, unless its result comes back.
    """
    if command.kind == REBOOT and hello.boot_changed:
        return "rebooted"
    if (
        command.kind == RESTART
        and hello.process_started_at is not None
        and command.updated_at is not None
        and hello.process_started_at > command.updated_at
    ):
        return "restarted"
    if command.kind == UPGRADE and hello.daemon_version == command.payload.get("target_version"):
        return "upgraded"
    return None


@dataclass(frozen=True)
class ReplayPlan:
    failed: tuple[Command, ...] = ()  # journal-lost: the owner re-decides
    completed: tuple[tuple[Command, str], ...] = ()  # proven by the Hello, with the proof
    cancelled: tuple[Command, ...] = ()  # kind-not-allowed
    kept: tuple[Command, ...] = ()  # running on the daemon: moved to E, not re-sent
    resent: tuple[Command, ...] = ()  # moved to E, re-sent in seq order, attempt raised
    parked: tuple[Command, ...] = ()  # this session cannot take them: back to pending


def plan_replay(hello: Hello, in_flight: Iterable[Command]) -> ReplayPlan:
    """What a current Hello at epoch E does to the node's commands in flight. Pure.

    Only commands in flight at an older epoch are replayed (one sent to this session
    already is its own). Resume rules first: a changed journal fails every command in
    flight (`journal-lost`, never re-sent blindly); a process-ending command is
    completed by the Hello's proof. Then every remaining command moves to E: a kind the certificate excludes is
    cancelled; one the daemon reports running is kept (it holds a credit there); one this
    session cannot take waits as pending; the rest are re-sent in seq order.
    """
    # what the dispatch loop already sent to this very session (before its Hello fact was
    # applied) belongs to it: neither lost with the old journal nor sent twice
    commands = sorted(
        (c for c in in_flight if c.session_epoch is None or c.session_epoch < hello.epoch),
        key=lambda c: (c.seq, str(c.command_id)),
    )
    if hello.journal_changed:
        return ReplayPlan(failed=tuple(commands))
    running = set(hello.running_command_ids)
    allowed_kinds = hello.cert.allowed_kinds
    completed, cancelled, kept, resent, parked = [], [], [], [], []
    for command in commands:
        proof = proof_of_completion(command, hello) if command.kind in PROCESS_ENDING else None
        if proof is not None:
            completed.append((command, proof))
        elif not allowed(command.kind, allowed_kinds):
            cancelled.append(command)
        elif command.command_id in running:
            kept.append(command)
        elif not deliverable(command, hello.transport, hello.upgrade_required):
            parked.append(command)
        else:
            resent.append(command)
    return ReplayPlan(
        (), tuple(completed), tuple(cancelled), tuple(kept), tuple(resent), tuple(parked)
    )


@dataclass(frozen=True)
class DispatchPlan:
    dispatch: tuple[Command, ...] = ()
    cancel: tuple[Command, ...] = ()


def plan_dispatch(
    session: Session,
    pending: Sequence[Command],
    in_flight: Mapping[str, int],
    credits: int,
    now: datetime,
    awaiting_replay: Collection[str] = (),
    limits: Mapping[str, int] | None = None,
) -> DispatchPlan:
    """Which pending commands of one node the session gets now. Pure.

    Per lane, in seq order: a kind the certificate excludes is cancelled; a command this
    session cannot take is passed over (it waits for another session); the first one
    whose back-off has not expired stops the lane (nothing overtakes it); at most
    `credits` are in flight per lane (or the lane's entry in `limits`: what the daemon's
    heartbeats say it can take, `lane_limits`). A lane in `awaiting_replay` (it has commands in
    flight at an older epoch than the session's: the Hello that replays them has not been
    applied yet) gets nothing new: the replay puts the older commands first.
    """
    dispatch: list[Command] = []
    cancel: list[Command] = []
    counts = dict(in_flight)
    by_lane: dict[str, list[Command]] = {}
    for command in sorted(pending, key=lambda c: c.seq):
        by_lane.setdefault(command.lane, []).append(command)
    for lane, commands in sorted(by_lane.items()):
        if lane in awaiting_replay:
            continue
        limit = (limits or {}).get(lane, credits)
        for command in commands:
            if not allowed(command.kind, session.allowed_kinds):
                cancel.append(command)
                continue
            if not deliverable(command, session.transport, session.upgrade_required):
                continue
            if command.not_before is not None and command.not_before > now:
                break
            if counts.get(lane, 0) >= limit:
                break
            dispatch.append(command)
            counts[lane] = counts.get(lane, 0) + 1
    return DispatchPlan(tuple(sorted(dispatch, key=lambda c: c.seq)), tuple(cancel))


def lane_limits(
    reported: Mapping[str, int] | None, on_daemon: Mapping[str, int], credits: int
) -> dict[str, int]:
    """How many commands each lane may have in flight, from the daemon's heartbeats. Pure.

    `reported`: its free credits per lane at its last heartbeat (None: never reported);
    `on_daemon`: the lane's commands it holds now (acked or running), which its free
    credits already left out. The lane's capacity is their sum, never more than
    `credits`; a lane it did not report keeps `credits`.
    """
    if not reported:
        return {}
    return {
        lane: max(0, min(credits, free + on_daemon.get(lane, 0))) for lane, free in reported.items()
    }


def busy_delay(answers_this_session: int, base: timedelta, cap: timedelta) -> timedelta:
    """Back-off after the n-th BUSY answer (1-based) in one session: 1, 2, 4, … 30 s. Pure."""
    return min(cap, base * 2 ** max(0, answers_this_session - 1))


def busy_count(busy_attempts: int, busy_epoch: int | None, epoch: int) -> int:
    """This BUSY's number in its session: counting restarts with a new session. Pure."""
    return busy_attempts + 1 if busy_epoch == epoch else 1


def progress_to(state: str, reported: str) -> str | None:
    """The new state after a progress report, or None when it would not move forward. Pure."""
    order = {"dispatched": 0, "acked": 1, "running": 2}
    if state not in order or reported not in order or order[reported] <= order[state]:
        return None
    return reported


#: once asked, a session whose Hello still has not come is asked again after this many
#: times `lost_after` (the notice, or the re-published fact, may have been lost too)
ASK_AGAIN_FACTOR = 5


def hello_lost(
    epoch: int,
    seen_epoch: int | None,
    connected_at: datetime,
    asked_epoch: int | None,
    asked_at: datetime | None,
    now: datetime,
    lost_after: timedelta,
) -> bool:
    """Whether to ask a session's gateway for its Hello again: the replay worker has
    applied no Hello of this epoch (with nothing left to consume), the session has been
    connected for `lost_after`, and it was not asked for this epoch lately. Pure; the
    dispatch loop asks (`workers/replay/lost.py`)."""
    if seen_epoch is not None and seen_epoch >= epoch:
        return False
    if now - connected_at < lost_after:
        return False
    if asked_epoch == epoch and asked_at is not None:
        return now - asked_at >= ASK_AGAIN_FACTOR * lost_after
    return True
