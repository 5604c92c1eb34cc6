"""The replay dispatcher's fact handling: replay on Hello; progress, results and BUSY.

Called by the runtime with one transaction per batch. A Hello's replay is fenced on its
epoch with the node's session row locked FOR SHARE (it serializes with the next Hello's
epoch bump); command rows are locked in a stable order before they change. Every change
pokes the dispatch loop (NOTIFY) and queues its events and dispatch notices.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from schemas.events import (
    CommandCancelled,
    CommandCompleted,
    CommandEvent,
    CommandFailed,
    CommandReplayed,
)
from schemas.facts import Fact, Hello, Progress, Rejected, Result, newest_per_node
from schemas.notices import Dispatch
from workers.replay.carried import pairs, results_of
from workers.replay.decide import Command, busy_count, busy_delay, plan_replay
from workers.replay.deliveries import (
    busy_counts,
    deliveries,
    progress_counts,
    result_counts,
    settles,
    with_delivery,
)
from workers.replay.lost import RECORD_SEEN
from workers.replay.settings import ReplaySettings
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Handler, Tx
from workers.runtime.observability import tracing

#: the dispatch loop's wake-up channel (`wake_channels`, migration 0057)
DISPATCH_CHANNEL = "dispatch"
#: an event's reason is at most this long (a failed result's error may be 4,096)
REASON_MAX = 1024

COMMAND_COLUMNS = """
command_id, node_id, seq, kind, lane, state, session_epoch, delivery_attempt, busy_attempts,
busy_epoch, not_before, payload::text AS payload, signature, updated_at, delivered_epochs
"""

# With whether the node is held for an operator (`node_held`: a quarantine holds every
# session of it) and whether the session gets nothing yet (`held`): held for the
# quarantine at its epoch, unproven for a node that proves its Hellos (a takeover
# attempt), or of a node held for an operator (as the dispatch loop reads it). Locked
# before the command rows, as the dispatch loop locks them.
LOCK_SESSIONS = """
SELECT s.node_id, s.session_epoch, s.gateway_id, s.node_held,
       s.held_epoch = s.session_epoch OR s.proven IS NOT DISTINCT FROM false OR s.node_held
       AS held
  FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT node_id, session_epoch, gateway_id, held_epoch, proven,
                            EXISTS (SELECT 1 FROM quarantines q WHERE q.node_id = n.node_id
                                      AND q.revoked_at IS NULL AND q.dismissed_at IS NULL)
                            AS node_held
                       FROM node_sessions WHERE node_id = n.node_id FOR SHARE) AS s
"""

IN_FLIGHT_OF = f"""
SELECT c.* FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT {COMMAND_COLUMNS} FROM commands
                      WHERE node_id = n.node_id AND state IN ('dispatched', 'acked', 'running')
                      ORDER BY seq FOR UPDATE) AS c
"""

# Command rows are always locked in (node, seq) order — here, in the dispatch loop and in
# the replay — so two transactions can never hold each other's next row.
LOCK_COMMANDS = f"""
SELECT {COMMAND_COLUMNS} FROM commands WHERE command_id = ANY($1::uuid[])
 ORDER BY node_id, seq
   FOR UPDATE
"""

WRITE_COMMANDS = """
UPDATE commands c
   SET state = t.state, session_epoch = t.session_epoch, delivery_attempt = t.attempt,
       busy_attempts = t.busy_attempts, busy_epoch = t.busy_epoch, not_before = t.not_before,
       result = coalesce(t.result::jsonb, c.result), failure_reason = coalesce(t.reason, c.failure_reason),
       trace_context = coalesce(t.trace_context, c.trace_context),
       delivered_epochs = t.delivered::bigint[], updated_at = now()
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::int[], $5::int[], $6::bigint[], $7::timestamptz[],
              $8::text[], $9::text[], $10::text[], $11::text[])
       AS t(id, state, session_epoch, attempt, busy_attempts, busy_epoch, not_before, result, reason,
            trace_context, delivered)
 WHERE c.command_id = t.id
