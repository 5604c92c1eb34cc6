"""The fake daemon as the seed's `bcd`, against a reference gateway on real servers: it
honours the Welcome's acked event sequence and credits, keeps its server-time mark across
a lost journal (a Welcome 4 minutes behind it is taken, 6 minutes ends the session),
reports its status with the trust it holds, never fences on the epoch, and answers the
replay of a command it finished from its journal, never running it again."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import replace

import asyncpg
from nats.aio.client import Client as NATS

from schemas import REGISTRY
from schemas.notices import Dispatch
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.support import eventually, stream_messages
from workers.gateway import Gateway
from workers.runtime.store import migrate
from workers.sim.daemon import FakeDaemon


def dispatch(daemon: FakeDaemon, seq: int, epoch: int | None = None) -> Dispatch:
    return Dispatch(
        node_id=daemon.node_id,
        epoch=epoch or daemon.epoch,
        command_id=uuid.uuid4(),
        seq=seq,
        kind="exec",
        lane="default",
        attempt=1,
        payload={},
    )


async def _facts(nc: NATS, subjects: Subjects, kind: str) -> list[dict[str, object]]:
    messages = await stream_messages(nc.jetstream(), subjects.facts_stream)
    return [json.loads(m.data) for m in messages if m.headers["Bc-Type"] == kind]


async def test_it_forgets_the_events_the_welcome_says_are_held_and_resends_the_rest(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    # its clock is not the fleet's (it proves no Hello): a node without a key, at warn
    await migrate.set_hello_proof(db, "warn")
    await fleet.join(db, "n1", key=False)
    now = [1_000.0]
    daemon = FakeDaemon("n1", "n1-serial", lambda: now[0], random.Random(1))
    await daemon.tick([gateway])
    await gateway.disconnect("n1", daemon.epoch)
    daemon.drop("test")
    for i in range(5):
        daemon._journal("test.event", {"i": i})
    first_seq = daemon.journal[0]["seq"]
    # the control plane holds its journal up to the third of them
    await db.execute("UPDATE node_sessions SET acked_event_seq = $1", first_seq + 2)
    daemon.next_try = 0.0
    await daemon.tick([gateway])  # Hello → Welcome (acked_event_seq), then its reports
    assert daemon.epoch == 2 and [e["seq"] for e in daemon.journal][:1] == [first_seq + 3]
    await daemon.tick([gateway])  # its reports: the events after the acked ones

    async def sent() -> bool:
        events = await _facts(nc, subjects, "events")
        return bool(events) and any(e["events"] for e in events)

    await eventually(sent, what="the events sent again")
    seqs = [e["seq"] for f in await _facts(nc, subjects, "events") for e in f["events"]]  # type: ignore[attr-defined]
    assert first_seq + 3 in seqs and all(s > first_seq + 2 for s in seqs)


async def test_it_holds_no_more_per_lane_than_the_welcome_allows_and_never_fences_on_the_epoch(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    gateway.settings = replace(gateway.settings, credits=1)
    daemon = FakeDaemon(
        "n1",
        "n1-serial",
        time.time,
        random.Random(1),
        lane_credits=4,
        hello_key=fleet.hello_key("n1"),
    )
    await daemon.tick([gateway])
    assert (daemon.welcome_credits, daemon.credits_per_lane) == (1, 1)
    # a dispatch naming another epoch is run all the same: only the gateway fences
    other = dispatch(daemon, 1, epoch=daemon.epoch + 5)
    await daemon.deliver(other)
    assert other.command_id in daemon.running
    await daemon.deliver(dispatch(daemon, 2))  # the lane's one credit is taken
    assert daemon.busy_answers == 1 and len(daemon.running) == 1
    assert daemon.free_credits()["default"] == 0


async def test_its_mark_survives_a_lost_journal_and_bounds_how_far_behind_a_welcome_may_be(
    gateway: Gateway, db: asyncpg.Connection, pool: asyncpg.Pool, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    four = Provisioned("gw-four", pool, nc, subjects, wall=lambda: time.time() - 240)
    six = Provisioned("gw-six", pool, nc, subjects, wall=lambda: time.time() - 360)
    await four.start()
    await six.start()
    try:
        daemon = FakeDaemon(
            "n1", "n1-serial", time.time, random.Random(1), hello_key=fleet.hello_key("n1")
        )
        await daemon.tick([gateway])
        mark = daemon.server_time_mark
        assert mark > 0
        await gateway.disconnect("n1", daemon.epoch)
        daemon.lose_journal()  # a reinstalled disk: the mark stays
        assert daemon.server_time_mark == mark
        daemon.next_try = 0.0
        await daemon.tick([six])  # 6 minutes behind the mark: ends the session
        assert daemon.gateway is None and daemon.behind_welcomes == 1
        daemon.next_try = 0.0
        await daemon.tick([four])  # 4 minutes behind: taken
        assert daemon.gateway is four and daemon.behind_welcomes == 1
        assert daemon.server_time_mark == mark  # never back
    finally:
        await four.stop(graceful=False)
        await six.stop(graceful=False)


async def test_its_status_report_carries_the_trust_version_and_the_approver_set_it_holds(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    await db.fetchval("SELECT set_node_spec('n1', '{\"sysctl\": {}}'::jsonb)")
    daemon = FakeDaemon(
        "n1",
        "n1-serial",
        time.time,
        random.Random(1),
        trust_version=2,
        approver_set=(3, "a" * 64),
        hello_key=fleet.hello_key("n1"),
    )
    await daemon.tick([gateway])  # its Hello, then the desired state it is behind
    await asyncio.sleep(0.1)
    assert daemon.generation == 1

    async def reported() -> bool:
        return bool(await _facts(nc, subjects, "status"))

    await eventually(reported, what="its status report")
    [status] = await _facts(nc, subjects, "status")
    assert (status["observed_generation"], status["trust_version"]) == (1, 2)
    assert (status["approver_set_epoch"], status["approver_set_sha256"]) == (3, "a" * 64)
    [hello] = await _facts(nc, subjects, "hello")
    assert (hello["trust_version"], hello["approver_set_epoch"]) == (2, 3)


async def test_its_certificate_expires_by_its_server_time_clock_not_its_own(
    gateway: Gateway, db: asyncpg.Connection, pool: asyncpg.Pool, nc: NATS, subjects: Subjects
) -> None:
    """Its own clock says the certificate has 10 minutes left; a gateway's server time
    (the mark its Welcome moved) is past its `not_after`: it ends its session
    (`certificate-expired`) and says Hello no more."""
    await fleet.join(db, "n1")
    ahead = Provisioned("gw-ahead", pool, nc, subjects, wall=lambda: time.time() + 3600)
    await ahead.start()
    try:
        now = [time.time()]
        daemon = FakeDaemon(
            "n1", "n1-serial", lambda: now[0], random.Random(1), hello_key=fleet.hello_key("n1")
        )
        daemon.cert_not_after = now[0] + 600
        await daemon.tick([gateway])  # server time as its own: welcomed, not expired
        assert daemon.connected and not daemon.expired
        await gateway.disconnect("n1", daemon.epoch)
        daemon.drop("test")
        daemon.next_try = 0.0
        await daemon.tick([ahead])  # this Welcome's server time is an hour ahead
        assert daemon.server_time_mark > daemon.cert_not_after and daemon.expired
        epoch = daemon.epoch
        await daemon.tick([ahead])
        assert daemon.gateway is None and "n1" not in ahead.sessions
        closed = [f for f in await _facts(nc, subjects, "closed") if f["epoch"] == epoch]
        assert [c["reason"] for c in closed] == ["certificate-expired"]
        welcomes = daemon.welcomes
        now[0] += 120
        daemon.next_try = 0.0
        await daemon.tick([gateway, ahead])
        assert daemon.welcomes == welcomes and not daemon.connected  # no Hello any more
    finally:
        await ahead.stop(graceful=False)


async def test_a_replay_of_a_command_it_finished_is_answered_from_its_journal_and_runs_once(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    """The command finished while the node was away (its result not stored yet: owed, its
    Hello carries it); the replay re-sends it after the Welcome, and a duplicate of that
    Dispatch follows: each is answered from the journal — its result sent again at the new
    epoch — and the daemon runs the command once."""
    await fleet.join(db, "n1")
    now = [time.time()]
    daemon = FakeDaemon(
        "n1",
        "n1-serial",
        lambda: now[0],
        random.Random(1),
        work_seconds=(5, 5),
        hello_key=fleet.hello_key("n1"),
    )
    await daemon.tick([gateway])
    command = dispatch(daemon, 1)

    async def send(notice: Dispatch) -> None:
        body, headers = REGISTRY.encode(notice)
        await nc.jetstream().publish(subjects.notice("gw-a", "dispatch"), body, headers=headers)

    await send(command)
    await eventually(lambda: _holds(daemon, command.command_id), what="the command running")
    await gateway.disconnect("n1", daemon.epoch)  # away; the command finishes meanwhile
    daemon.drop("stream closed")
    daemon.partitioned = True
    now[0] += 6
    await daemon.tick([gateway])
    assert list(daemon.results) == [command.command_id]
    daemon.partitioned, daemon.next_try = False, 0.0
    await daemon.tick([gateway])  # its Hello carries the result
    assert daemon.connected and daemon.epoch == 2
    replayed = command.model_copy(update={"epoch": 2, "attempt": 2})
    await send(replayed)
    await send(replayed)  # delivered twice

    async def answered() -> bool:
        return daemon.answered == 2

    await eventually(answered, what="both deliveries answered from the journal")
    assert daemon.runs[command.command_id] == 1 and command.command_id not in daemon.running
    results = [
        r
        for r in await _facts(nc, subjects, "result")
        if r["command_id"] == str(command.command_id)
    ]
    assert {(r["epoch"], r["outcome"]) for r in results} == {(2, "done")}  # sent again
    progress = await _facts(nc, subjects, "progress")
    assert [p["epoch"] for p in progress] == [1, 1]  # acked and running once, at epoch 1 only


async def _holds(daemon: FakeDaemon, command_id: uuid.UUID) -> bool:
    return command_id in daemon.running
