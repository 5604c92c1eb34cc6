"""Scenarios of the simulator: what fleets do, and checks of what the workers made of it.

Each scenario drives a started `Simulator` (with the five workers running against the
same servers) and returns `Check`s; `mixed` chains them the way `bcw demo` shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from workers.sim.daemon import FakeDaemon
from workers.sim.simulator import Check, Simulator

Scenario = Callable[[Simulator], Awaitable[list[Check]]]


def check(name: str, expected: object, actual: object, ok: bool | None = None) -> Check:
    return Check(name, str(expected), str(actual), expected == actual if ok is None else ok)


async def _count(sim: Simulator, sql: str, *args: object) -> int:
    return int(await sim.fetchval(sql, *args))  # type: ignore[call-overload]


async def _never() -> bool:
    return False


async def power_on(sim: Simulator) -> list[Check]:
    """The whole fleet switched on at once: the gateways' handshake bucket and pending
    limit push back (jittered retries) until every node is connected and labeled."""
    everyone = len(sim.daemons)
    wanted_labels = sum(len(d.capabilities) for d in sim.daemons)
    label_count = "SELECT count(*) FROM node_labels WHERE node_id LIKE $1 AND source = 'system'"

    async def connected_and_labeled() -> bool:
        return (
            await sim.connected() >= everyone
            and await _count(sim, label_count, sim.prefix + "-%") == wanted_labels
        )

    await sim.run(connected_and_labeled, within=90, speed=2, what="power-on")
    pushed_back = sum(d.refusals["RESOURCE_EXHAUSTED"] for d in sim.daemons)
    return [
        check("nodes connected after power-on", everyone, await sim.connected()),
        check(
            "capability labels", wanted_labels, await _count(sim, label_count, sim.prefix + "-%")
        ),
        check("Hellos pushed back and retried", "any", pushed_back, ok=True),
    ]


async def commands_done(sim: Simulator, within: float = 90, speed: float = 10) -> bool:
    """Every command of a node that is not quarantined is done, failed or cancelled."""

    async def done() -> bool:
        return (
            await _count(
                sim,
                "SELECT count(*) FROM commands c WHERE c.node_id LIKE $1 "
                "AND c.state NOT IN ('done', 'failed', 'cancelled') "
                "AND EXISTS (SELECT 1 FROM node_certs n WHERE n.node_id = c.node_id AND n.revoked_at IS NULL)",
                sim.prefix + "-%",
            )
            == 0
        )

    return await sim.run(done, within=within, speed=speed, what="commands finishing")


async def busy(sim: Simulator, nodes: int = 20, per_node: int = 6) -> list[Check]:
    """Daemons with one credit per lane get several commands: they answer BUSY, the
    commands back off (1, 2, 4 … 30 s) and go again, and all complete; once their
    heartbeats have told dispatch their credits, it sends no more than they can take."""
    chosen = sim.daemons[:nodes]
    ids = [d.node_id for d in chosen]
    answered_before = sum(d.busy_answers for d in chosen)
    for daemon in chosen:
        daemon.lane_credits = 1
    await sim.enqueue(chosen, per_node)
    converged = await commands_done(sim)
    answers = sum(d.busy_answers for d in chosen) - answered_before
    of_chosen = (
        "SELECT count(*) FROM commands WHERE node_id = ANY($1::text[]) AND busy_attempts > 0"
    )
    delayed = await _count(sim, of_chosen, ids)
    delayed_done = await _count(sim, of_chosen + " AND state = 'done'", ids)
    for daemon in chosen:
        daemon.lane_credits = 4
    return [
        # fewer once dispatch knows the daemons' credits from their heartbeats (the first
        # dispatch still assumes the credits it knew: the drop to 1 is news to it)
        check("BUSY answers", "any", answers, ok=True),
        check("BUSY-delayed commands", "> 0", delayed, ok=delayed > 0),
        check(
            "BUSY-delayed commands completed",
            delayed,
            delayed_done,
            ok=converged and delayed == delayed_done,
        ),
    ]


# Commands of the given nodes from each node's own first seq on, in some state (`$1` the
# node ids, `$2` each one's first seq; append the condition).
FROM_SEQ = (
    "SELECT count(*) FROM commands c JOIN unnest($1::text[], $2::bigint[]) AS f(node_id, first)"
    " ON c.node_id = f.node_id WHERE c.seq >= f.first AND "
)


async def _next_seqs(sim: Simulator, ids: list[str]) -> list[int]:
    """Each node's own next command seq: nodes' counters differ (a lost gateway gave some
    of them a command more), so one number for all would miscount."""
    firsts: list[int] = await sim.fetchval(  # type: ignore[assignment]
        "SELECT array_agg((SELECT coalesce(max(seq), 0) + 1 FROM commands WHERE node_id = n)"
        " ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY AS t(n, i)",
        ids,
    )
    return firsts


async def _two_commands_running(sim: Simulator, chosen: list[FakeDaemon]) -> list[int]:
    """Gives each chosen daemon two long commands and waits until they all run; the
    daemons' later work is quick again. Returns each node's first seq of the two."""
    ids = [d.node_id for d in chosen]
    for daemon in chosen:
        daemon.work_seconds = (600.0, 900.0)
    firsts = await _next_seqs(sim, ids)
    await sim.enqueue(chosen, 2)

    async def running() -> bool:
        return await _count(sim, FROM_SEQ + "state = 'running'", ids, firsts) == 2 * len(chosen)

    await sim.run(running, within=30, speed=2)
    for daemon in chosen:
        daemon.work_seconds = (0.2, 1.0)
    return firsts


async def journal_loss(sim: Simulator, nodes: int = 10) -> list[Check]:
    """Nodes lose their disk while commands run: those commands fail `journal-lost`,
    never re-sent blindly; the node's later commands go to the new journal."""
    chosen = sim.daemons[-nodes - 1 : -1]
    ids = [d.node_id for d in chosen]
    firsts = await _two_commands_running(sim, chosen)  # still running when the disk goes
    for daemon in chosen:
        daemon.lose_journal()

    async def failed() -> bool:
        return (
            await _count(sim, FROM_SEQ + "failure_reason = 'journal-lost'", ids, firsts)
            == 2 * nodes
        )

    await sim.run(failed, within=30, speed=2)
    lost = await _count(sim, FROM_SEQ + "failure_reason = 'journal-lost'", ids, firsts)
    await sim.enqueue(chosen, 1)
    await commands_done(sim)
    after = await _count(sim, FROM_SEQ + "state = 'done'", ids, [f + 2 for f in firsts])
    return [
        check("commands failed journal-lost", 2 * nodes, lost),
        check("commands done on the new journal", nodes, after),
    ]


