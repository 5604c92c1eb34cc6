"""A takeover attempt proves nothing (issue 58, item 4): below `require`, a compromised
gateway's unproven Hello for a node that proves its Hellos opens a session held for good —
and what that Hello and that session say of the node is not the node's. Its new journal
fails no command `journal-lost`, its new boot completes none, its running list keeps none
running; its status reports and journal events are not recorded. The node's own next
Hello (proven) finds its commands as it left them, and they finish once.

All five workers run (the quarantine's hold bound passed twice), on real servers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
from nats.aio.client import Client as NATS

from schemas.proof import prove
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.security.gateways.test_takeover import HOLD_MAX, _gateways, five_workers
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running
from workers.gateway import HelloRequest
from workers.registry import WORKERS
from workers.replay.commands import enqueue_command as enqueue
from workers.runtime.store import migrate


def _hello(boot: str, journal: str, running: list[str], gateway: str | None) -> HelloRequest:
    """n1's Hello: proven for `gateway` when given (its daemon), else the attacker's."""
    proof = None
    if gateway is not None:
        proof = prove(fleet.hello_key("n1"), "n1", boot, journal, gateway, fleet.rising_at("n1"))
    return HelloRequest(
        node_id="n1",
        cert_serial="n1-serial",
        role="worker",
        boot_id=boot,
        journal_id=journal,
        proof=proof,
        running_command_ids=running,
        process_started_at=datetime.now(UTC),  # a new process: the proof of a restart
    )


async def test_a_takeover_hello_fails_completes_and_records_nothing_of_the_node(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    await migrate.set_hello_proof(db, "warn")
    settings = five_workers(make_settings(servers.nats_url, database_url, subjects))
    async with (
        _gateways(logins, nc, subjects, db) as (attacker, honest),
        running(settings, [build(settings) for build in WORKERS.values()]),
    ):
        await fleet.join(db, "n1")
        mine = RecordingStream()
        await honest.hello(_hello("b1", "j1", [], "gw-2"), mine)
        restart = await enqueue(db, "n1", "daemon.restart", {})
        work = await enqueue(db, "n1", "exec", {"secret": "s3"})
        await eventually(lambda: _delivered(mine, 2), what="both commands delivered")
        before = await db.fetch("SELECT command_id, state FROM commands ORDER BY seq")
        trust = await db.fetchval("SELECT trust_version FROM node_sessions")

        # the attack: another journal and boot, a new process, the node's commands "running"
        evil = RecordingStream()
        welcome = await attacker.hello(_hello("evil-b", "evil-j", [str(work)], None), evil)
        await attacker.status("n1", welcome.epoch, 0, trust_version=trust + 40)
        at = datetime.now(UTC).isoformat()
        await attacker.events("n1", "evil-j", [{"seq": 1, "kind": "x", "body": {}, "at": at}])
        await asyncio.sleep(2 * HOLD_MAX.total_seconds() + 1)

        assert await db.fetch("SELECT command_id, state FROM commands ORDER BY seq") == before
        assert await db.fetchval("SELECT trust_version FROM node_sessions") == trust
        assert await db.fetchval("SELECT count(*) FROM node_events") == 0
        assert evil.delivered == []

        # the node says Hello again, proven, from a new process (it restarted, as told):
        # the restart is completed by that proof, the exec re-sent, and it finishes
        again = RecordingStream()
        await honest.hello(_hello("b1", "j1", [], "gw-2"), again)
        await eventually(lambda: _delivered(again, 1), what="the exec re-sent")
        assert [d.command_id for d in again.delivered] == [work]
        await honest.result("n1", await _epoch(db), work, "done", {"exit": 0}, None)
        await eventually(lambda: _finished(db, [restart, work]), what="both commands done")


async def _delivered(stream: RecordingStream, n: int) -> bool:
    return len(stream.delivered) >= n


async def _epoch(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'"))


async def _finished(db: asyncpg.Connection, commands: list[object]) -> bool:
    states = await db.fetch(
        "SELECT state FROM commands WHERE command_id = ANY($1::uuid[])", commands
    )
    return [r["state"] for r in states] == ["done", "done"]
