"""Losing the PostgreSQL primary while facts flow (docs/kubernetes.md, "A highly available
PostgreSQL"): a primary and a streaming standby, the five workers as `bcw run` processes
given both in one multi-host URL with `target_session_attrs=read-write`. The primary is
killed (SIGKILL) a third of the way through; a moment later the standby is promoted, as
an HA manager (Patroni, CloudNativePG) would. The workers find the new primary by
themselves and go on.

- Synchronous replication: a commit is acknowledged once the standby has it, so nothing a
  worker committed is lost — every effect exactly once, nothing lost, nothing
  dead-lettered.
- Asynchronous replication: commits the standby had not received when the primary died
  are lost with their inbox rows, and their facts were already acked: those effects may
  be lost (reported here, never more than that window). Nothing is applied twice and
  nothing dead-lettered: what the standby has, its inbox says was done.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import eventually
from workers.bench.chaos.flow import (
    HELLO_WORKERS,
    count_effects,
    hellos_handled,
    join_fleet,
    publish_hellos,
    wait_settled,
)
from workers.bench.common import print_table, spawn_workers, stop_workers, workers_bound
from workers.embedded.servers import EmbeddedPostgres
from workers.registry import ROLES
from workers.runtime.bus import streams
from workers.runtime.store import migrate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NODES = 600
RATE = 30.0  # Hellos per second: 20 s of them
DATABASE = "bcw_failover"


@contextlib.contextmanager
def primary_and_standby(base: Path, synchronous: bool):  # type: ignore[no-untyped-def]
    # a commit is flushed to the primary's WAL before it is acknowledged, either way; with
    # `synchronous`, to the standby's too
    commit = {"synchronous_commit": "on"}
    if synchronous:
        commit["synchronous_standby_names"] = "standby1"
    primary = EmbeddedPostgres(base / "primary", settings=commit)
    primary.start()
    standby = None
    try:
        standby = EmbeddedPostgres(base / "standby", standby_of=primary, name="standby1")
        standby.start()
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "asynchronous"])
async def test_the_workers_follow_a_promoted_standby(
    synchronous: bool, servers: Servers, nc: NATS, subjects: Subjects, tmp_path: Path
) -> None:
    await _follow(synchronous, servers, nc, subjects, tmp_path, tmp_path / "servers")


async def _follow(
    synchronous: bool, servers: Servers, nc: NATS, subjects: Subjects, logs: Path, home: Path
) -> None:
    with primary_and_standby(home, synchronous) as (primary, standby):
        admin = await asyncpg.connect(primary.url)
        await admin.execute(f'CREATE DATABASE "{DATABASE}"')
        await admin.close()
        conn = await asyncpg.connect(primary.url_for(DATABASE))
        try:
            await migrate.migrate(conn)
            await migrate.grant(conn, ROLES)
        finally:
            await conn.close()
        nodes = [f"fo-{i:05d}" for i in range(NODES)]
        await join_fleet(primary.url_for(DATABASE), nodes)
        await streams.provision_streams(nc.jetstream(), subjects)
        both = (
            f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/{DATABASE}"
            "?target_session_attrs=read-write"
        )
        env = {
            "BCW_DATABASE_URL": both,
            "BCW_NATS_URL": servers.nats_url,
            "BCW_SUBJECT_ROOT": subjects.root,
            "BCW_HEALTH_PORT": "0",
            "BCW_LOG_LEVEL": "WARNING",
            "BCW_CONSUMER_ACK_WAIT": "10",
            "BCW_DATABASE_COMMAND_TIMEOUT": "8",
            "BCW_DATABASE_CONNECT_TIMEOUT": "3",
            # no daemon flushes liveness here: no session may age out meanwhile
            "BCW_LIVENESS_HEARTBEAT_INTERVAL": "3600",
        }
        procs = await spawn_workers(env, logs)
        try:
            await eventually(lambda: workers_bound(nc.jetstream(), subjects), what="bound")
            publishing = asyncio.create_task(publish_hellos(nc, subjects, nodes, RATE))
            total = NODES * len(HELLO_WORKERS)
            await eventually(
                lambda: _at_least(both, total // 3), within=120, what="a third applied"
            )
            primary.kill()
            await asyncio.sleep(2)  # the HA manager notices, then promotes
            await asyncio.to_thread(standby.promote)
            await publishing
            # asynchronous: what was lost never settles; wait out the flow, not a timeout
            settled = await wait_settled(both, NODES, within=180 if synchronous else 20)
            figures = await count_effects(both, subjects, nc, nodes)
            alive = [name for name, proc in procs.items() if proc.returncode is None]
        finally:
            await stop_workers(procs)
    print_table(
        f"PostgreSQL failover ({'synchronous' if synchronous else 'asynchronous'} replication)",
        ("figure", "value"),
        [(k, str(v)) for k, v in figures.items()],
    )
    assert len(alive) == len(procs), "no worker gave up on the lost primary"
    assert (figures["duplicates"], figures["dead-lettered"]) == (0, 0)
    if synchronous:
        assert settled >= 0
        assert (figures["effects applied"], figures["lost"]) == (NODES, 0)
    else:  # at most the commits the standby had not received when the primary died
        assert figures["effects applied"] + figures["lost"] == NODES


async def _at_least(url: str, n: int) -> bool:
    return await hellos_handled(url) >= n
