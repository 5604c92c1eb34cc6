"""A former holder's late answers, on real servers (the replay worker with its dispatch
loop, NATS and PostgreSQL), from both sides (docs/contract.md, "Facts as the seed
accepts them"): the true answer about a delivery it carried counts whatever the node's
next Hello did meanwhile — once; an answer about a delivery that never happened at its
epoch counts for nobody; and the order the facts are applied in does not change the end
state of the commands.

gw-a held n1 at epoch 1; the node reconnected through gw-b at epoch 2; gw-x never held it.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas import Fact
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.driver import Driver, driving
from tests.integration.support import eventually
from workers import replay

pytestmark = pytest.mark.slow


@pytest.fixture
async def drive(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str
) -> AsyncIterator[Driver]:
    async with driving(servers, nc, subjects, database_url, replay.build) as driver:
        yield driver


async def _enqueue(db: asyncpg.Connection, node: str = "n1") -> uuid.UUID:
    command_id: uuid.UUID = await db.fetchval(
        "SELECT enqueue_command($1, 'exec', '{}', 'default')", node
    )
    return command_id


async def _at(db: asyncpg.Connection, command_id: uuid.UUID, state: str, epoch: int) -> bool:
    row = await db.fetchrow(
        "SELECT state, session_epoch FROM commands WHERE command_id = $1", command_id
    )
    return (row["state"], row["session_epoch"]) == (state, epoch)


async def _row(db: asyncpg.Connection, command_id: uuid.UUID) -> tuple[Any, ...]:
    row = await db.fetchrow(
        "SELECT state, session_epoch, result::text AS result FROM commands WHERE command_id = $1",
        command_id,
    )
    return tuple(row)


def _answer(kind: str, gateway: str, epoch: int, command_id: uuid.UUID, **fields: Any) -> Fact:
    return make_fact(
        kind,
        node_id=fields.pop("node_id", "n1"),
        gateway_id=gateway,
        epoch=epoch,
        command_id=str(command_id),
        **fields,
    )


def _result(gateway: str, epoch: int, command_id: uuid.UUID, code: int, **kw: Any) -> Fact:
    outcome = "done" if code == 0 else "failed"
    return _answer(
        "result",
        gateway,
        epoch,
        command_id,
        outcome=outcome,
        result={"exit": code},
        error=None if code == 0 else "boom",
        **kw,
    )


def _reconnect(epoch: int, node: str = "n1", running: Sequence[uuid.UUID] = ()) -> Fact:
    """The node's Hello through gw-b at `epoch`, after gw-a's session at epoch 1."""
    return fleet.hello(
        node,
        epoch,
        gateway_id="gw-b",
        boot_id="boot-1",
        journal_id="journal-1",
        previous={
            "epoch": epoch - 1,
            "gateway_id": "gw-a" if epoch == 2 else "gw-b",
            "boot_id": "boot-1",
            "journal_id": "journal-1",
            "live": False,
        },
        running_command_ids=[str(i) for i in running],
    )


async def _moved(db: asyncpg.Connection, epoch: int, node: str = "n1") -> None:
    """What the Hello transaction of `epoch` through gw-b leaves behind."""
    await fleet.session(db, node, epoch=epoch, gateway_id="gw-b")


async def _sent(drive: Driver, command_id: uuid.UUID) -> list[int]:
    """The epochs `command_id` was sent at, in order (its dispatch notices)."""
    notices = await drive.published("dispatch", stream="notices")
    return [n["epoch"] for n in notices if n["command_id"] == str(command_id)]


async def test_a_former_holders_late_result_completes_a_command_re_sent_since_once(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """The command ran in gw-a's session; the node's next Hello was applied before gw-a's
    result, so the replay re-sent it at epoch 2. The result is true (the seed: accepted
    from any epoch): the command is done with it, once; the re-sent delivery's answer
    changes nothing; a later Hello re-sends nothing."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-a")
    command = await _enqueue(db)
    await eventually(lambda: _at(db, command, "dispatched", 1), what="dispatched at 1")
    await _moved(db, 2)
    await drive.send(_reconnect(2))
    assert await _row(db, command) == ("dispatched", 2, None)  # re-sent: gw-a's answer late
    await drive.send(_result("gw-a", 1, command, 0))
    assert await _row(db, command) == ("done", 2, '{"exit": 0}')
    # the re-sent delivery's answer, whatever it says: finished once
    await drive.send(
        _result("gw-b", 2, command, 1), _answer("progress", "gw-b", 2, command, state="running")
    )
    assert await _row(db, command) == ("done", 2, '{"exit": 0}')
    await _moved(db, 3)
    await drive.send(_reconnect(3))
    assert await _sent(drive, command) == [1, 2]  # never again
    completed = await drive.published("command.completed")
    assert [e["commandId"] for e in completed] == [str(command)]
    assert await drive.published("command.failed") == []
    assert drive.settled("stale") == 2