"""


@dataclasses.dataclass
class Row:
    """A command row being changed by this transaction."""

    command: Command
    busy_attempts: int
    busy_epoch: int | None
    result: str | None = None
    reason: str | None = None
    trace_context: str | None = None  # a traceparent to continue when it is dispatched again
    changed: bool = False

    def set(self, **changes: Any) -> None:
        """Change the command; what it was delivered at stays in its history (the epoch it
        was in flight at included), unless `changes` adds a delivery."""
        changes.setdefault("delivered_epochs", deliveries(self.command))
        self.command = dataclasses.replace(self.command, **changes)
        self.changed = True


def command_from_row(row: asyncpg.Record) -> Command:
    return Command(
        command_id=row["command_id"],
        node_id=row["node_id"],
        seq=row["seq"],
        kind=row["kind"],
        lane=row["lane"],
        state=row["state"],
        session_epoch=row["session_epoch"],
        delivery_attempt=row["delivery_attempt"],
        payload=json.loads(row["payload"]),
        signature=row["signature"],
        not_before=row["not_before"],
        updated_at=row.get("updated_at"),
        delivered_epochs=tuple(row.get("delivered_epochs") or ()),
    )


def _row(record: asyncpg.Record) -> Row:
    return Row(command_from_row(record), record["busy_attempts"], record["busy_epoch"])


async def _write(conn: asyncpg.Connection, rows: Sequence[Row]) -> None:
    changed = sorted((r for r in rows if r.changed), key=lambda r: str(r.command.command_id))
    if not changed:
        return
    await conn.execute(
        WRITE_COMMANDS,
        [r.command.command_id for r in changed],
        [r.command.state for r in changed],
        [r.command.session_epoch for r in changed],
        [r.command.delivery_attempt for r in changed],
        [r.busy_attempts for r in changed],
        [r.busy_epoch for r in changed],
        [r.command.not_before for r in changed],
        [r.result for r in changed],
        [r.reason for r in changed],
        [r.trace_context for r in changed],
        [_array(r.command.delivered_epochs) for r in changed],
    )
    await _poke(conn)


def _array(epochs: Sequence[int]) -> str:
    """A bigint[] as its text (one array per row of an unnest, which would flatten a
    two-dimensional parameter)."""
    return "{" + ",".join(str(int(e)) for e in epochs) + "}"


async def _poke(conn: asyncpg.Connection) -> None:
    """Wake the dispatch loop when this transaction commits (credits freed, Hellos)."""
    await conn.execute("SELECT wake_dispatch()")


def command_event(
    kind: type[CommandEvent],
    command: Command,
    epoch: int,
    reason: str | None = None,
    at: datetime | None = None,
) -> CommandEvent:
    """The event of `command` (`at`: when it happened; `publish_event` says its cause's)."""
    return kind(
        at=at,
        command_id=command.command_id,
        node_id=command.node_id,
        epoch=epoch,
        seq=command.seq,
        kind=command.kind,
        attempt=command.delivery_attempt,
        reason=reason[:REASON_MAX] if reason is not None else None,  # the row keeps it whole
    )


def dispatch_notice(command: Command, epoch: int) -> Dispatch:
    return Dispatch(
        node_id=command.node_id,
        epoch=epoch,
        command_id=command.command_id,
        seq=command.seq,
        kind=command.kind,
        lane=command.lane,
        attempt=command.delivery_attempt,
        payload=dict(command.payload),
        signature=command.signature,
    )


async def publish_event(tx: Tx, event: CommandEvent, cause: Fact | None) -> None:
    """Queue `event`, which happened when its cause was stored (where it does not say)."""
    if event.at is None and cause is not None:
        event = event.model_copy(update={"at": await tx.fact_time(cause)})
    tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=cause, order_key=event.node_id)


