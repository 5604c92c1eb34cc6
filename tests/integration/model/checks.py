"""What must hold of the world, the seed's rules and the attacker's at once: after every
step (`always`) and once an example has run out and every participant had its chance
(`at_the_end`). Each check returns the ways it fails (empty: it holds)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from tests.integration.model.world import World

TERMINAL = ("done", "failed", "cancelled")
ENDINGS = ("command.completed", "command.failed", "command.cancelled")
#: the seed: more than 3 alternations within 10 minutes quarantine the certificate
MAX_ALTERNATIONS, WINDOW = 3, timedelta(minutes=10)


async def always(world: World) -> list[str]:
    wrong: list[str] = []
    rows = {
        r["node_id"]: r
        for r in await world.fetch(
            "SELECT node_id, session_epoch, gateway_id FROM node_sessions WHERE node_id = ANY($1)",
            [n.node_id for n in world.nodes],
        )
    }
    for node in world.nodes:
        row = rows[node.node_id]
        if node.epochs and row["session_epoch"] < node.epochs[-1]:
            wrong.append(
                f"{node.node_id}: epoch went back {node.epochs[-1]} -> {row['session_epoch']}"
            )
        node.epochs.append(row["session_epoch"])
        holders = [
            g.gateway_id
            for g in [*world.gateways, world.hostile]
            if g is not None
            and g.alive
            and (s := g.sessions.get(node.node_id)) is not None
            and s.epoch == row["session_epoch"]
        ]
        if len(holders) > 1 or (holders and holders[0] != row["gateway_id"]):
            wrong.append(f"{node.node_id}: live routed sessions {holders}, row {row['gateway_id']}")
        if node.attacker is not None and world.watch[id(node.attacker)].deliveries:
            wrong.append(f"{node.node_id}: the attacker's session got commands")
    wrong += await _in_seq_order(world)
    for daemon in world.daemons():  # a run a new process cut off is re-sent: not a second
        twice = [c for c, n in daemon.runs.items() if n - daemon.cut_off[c] > 1]
        if twice:
            label = world.watch[id(daemon)].label
            wrong.append(f"{label} ran {len(twice)} command(s) twice: {twice[:3]}")
    return wrong


async def _in_seq_order(world: World) -> list[str]:
    """The seed: a Hello re-sends in seq order, and dispatch sends pending commands in seq
    order per node: what one session is sent comes in seq order, but for a command a BUSY
    put back (sent again after later ones)."""
    rows = await world.fetch(
        "SELECT command_id, seq, busy_attempts FROM commands WHERE node_id = ANY($1)",
        [n.node_id for n in world.nodes],
    )
    seq = {r["command_id"]: r["seq"] for r in rows}
    busy = {r["command_id"] for r in rows if r["busy_attempts"]}
    wrong = []
    for watch in world.watch.values():
        by_epoch: dict[int, list[int]] = {}
        for epoch, command in watch.deliveries:
            if command not in busy:
                by_epoch.setdefault(epoch, []).append(seq[command])
        for epoch, seqs in by_epoch.items():
            if seqs != sorted(seqs):
                wrong.append(f"{watch.label}: epoch {epoch} sent out of seq order: {seqs}")
    return wrong


async def endings(world: World) -> Counter[uuid.UUID]:
    """How many times each command of this example's nodes was announced ended."""
    js = world.nc.jetstream()
    sub = await js.pull_subscribe(
        world.subjects.all_events,
        durable=None,
        stream=world.subjects.events_stream,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30
        ),
    )
    counts: Counter[uuid.UUID] = Counter()
    nodes = {n.node_id for n in world.nodes}
    try:
        total = (await sub.consumer_info()).num_pending or 0
        seen = 0
        while seen < total:
            msgs = await sub.fetch(min(1000, total - seen), timeout=5)
            for msg in msgs:
                kind = (msg.headers or {}).get("Bc-Type")
                body = json.loads(msg.data)
                if kind in ENDINGS and body.get("nodeId", body.get("node_id")) in nodes:
                    counts[uuid.UUID(body.get("commandId", body.get("command_id")))] += 1
            seen += len(msgs)
    finally:
        await sub.unsubscribe()
    return counts


