"""The replay worker's answers on real servers: a stale Hello, lost journals, proofs of
completion, restarts, kinds a session may not get, BUSY back-off, progress and results."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg

from schemas.subjects import Subjects
from tests.conftest import Clock
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.direct import apply, of_type, take_outbox
from tests.integration.workers.replay_steps import (
    WORKER,
    dispatch,
    enqueue,
    hello,
    states,
)


async def test_a_stale_hello_does_nothing(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await enqueue(db, "n1")
    await dispatch(pool, subjects)
    await fleet.session(db, "n1", epoch=3)
    await take_outbox(db)
    outcomes = await apply(db, WORKER, subjects, hello(2, journal_id="journal-new"))
    assert [o.kind.value for o in outcomes.values()] == ["stale"]
    assert await states(db) == [(1, "dispatched", 1, 1)]
    assert await take_outbox(db) == []


async def test_a_lost_journal_fails_in_flight_commands_and_never_resends_them(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    for _ in range(3):
        await enqueue(db, "n1")
    await dispatch(pool, subjects, credits=2)
    await take_outbox(db)
    await fleet.session(db, "n1", epoch=2, journal_id="journal-2")
    await apply(db, WORKER, subjects, hello(2, journal_id="journal-2"))
    assert [s for _, s, _, _ in await states(db)] == ["failed", "failed", "pending"]
    assert await db.fetchval(
        "SELECT array_agg(DISTINCT failure_reason) FROM commands WHERE state = 'failed'"
    ) == ["journal-lost"]
    out = await take_outbox(db)
    assert [(e["seq"], e["reason"]) for e in of_type(out, "command.failed")] == [
        (1, "journal-lost"),
        (2, "journal-lost"),
    ]
    assert of_type(out, "dispatch") == []
    assert await dispatch(pool, subjects) == 1  # the pending one goes to the new session


async def test_process_ending_commands_complete_by_proof(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    reboot = await enqueue(db, "n1", "node.reboot")
    upgrade = await enqueue(db, "n1", "daemon.upgrade", lane="system", target_version="2.0.0")
    await dispatch(pool, subjects)
    await take_outbox(db)
    await fleet.session(db, "n1", epoch=2, boot_id="boot-2")
    await apply(db, WORKER, subjects, hello(2, boot_id="boot-2", daemon_version="2.0.0"))
    assert [s for _, s, _, _ in await states(db)] == ["done", "done"]
    out = await take_outbox(db)
    assert sorted(
        (e["commandId"], e["reason"]) for e in of_type(out, "command.completed")
    ) == sorted([(str(reboot), "rebooted"), (str(upgrade), "upgraded")])


async def test_a_restart_lost_before_delivery_is_replayed_a_new_process_completes_it(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    restart = await enqueue(db, "n1", "daemon.restart", lane="system")
    await dispatch(pool, subjects)
    await take_outbox(db)
    dispatched_at = await db.fetchval("SELECT updated_at FROM commands")
    started_before = (dispatched_at - timedelta(minutes=5)).isoformat()
    # the same process reconnects: the notice never reached it; absent is not proof
    await fleet.session(db, "n1", epoch=2)
    await apply(db, WORKER, subjects, hello(2, process_started_at=started_before))
    assert await states(db) == [(1, "dispatched", 2, 2)]
    replayed = of_type(await take_outbox(db), "dispatch")
    assert [(n["command_id"], n["attempt"]) for n in replayed] == [(str(restart), 2)]
    # the daemon restarts after receiving it: its new process proves it
    started_after = await db.fetchval("SELECT updated_at FROM commands") + timedelta(seconds=1)
    await fleet.session(db, "n1", epoch=3)
    await apply(db, WORKER, subjects, hello(3, process_started_at=started_after.isoformat()))
    assert await states(db) == [(1, "done", 2, 2)]
    done = of_type(await take_outbox(db), "command.completed")
    assert [(e["commandId"], e["reason"]) for e in done] == [(str(restart), "restarted")]


async def test_kind_not_allowed_upgrade_only_and_websocket(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await enqueue(db, "n1", "exec")
    await enqueue(db, "n1", "forbidden")
    await enqueue(db, "n1", "daemon.upgrade", lane="system", target_version="3")
    await dispatch(pool, subjects)
    await take_outbox(db)
    await fleet.session(db, "n1", epoch=2)
    await db.execute("UPDATE node_sessions SET upgrade_required = true WHERE node_id = 'n1'")
    await apply(
        db,
        WORKER,
        subjects,
        hello(
            2,
            upgrade_required=True,
            cert={"serial": "n1-serial", "allowed_kinds": ["exec", "daemon.upgrade"]},
        ),
    )
    assert await states(db) == [
        (1, "pending", None, 1),
        (2, "cancelled", 1, 1),
        (3, "dispatched", 2, 2),
    ]
    out = await take_outbox(db)
    assert [e["reason"] for e in of_type(out, "command.cancelled")] == ["kind-not-allowed"]
    assert [n["kind"] for n in of_type(out, "dispatch")] == ["daemon.upgrade"]
    assert await dispatch(pool, subjects) == 0  # exec waits for a session at a supported version
    await fleet.session(db, "n1", epoch=3)
    await db.execute(
        "UPDATE node_sessions SET upgrade_required = false, transport = 'websocket' WHERE node_id = 'n1'"
    )
    assert await dispatch(pool, subjects) == 0  # unsigned: not over websocket
    await db.execute("UPDATE node_sessions SET transport = 'grpc' WHERE node_id = 'n1'")
    assert await dispatch(pool, subjects) == 1


async def test_busy_backs_off_1_2_4_8_16_30_30_and_restarts_with_a_new_session(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects, clock: Clock
) -> None:
    await fleet.session(db, "n1", epoch=1)
    command = await enqueue(db, "n1")
    delays = []
    for epoch in [1, 1, 1, 1, 1, 1, 1, 2, 2]:
        if (
            epoch == 2
            and (await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'"))
            == 1
        ):
            await fleet.session(db, "n1", epoch=2)
        assert await dispatch(pool, subjects) == 1
        busy = make_fact(
            "rejected", node_id="n1", epoch=epoch, command_id=str(command), reason="BUSY"
        )
        await apply(db, WORKER, subjects, busy)
        wait = await db.fetchval(
            "SELECT not_before - compute_now() FROM commands WHERE command_id = $1", command
        )
        delays.append(round(wait.total_seconds()))
        assert await dispatch(pool, subjects) == 0  # not before the back-off
        await clock.advance(wait + timedelta(milliseconds=10))
    assert delays == [1, 2, 4, 8, 16, 30, 30, 1, 2]
    assert (await states(db))[0][1] == "pending"  # not terminal, nothing dropped


async def test_busy_for_an_old_epoch_or_an_acked_command_changes_nothing(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    first = await enqueue(db, "n1")
    second = await enqueue(db, "n1")
    await dispatch(pool, subjects)
    await apply(
        db,
        WORKER,
        subjects,
        make_fact("progress", node_id="n1", epoch=1, command_id=str(second), state="acked"),
    )
    outcomes = await apply(
        db,
        WORKER,
        subjects,
        make_fact("rejected", node_id="n1", epoch=7, command_id=str(first), reason="BUSY"),
        make_fact("rejected", node_id="n1", epoch=1, command_id=str(second), reason="BUSY"),
    )
    # epoch 7 was never issued (to gw-1 or anyone): foreign; the acked one is stale
    assert [o.kind.value for o in outcomes.values()] == ["foreign", "stale"]
    assert [s for _, s, _, _ in await states(db)] == ["dispatched", "acked"]


async def test_progress_forward_only_and_results_once(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    command = await enqueue(db, "n1")
    await dispatch(pool, subjects)
    await take_outbox(db)

    def progress(state: str) -> Any:
        return make_fact("progress", node_id="n1", epoch=1, command_id=str(command), state=state)

    def result(outcome: str) -> Any:
        return make_fact(
            "result",
            node_id="n1",
            epoch=1,
            command_id=str(command),
            outcome=outcome,
            result={"exit": 0},
            error=None,
        )

    await apply(db, WORKER, subjects, progress("running"), progress("acked"))
    assert (await states(db))[0][1] == "running"
    done = result("done")
    await apply(db, WORKER, subjects, done)
    await apply(
        db, WORKER, subjects, result("failed"), progress("acked")
    )  # replayed and late: no-ops
    row = await db.fetchrow("SELECT state, result::text AS result, failure_reason FROM commands")
    assert (row["state"], row["result"], row["failure_reason"]) == ("done", '{"exit": 0}', None)
    out = await take_outbox(db)
    assert [e["_type"] for e in out] == ["command.completed"]
    # completed when its result was stored (applied here without the stream: when its
    # gateway observed it)
    assert datetime.fromisoformat(out[0]["at"]) == done.observed_at


async def test_a_result_frees_a_credit_for_the_next_command(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    first = await enqueue(db, "n1")
    await enqueue(db, "n1")
    assert await dispatch(pool, subjects, credits=1) == 1
    assert await dispatch(pool, subjects, credits=1) == 0
    await apply(
        db,
        WORKER,
        subjects,
        make_fact(
            "result",
            node_id="n1",
            epoch=1,
            command_id=str(first),
            outcome="done",
            result=None,
            error=None,
        ),
    )
    assert await dispatch(pool, subjects, credits=1) == 1


async def test_results_a_hello_carries_settle_before_its_replay(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    """As of the Hello (docs/contract.md): a command that finished while the node was away
    is done once, by the result its Hello carries; it is neither re-sent nor announced
    replayed. A failed one keeps its whole error; its event's reason is cut to 1,024."""
    await fleet.session(db, "n1", epoch=1)
    done, failed, lost = [await enqueue(db, "n1") for _ in range(3)]
    await dispatch(pool, subjects)
    await take_outbox(db)
    await fleet.session(db, "n1", epoch=2)
    error = "x" * 4096
    reconnect = hello(
        2,
        results=[
            {"command_id": str(done), "outcome": "done", "result": {"exit": 0}},
            {"command_id": str(failed), "outcome": "failed", "error": error},
        ],
    )
    await apply(db, WORKER, subjects, reconnect)
    rows = await db.fetch(
        "SELECT command_id, state, delivery_attempt, failure_reason FROM commands ORDER BY seq"
    )
    assert [(r["command_id"], r["state"], r["delivery_attempt"]) for r in rows] == [
        (done, "done", 1),
        (failed, "failed", 1),
        (lost, "dispatched", 2),
    ]
    assert rows[1]["failure_reason"] == error
    out = await take_outbox(db)
    assert [(e["_type"], e["commandId"]) for e in out if e["_type"].startswith("command.")] == [
        ("command.completed", str(done)),
        ("command.failed", str(failed)),
        ("command.replayed", str(lost)),
    ]
    assert [e["reason"] for e in of_type(out, "command.failed")] == ["x" * 1024]
    assert [n["command_id"] for n in of_type(out, "dispatch")] == [str(lost)]
    # the same result again, as a fact of its own (a redelivery, a late copy): nothing
    late = make_fact(
        "result", node_id="n1", epoch=2, command_id=str(done), outcome="done", result={}
    )
    await apply(db, WORKER, subjects, late, reconnect)
    assert [e for e in await take_outbox(db) if e["_type"].startswith("command.")] == []
