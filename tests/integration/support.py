"""Helpers for the runtime's integration tests: a small worker whose effects can be
counted (`tally`), publishing facts, running a worker process in-task, waiting.

The tally worker is a test double of a *worker*, not of NATS or PostgreSQL: it runs on
the real runtime against the real servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncpg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from schemas import REGISTRY, Fact, NodeDisconnected, Status
from schemas.subjects import Subjects
from workers.runtime.base.errors import PermanentError
from workers.runtime.base.runtime_settings import (
    ConsumerSettings,
    DatabaseSettings,
    NatsSettings,
    OutboxSettings,
)
from workers.runtime.bus import deadletter
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Runtime, Tx, Worker
from workers.runtime.process import run_process
from workers.settings import Settings

TALLY_DDL = """
CREATE TABLE IF NOT EXISTS tally (
    fact_id uuid PRIMARY KEY, node_id text NOT NULL, effects int NOT NULL,
    generation bigint NOT NULL, applied bigint GENERATED ALWAYS AS IDENTITY
);
CREATE TABLE IF NOT EXISTS tally_broken (node_id text PRIMARY KEY);
"""


async def handle_tally(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
    """Counts each fact's effect (a second effect would show as effects = 2) and emits an event.

    A node listed in `tally_broken` makes the handler fail permanently (a bug stand-in);
    node `stale-*` facts are fenced out (STALE).
    """
    broken = {r["node_id"] for r in await tx.conn.fetch("SELECT node_id FROM tally_broken")}
    for fact in facts:
        if isinstance(fact, Status) and fact.node_id in broken:
            raise PermanentError(f"tally cannot handle node {fact.node_id}")
    statuses = [f for f in facts if isinstance(f, Status) and not f.node_id.startswith("stale-")]
    await tx.conn.execute(
        """
        INSERT INTO tally (fact_id, node_id, effects, generation)
        SELECT f, n, 1, g FROM unnest($1::uuid[], $2::text[], $3::bigint[]) WITH ORDINALITY AS t(f, n, g, o)
         ORDER BY o
        ON CONFLICT (fact_id) DO UPDATE SET effects = tally.effects + 1
        """,
        [f.fact_id for f in statuses],
        [f.node_id for f in statuses],
        [f.observed_generation for f in statuses],
    )
    for fact in statuses:
        event = NodeDisconnected(
            node_id=fact.node_id, epoch=fact.epoch, gateway_id=fact.gateway_id, reason="fenced"
        )
        tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=fact, order_key=fact.node_id)
    return {
        f.fact_id: outcome.STALE
        for f in facts
        if isinstance(f, Status) and f.node_id.startswith("stale-")
    }


#: the repository's root: where `python -m tests.integration.tally_process` runs from
ROOT = Path(__file__).resolve().parents[2]


def spawn_tally(
    nats_url: str, database_url: str, subjects: Subjects, **env: str
) -> Awaitable[asyncio.subprocess.Process]:
    """A tally worker in a process of its own (`tests.integration.tally_process`), for a
    test that kills or signals it; `env` over its settings (health on a free port, JSON
    logs). Its output is dropped, not piped: nobody reads it, and a process that logs
    64 KiB (retries on a loaded machine) would block on a full pipe and stall the very
    thing under test."""
    return asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.tally_process",
        env={
            **os.environ,
            "BCW_DATABASE_URL": database_url,
            "BCW_NATS_URL": nats_url,
            "BCW_SUBJECT_ROOT": subjects.root,
            "BCW_HEALTH_PORT": "0",
            "BCW_LOG_FORMAT": "json",
            **env,
        },
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def tally_pulling(js: JetStreamContext, subjects: Subjects) -> bool:
    """Whether a process waits on the tally consumer for facts (a pull request open)."""
    try:
        return (await js.consumer_info(subjects.facts_stream, "tally")).num_waiting > 0
    except NotFoundError:
        return False


async def tally_effects(database_url: str) -> dict[int, int]:
    """How many tally rows were applied each number of times: {effects: rows} (1: once)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT effects, count(*) AS n FROM tally GROUP BY effects")
        return {r["effects"]: r["n"] for r in rows}
    finally:
        await conn.close()


def build_tally(settings: Settings | None = None) -> Worker:
    # its status facts are about no real session: not checked against issued epochs
    return Worker(
        name="tally", fact_types=("status",), handle=handle_tally, bound_to_gateways=False
    )


def make_settings(
    nats_url: str, database_url: str, subjects: Subjects, **consumer: Any
) -> Settings:
    consumer_settings = ConsumerSettings(
        **{"ack_wait": 5.0, "nak_delay": 0.2, "retry_max_seconds": 0.5, **consumer}
    )
    return Settings(
        subject_root=subjects.root,
        health_port=0,
        database=DatabaseSettings(
            url=database_url, pool_max=4, command_timeout=0.8 * consumer_settings.ack_wait
        ),
        nats=NatsSettings(url=nats_url),
        consumer=consumer_settings,
        outbox=OutboxSettings(poll_seconds=0.5),
    )


def status_fact(node_id: str = "node-1", gateway_id: str = "gw-1", **fields: Any) -> Status:
    return Status.model_validate_json(
        json.dumps(
            {
                "fact_id": str(uuid.uuid4()),
                "gateway_id": gateway_id,
                "observed_at": "2026-11-30T12:00:00Z",
                "node_id": node_id,
                "epoch": 1,
                "observed_generation": 1,
                "trust_version": 0,
                **fields,
            }
        )
    )