async def test_an_answer_about_a_delivery_that_never_was_counts_for_nobody(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """`sent` was enqueued after the node moved to gw-b: delivered at epoch 2 only. gw-a,
    which held epoch 1, cannot finish it or move it ("the former holder finishes a pending
    command" stays refused), nor the pending one; gw-x, which claims epoch 2, is foreign.
    The holder's own result does count."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-a")
    await _moved(db, 2)
    sent = await _enqueue(db)
    await eventually(lambda: _at(db, sent, "dispatched", 2), what="dispatched at 2")
    await db.execute("UPDATE node_sessions SET gateway_id = NULL")  # nothing more goes
    pending = await _enqueue(db)
    forged = [
        _result("gw-a", 1, sent, 0),
        _answer("progress", "gw-a", 1, sent, state="running"),
        _result("gw-a", 1, pending, 0),
        _result("gw-b", 2, pending, 0),  # its holder's word, but never sent to it
    ]
    await drive.send(*forged)
    await drive.send(_result("gw-x", 2, sent, 0), _result("gw-x", 2, pending, 0))
    assert await _row(db, sent) == ("dispatched", 2, None)
    assert await _row(db, pending) == ("pending", None, None)
    assert (drive.settled("stale"), drive.settled("foreign")) == (4, 2)
    await drive.send(_result("gw-b", 2, sent, 0))
    assert await _row(db, sent) == ("done", 2, '{"exit": 0}')
    assert [e["commandId"] for e in await drive.published("command.completed")] == [str(sent)]


async def test_a_busy_from_an_older_delivery_never_puts_back_a_command_re_sent_since(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """BUSY is an answer about one delivery. The command was delivered at epoch 1 and
    re-sent at 2: gw-a's BUSY about delivery 1 (true, and late) puts nothing back — the
    delivery of now is another — while gw-b's BUSY about delivery 2 does."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-a")
    command = await _enqueue(db)
    await eventually(lambda: _at(db, command, "dispatched", 1), what="dispatched at 1")
    await _moved(db, 2)
    await drive.send(_reconnect(2))
    await drive.send(_answer("rejected", "gw-a", 1, command, reason="BUSY"))
    assert await _row(db, command) == ("dispatched", 2, None)
    assert drive.settled("stale") == 1
    await db.execute("UPDATE node_sessions SET gateway_id = NULL")  # no re-dispatch to watch
    await drive.send(_answer("rejected", "gw-b", 2, command, reason="BUSY"))
    assert await _row(db, command) == ("pending", None, None)


async def test_the_order_facts_are_applied_in_does_not_change_the_commands_end_state(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """docs/runtime.md: across gateways and replicas no order is assumed. The same facts
    — gw-a's late result for `finished` and progress for `running` (epoch 1), and the
    node's Hello through gw-b (epoch 2, the daemon running `running`) — applied in every
    order, one node per order: every node's commands end the same (state, result), each
    finished command announced once."""
    orders = list(itertools.permutations(["result", "progress", "hello"]))
    nodes = [f"n{i}" for i in range(len(orders))]
    commands: dict[str, dict[str, uuid.UUID]] = {}
    for node in nodes:
        await fleet.session(db, node, epoch=1, gateway_id="gw-a")
        commands[node] = {k: await _enqueue(db, node) for k in ("finished", "running", "idle")}
    for node in nodes:
        for command in commands[node].values():
            await eventually(lambda c=command: _at(db, c, "dispatched", 1), what="dispatched")
    ends = {}
    for node, order in zip(nodes, orders, strict=True):
        ids = commands[node]
        facts = {
            "result": _result("gw-a", 1, ids["finished"], 0, node_id=node),
            "progress": _answer(
                "progress", "gw-a", 1, ids["running"], state="running", node_id=node
            ),
            "hello": _reconnect(2, node, running=[ids["running"]]),
        }
        await _moved(db, 2, node)
        for step in order:
            await drive.send(facts[step])
        ends[order] = {k: (await _row(db, c))[::2] for k, c in ids.items()}
    assert all(end == ends[orders[0]] for end in ends.values()), ends
    assert ends[orders[0]] == {
        "finished": ("done", json.dumps({"exit": 0})),
        "running": ("running", None),
        "idle": ("dispatched", None),  # re-sent at epoch 2: nobody answered for it
    }
    completed = [e["commandId"] for e in await drive.published("command.completed")]
    assert sorted(completed) == sorted(str(commands[n]["finished"]) for n in nodes)