def make_handler(settings: ReplaySettings) -> Handler:
    async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
        outcomes: dict[uuid.UUID, Outcome] = {}
        hellos = [f for f in facts if isinstance(f, Hello)]
        if hellos:
            nodes = sorted({h.node_id for h in hellos})
            sessions = {r["node_id"]: r for r in await tx.conn.fetch(LOCK_SESSIONS, nodes)}
            # what finished while the node was away settles first: not replayed, not re-sent
            # (never what a takeover attempt, a Hello held as a possible clone's, or one of
            # a node held for an operator says it ran: the node's own daemon answers a
            # re-send from its journal)
            settled = [
                result
                for hello in hellos
                if hello.proven is not False
                and not hello.duplicate_identity
                and not (hello.node_id in sessions and sessions[hello.node_id]["node_held"])
                for result in results_of(hello)
            ]
            if settled:
                await _answers(
                    tx, settled, settings, causes={r.fact_id: h for h, r in pairs(hellos)}
                )
            outcomes.update(await _replay(tx, hellos, sessions))
        answers = [f for f in facts if isinstance(f, Progress | Result | Rejected)]
        if answers:
            outcomes.update(await _answers(tx, answers, settings))
        return outcomes

    return handle


async def _replay(
    tx: Tx, hellos: list[Hello], sessions: Mapping[str, asyncpg.Record]
) -> dict[uuid.UUID, Outcome]:
    """Each node's newest Hello of the batch, when it is the session of now (`sessions`,
    locked): its resume rules, then its replay."""
    latest = newest_per_node(hellos)
    current = {
        n: h for n, h in latest.items() if n in sessions and sessions[n]["session_epoch"] == h.epoch
    }
    outcomes = {h.fact_id: outcome.STALE for h in hellos if current.get(h.node_id) is not h}
    if not current:
        return outcomes
    by_node: dict[str, list[Row]] = {}
    for record in await tx.conn.fetch(IN_FLIGHT_OF, sorted(current)):
        by_node.setdefault(record["node_id"], []).append(_row(record))
    rows: list[Row] = []
    for node, hello in current.items():
        if hello.proven is False:  # a takeover attempt proves nothing: no resume rule, no replay
            continue
        node_rows = {r.command.command_id: r for r in by_node.get(node, [])}
        rows += node_rows.values()
        plan = plan_replay(hello, [r.command for r in node_rows.values()])
        epoch = hello.epoch
        for command in plan.failed:
            node_rows[command.command_id].set(state="failed")
            node_rows[command.command_id].reason = "journal-lost"
            await publish_event(
                tx, command_event(CommandFailed, command, epoch, "journal-lost"), hello
            )
        for command, proof in plan.completed:
            node_rows[command.command_id].set(state="done")
            node_rows[command.command_id].result = json.dumps({"proof": proof})
            await publish_event(tx, command_event(CommandCompleted, command, epoch, proof), hello)
        for command in plan.cancelled:
            node_rows[command.command_id].set(state="cancelled")
            node_rows[command.command_id].reason = "kind-not-allowed"
            await publish_event(
                tx, command_event(CommandCancelled, command, epoch, "kind-not-allowed"), hello
            )
        # held (for the quarantine, or the node for an operator): the resume rules its
        # proof stands for (a new journal, a new boot) apply, but it may be a clone's, so
        # nothing runs on its word and nothing is sent to it: what was in flight waits as
        # pending, for the dispatch loop once the hold is lifted (or the node's own session)
        held = bool(sessions[node]["held"])
        for command in () if held else plan.kept:  # the daemon runs it: as good as delivered
            node_rows[command.command_id].set(
                state="running", session_epoch=epoch, delivered_epochs=with_delivery(command, epoch)
            )
        for command in (*plan.parked, *plan.kept, *plan.resent) if held else plan.parked:
            node_rows[command.command_id].set(state="pending", session_epoch=None)
        gateway = sessions[node]["gateway_id"]
        for command in () if held else plan.resent:  # in seq order
            row = node_rows[command.command_id]
            row.set(
                state="dispatched",
                session_epoch=epoch,
                delivery_attempt=command.delivery_attempt + 1,
                delivered_epochs=with_delivery(command, epoch),
            )
            await publish_event(tx, command_event(CommandReplayed, row.command, epoch), hello)
            if gateway is not None:
                notice = dispatch_notice(row.command, epoch)
                tx.publish(
                    notice, tx.subjects.notice(gateway, notice.BC_TYPE), cause=hello, order_key=node
                )
    await _write(tx.conn, rows)
    await tx.conn.execute(RECORD_SEEN, sorted(current), [current[n].epoch for n in sorted(current)])
    await _poke(tx.conn)  # the node's pending commands may go now
    return outcomes