async def at_the_end(world: World, lost_journal: set[str]) -> list[str]:
    wrong = await always(world)
    nodes = [n.node_id for n in world.nodes]
    commands = await world.fetch(
        "SELECT command_id, node_id, state, failure_reason FROM commands WHERE node_id = ANY($1)",
        nodes,
    )
    revoked = {
        r["node_id"]: r["at"]
        for r in await world.fetch(
            "SELECT node_id, min(revoked_at) AS at FROM node_certs "
            "WHERE node_id = ANY($1) AND revocation_reason = 'duplicate-identity' "
            "GROUP BY node_id",
            nodes,
        )
    }
    ended = await endings(world)
    true_results = {
        r.command_id
        for answers in world.answers.values()
        if answers.gateway.gateway_id != (world.hostile.gateway_id if world.hostile else None)
        for r in answers.true_results
    }
    for c in commands:
        cid, state = c["command_id"], c["state"]
        if state not in TERMINAL and c["node_id"] not in revoked:
            wrong.append(f"command {cid} of {c['node_id']} stranded {state}")
        if state in TERMINAL and ended[cid] != 1:
            wrong.append(f"command {cid} {state}, announced ended {ended[cid]} times")
        if state not in TERMINAL and ended[cid]:
            wrong.append(f"command {cid} {state}, yet announced ended")
        if cid in true_results and state != "done":
            lost = state == "failed" and c["failure_reason"] == "journal-lost"
            if not (lost and c["node_id"] in lost_journal):
                wrong.append(f"command {cid}: its true result was not applied ({state})")
    wrong += await _quarantines(world, revoked)
    return wrong


async def _quarantines(world: World, revoked: dict[str, object]) -> list[str]:
    """The seed's quarantine against what the Hello transactions recorded: at `require`,
    a fourth proven alternation within the window revokes; nothing else revokes for a
    duplicate identity; no session opened after the revocation gets a command."""
    wrong: list[str] = []
    for node in world.nodes:
        duplicates = await world.fetch(
            "SELECT epoch, issued_at, proven FROM session_epochs WHERE node_id = $1 "
            "AND previous_live AND previous_boot_id IS DISTINCT FROM boot_id ORDER BY epoch",
            node.node_id,
        )
        due = _quarantined_at(duplicates)
        if world.policy == "require" and due is not None and node.node_id not in revoked:
            wrong.append(f"{node.node_id}: {MAX_ALTERNATIONS + 1} alternations, not revoked")
        if node.node_id in revoked and due is None:
            wrong.append(f"{node.node_id}: revoked without {MAX_ALTERNATIONS + 1} alternations")
        if node.node_id in revoked:
            issued = {
                r["epoch"]: r["issued_at"]
                for r in await world.fetch(
                    "SELECT epoch, issued_at FROM session_epochs WHERE node_id = $1", node.node_id
                )
            }
            for daemon in (node.honest, node.clone, node.attacker):
                if daemon is None:
                    continue
                late = [
                    c
                    for epoch, c in world.watch[id(daemon)].deliveries
                    if epoch in issued and issued[epoch] > revoked[node.node_id]
                ]
                if late:
                    wrong.append(f"{node.node_id}: a session opened after revocation got {late}")
    return wrong


def _quarantined_at(duplicates: list[Any]) -> int | None:
    """The epoch of the first alternation the seed quarantines at, or None."""
    count, since = 0, None
    for d in duplicates:
        if since is None or d["issued_at"] - since > WINDOW:
            count, since = 1, d["issued_at"]
        else:
            count += 1
        if count > MAX_ALTERNATIONS:
            return int(d["epoch"])
    return None