async def restart(sim: Simulator, nodes: int = 10) -> list[Check]:
    """Daemon processes crash and start again (same boot, same journal) while commands
    run: a new process holds none of the old one's commands, so its Hello lists none and
    the replay re-sends each of them (the seed's crash rules); they complete."""
    chosen = sim.daemons[1 : nodes + 1]  # not the clone scenario's first daemon
    ids = [d.node_id for d in chosen]
    firsts = await _two_commands_running(sim, chosen)  # still running when the process goes
    for daemon in chosen:
        daemon.crash()

    async def resent_and_done() -> bool:
        done = FROM_SEQ + "state = 'done' AND delivery_attempt >= 2"
        return await _count(sim, done, ids, firsts) == 2 * len(chosen)

    await sim.run(resent_and_done, within=60, speed=5, what="restart")
    resent = await _count(sim, FROM_SEQ + "state = 'done' AND delivery_attempt >= 2", ids, firsts)
    return [check("commands re-sent after a daemon restart, then done", 2 * len(chosen), resent)]


async def reconnect(sim: Simulator, nodes: int = 10) -> list[Check]:
    """Nodes reconnect while commands are enqueued for them. Each command is enqueued inside
    its node's Hello, on the gateway (its test hook): once the Hello transaction committed,
    before the session is registered or before its Welcome (the seeded choice), so its
    dispatch reaches the gateway before the daemon has its Welcome. Every command finishes,
    and no node needs a Hello beyond the reconnect."""
    chosen = sim.rng.sample(sim.daemons[1:], min(nodes, len(sim.daemons) - 1))
    windows = {d.node_id: sim.rng.choice(("committed", "registered")) for d in chosen}
    enqueued: list[object] = []

    async def in_the_window(point: str, node_id: str, epoch: int) -> None:
        if windows.get(node_id) != point:
            return
        del windows[node_id]  # once a node
        enqueued.append(await sim.fetchval("SELECT enqueue_command($1, 'exec', '{}')", node_id))
        await asyncio.sleep(0.3)  # the window held open: its dispatch arrives meanwhile

    before = {d.node_id: d.welcomes for d in chosen}
    for gateway in sim.gateways:
        gateway.pause = in_the_window
    try:
        for daemon in chosen:
            daemon.crash()  # a new process: it says Hello at once
        finished = await commands_done(sim, within=60, speed=2)
    finally:
        for gateway in sim.gateways:
            gateway.pause = None
    beyond = sum(d.welcomes - before[d.node_id] - 1 for d in chosen)
    return [
        check("commands enqueued inside a reconnect's Hello", len(chosen), len(enqueued)),
        check("every command finished, no second Hello", True, finished),
        check("Hellos beyond the reconnect", 0, beyond),
    ]