async def _answers(
    tx: Tx,
    facts: Sequence[Progress | Result | Rejected],
    settings: ReplaySettings,
    causes: Mapping[uuid.UUID, Hello] | None = None,
) -> dict[uuid.UUID, Outcome]:
    """Apply answers in stream order; `causes`: the Hello each result it carries continues
    (those results settle what the daemon ran before that Hello: `deliveries.settles`).
    Each answer counts for the delivery it is about (`workers.replay.deliveries`), whose
    epoch `provenance` bound to the answer's gateway."""
    ids = sorted({f.command_id for f in facts}, key=str)
    now: datetime = await tx.conn.fetchval("SELECT compute_now()")
    rows = {r["command_id"]: _row(r) for r in await tx.conn.fetch(LOCK_COMMANDS, ids)}
    outcomes: dict[uuid.UUID, Outcome] = {}
    for fact in facts:  # in stream order
        row = rows.get(fact.command_id)
        if row is None or row.command.node_id != fact.node_id:
            outcomes[fact.fact_id] = outcome.STALE  # unknown command, or not this node's
            continue
        cause = (causes or {}).get(fact.fact_id)
        if not await _answer(tx, row, fact, now, settings, cause):
            outcomes[fact.fact_id] = outcome.STALE
    await _write(tx.conn, list(rows.values()))
    return outcomes


async def _answer(
    tx: Tx,
    row: Row,
    fact: Progress | Result | Rejected,
    now: datetime,
    settings: ReplaySettings,
    hello: Hello | None,
) -> bool:
    """Apply one answer to its command's row; False: it changes nothing (stale). `hello`:
    the Hello that carried a result, else None."""
    command = row.command
    if isinstance(fact, Progress):
        moved = progress_counts(command, fact.epoch, fact.state)
        if moved is None:
            return False
        row.set(state=moved)
        return True
    if isinstance(fact, Result):
        if hello is not None:
            counts = settles(command, hello.epoch)
        else:
            counts = result_counts(command, fact.epoch)
        if not counts:
            return False  # never delivered at its epoch, or finished already
        cause: Fact = hello or fact
        row.set(state=fact.outcome)
        row.result = json.dumps(fact.result) if fact.result is not None else None
        if fact.outcome == "failed":
            row.reason = fact.error or "failed"
            await publish_event(
                tx, command_event(CommandFailed, command, fact.epoch, row.reason), cause
            )
        else:
            await publish_event(tx, command_event(CommandCompleted, command, fact.epoch), cause)
        return True
    # BUSY: about the delivery of now only; back to pending with a back-off
    if not busy_counts(command, fact.epoch):
        return False
    answers = busy_count(row.busy_attempts, row.busy_epoch, fact.epoch)
    row.busy_attempts, row.busy_epoch = answers, fact.epoch
    row.trace_context = tracing.traceparent(tx.context(fact))  # the re-dispatch continues it
    row.set(
        state="pending",
        session_epoch=None,
        not_before=now + busy_delay(answers, settings.busy_base, settings.busy_cap),
    )
    return True