async def publish_fact(
    js: JetStreamContext,
    subjects: Subjects,
    fact: Fact,
    *,
    msg_id: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    body, bc_headers = REGISTRY.encode(fact)
    all_headers = {**bc_headers, "Nats-Msg-Id": msg_id or str(fact.fact_id), **(headers or {})}
    await js.publish(subjects.fact(fact.gateway_id, fact.BC_TYPE), body, headers=all_headers)


async def publish_through_outages(js: JetStreamContext, subjects: Subjects, fact: Fact) -> None:
    """Publish `fact` until JetStream has it, as a gateway does through an outage: every
    try carries the same Nats-Msg-Id, so JetStream keeps one copy."""
    while True:
        try:
            await publish_fact(js, subjects, fact)
            return
        except Exception:
            await asyncio.sleep(0.2)


async def publish_raw(
    js: JetStreamContext, subject: str, body: bytes, headers: dict[str, str]
) -> None:
    await js.publish(subject, body, headers={"Nats-Msg-Id": str(uuid.uuid4()), **headers})


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float = 30.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + within
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.1)


async def count(database_url: str, sql: str, *args: Any) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval(sql, *args) or 0)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def running(
    settings: Settings, workers: Sequence[Worker], provider: trace.TracerProvider | None = None
) -> AsyncIterator[tuple[Runtime, int]]:
    """Run a worker process in this event loop for the block; yields (runtime, health port)."""
    stopping = asyncio.Event()
    started: asyncio.Future[tuple[Runtime, int]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run_process(
            settings,
            workers,
            stopping=stopping,
            provider=provider or TracerProvider(),
            on_ready=lambda runtime, port: started.set_result((runtime, port)),
        )
    )
    done, _ = await asyncio.wait({task, started}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
    if started not in done:
        task.cancel()
        raise AssertionError("worker process did not start in 30 s")
    try:
        yield started.result()
    finally:
        stopping.set()
        await asyncio.wait_for(task, 15)


async def stream_messages(
    js: JetStreamContext, stream: str, subject: str | None = None
) -> list[Any]:
    """Every message stored in `stream` (optionally on one subject), oldest first."""
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(stream, seq)
        except Exception:
            continue
        if subject is None or msg.subject == subject:
            out.append(msg)
    return out


async def bcw(*args: str, **env: str) -> tuple[int, str]:
    """Run the `bcw` command in a subprocess with `env` added; (exit code, stdout+stderr)."""
    import os
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def bcw_process(*args: str, output: bool = False, **env: str) -> asyncio.subprocess.Process:
    """A long-running `bcw` command (`run labeler`, say) in a subprocess with `env` added;
    its output dropped, or with `output` kept (stdout and stderr in one pipe) for
    `communicate()`."""
    import os
    import sys

    out = asyncio.subprocess.PIPE if output else asyncio.subprocess.DEVNULL
    err = asyncio.subprocess.STDOUT if output else asyncio.subprocess.DEVNULL
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        *args,
        env={**os.environ, **env},
        stdout=out,
        stderr=err,
    )


async def hellos_applied_by_workers(
    env: dict[str, str], logs: Any, nc: Any, subjects: Subjects, database_url: str, nodes: list[str]
) -> list[int]:
    """The five workers, each a `bcw run` process with `env`, apply a Hello of each of
    `nodes` (joined here) and stop on SIGTERM; their exit codes (each 0 when clean)."""
    import signal

    from workers.bench.chaos.flow import join_fleet, publish_hellos, wait_settled
    from workers.bench.common import spawn_workers

    await join_fleet(database_url, nodes)
    procs = await spawn_workers(env, logs)
    try:
        await publish_hellos(nc, subjects, nodes, rate=200.0)
        assert await wait_settled(database_url, len(nodes), within=120) >= 0, "Hellos not applied"
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs.values())), 60)
    return list(codes)


async def already(value: bool) -> bool:
    """A value already known, for `eventually` (which awaits what it is given)."""
    return value


async def tally_rows(database_url: str, n: int) -> bool:
    return await count(database_url, "SELECT count(*) FROM tally") == n


#: the messages waiting in the outbox: `outbox` rows (an older release's) and packs' messages
OUTBOX_LEFT = (
    "SELECT (SELECT count(*) FROM outbox) + (SELECT coalesce(sum(size), 0) FROM outbox_packs)"
)

#: every message waiting in the outbox, in the order a relay publishes them
OUTBOX_MESSAGES = """
SELECT msg_id, subject, headers::text AS headers, body, order_key, worker FROM (
    SELECT 0 AS t, id, 0::bigint AS i, msg_id, subject, headers, body, order_key, worker
      FROM outbox
    UNION ALL
    SELECT 1, p.id, m.i, m.msg_id, m.subject, m.headers::jsonb, m.body, m.order_key, p.worker
      FROM outbox_packs p,
           unnest(p.msg_ids, p.subjects, p.headers, p.bodies, p.order_keys)
             WITH ORDINALITY AS m(msg_id, subject, headers, body, order_key, i)
) waiting ORDER BY t, id, i
"""


async def outbox_empty(database_url: str) -> bool:
    return await count(database_url, OUTBOX_LEFT) == 0


async def dead_letters_at_least(js: object, subjects: Subjects, n: int) -> bool:
    return len(await deadletter.list_dead_letters(js, subjects)) >= n  # type: ignore[arg-type]