async def clone(sim: Simulator, original: FakeDaemon | None = None) -> list[Check]:
    """One identity on two machines (the first daemon's, unless told): they alternate
    until the node is quarantined and both are refused."""
    original = original or sim.daemons[0]
    twin = original.clone(home=original.home + 1)
    sim.daemons.append(twin)

    async def revoked() -> bool:
        return bool(await sim.fetchval("SELECT is_revoked($1)", original.serial))

    quarantined = await sim.run(revoked, within=60, speed=10, what="clone")
    await sim.run(_never, within=2, speed=5)
    sim.daemons.remove(twin)
    refused = original.refusals["UNAUTHENTICATED"] + twin.refusals["UNAUTHENTICATED"]
    return [
        check("clone quarantined (certificate revoked)", True, quarantined),
        check("clone refused afterwards", "> 0", refused, ok=refused > 0),
    ]


async def gateway_loss(sim: Simulator) -> list[Check]:
    """A gateway dies with its rack cut off: commands routed to it meanwhile are never
    delivered; after its lease and the 120 s grace its sessions are disconnected
    `gateway-lost`; when the rack is back, its nodes reconnect elsewhere and what was in
    flight is replayed."""
    # the live gateway holding the most sessions (on a loaded machine one may have lost
    # its lease already, and its nodes gone elsewhere)
    victim = max(
        (g for g in sim.gateways if g.alive),
        key=lambda g: sum(d.gateway is g for d in sim.daemons),
    )
    stranded = [d for d in sim.daemons if d.gateway is victim]
    ids = [d.node_id for d in stranded]
    for daemon in stranded:
        daemon.partitioned = True
    # its link to the bus goes first: commands are dispatched to it while its lease holds
    # (however late the dispatcher runs), and never delivered; then it dies
    await victim.notices.stop()
    since = await sim.fetchval("SELECT now()")
    await sim.enqueue(stranded, 1)
    routed_sql = "SELECT count(*) FROM commands WHERE node_id = ANY($1::text[]) AND created_at >= $2 AND delivery_attempt >= 1"

    async def routed() -> bool:
        return await _count(sim, routed_sql, ids, since) == len(ids)

    await sim.run(routed, within=60, speed=1, what="dispatch to the cut-off gateway")
    await victim.stop(graceful=False)
    lost_sql = "SELECT count(*) FROM node_sessions WHERE node_id = ANY($1::text[]) AND disconnect_reason = 'gateway-lost'"

    async def lost() -> bool:
        return await _count(sim, lost_sql, ids) == len(ids)

    await sim.run(lost, within=60, speed=10, what="gateway loss")
    disconnected = await _count(sim, lost_sql, ids)
    for daemon in stranded:
        daemon.partitioned = False
        daemon.failures = 0
        daemon.next_try = sim.clock()
    back_sql = "SELECT count(*) FROM node_sessions WHERE node_id = ANY($1::text[]) AND gateway_id IS NOT NULL"

    async def back() -> bool:
        return await _count(sim, back_sql, ids) == len(ids)

    await sim.run(back, within=60, speed=5, what="reconnect")
    reconnected = await _count(sim, back_sql, ids)
    await commands_done(sim)
    replayed = await _count(
        sim,
        "SELECT count(*) FROM commands WHERE node_id = ANY($1::text[]) AND created_at >= $2 "
        "AND delivery_attempt >= 2 AND state = 'done'",
        ids,
        since,
    )
    return [
        check("sessions disconnected gateway-lost", len(ids), disconnected),
        check("stranded nodes reconnected elsewhere", len(ids), reconnected),
        check("undelivered commands replayed and done", len(ids), replayed),
    ]


async def mixed(sim: Simulator) -> list[Check]:
    """What the demo shows: power-on, commands, BUSY, lost journals, restarted daemons, a clone, a lost
    gateway (its undelivered commands replayed on reconnect), then convergence."""
    checks = await power_on(sim)
    await sim.enqueue(sim.daemons, 2)
    checks += await busy(sim, nodes=max(1, len(sim.daemons) // 50))
    checks += await journal_loss(sim, nodes=max(1, len(sim.daemons) // 100))
    checks += await restart(sim, nodes=max(1, min(10, len(sim.daemons) // 100)))
    checks += await clone(sim)
    checks += await gateway_loss(sim)
    converged = await commands_done(sim, within=90)
    events = await sim.events()
    replayed = events[("command.replayed", "")]
    gateway_lost = events[("node.disconnected", "gateway-lost")]
    dead = await sim.dead_letters()
    checks += [
        check("every command finished (but the quarantined node's)", True, converged),
        check("commands replayed on reconnect", "> 0", replayed, ok=replayed > 0),
        check("node.disconnected gateway-lost events", "> 0", gateway_lost, ok=gateway_lost > 0),
        check(
            "security.node.quarantined events",
            1,
            events[("security.node.quarantined", "duplicate-identity")],
        ),
        check("nodes connected at the end", len(sim.daemons) - 1, await sim.connected()),
        check("dead letters", 0, dead),
    ]
    return checks


SCENARIOS: dict[str, Scenario] = {
    "power-on": power_on,
    "gateway-loss": gateway_loss,
    "clone": clone,
    "journal-loss": journal_loss,
    "restart": restart,
    "reconnect": reconnect,
    "busy": busy,
    "mixed": mixed,
}
