"""Issue 59, finding 13: NOTIFY cost each worker 50-90 µs a notification, and any login may
NOTIFY the workers' channels (`pg_notify` is PUBLIC): a gateway login's storm raised their
CPU 10 to 25 times. The channels are now named with a secret of the database (`wake_channels`,
migration 0057) that only the owner and the workers' groups read, the wake-ups are sent
by the writers' triggers and `wake_dispatch()` (the replay, the quarantine, an operator),
and a worker's listener sheds a storm from a login that does know a name (a worker's).

Measured on the five `bcw run` worker processes: each one's CPU in a quiet spell, under a
gateway login's storm (every channel name it can know or guess, as fast as it can) and
under a worker login's storm on the real channels. The proof policy and the streams'
layout (setups A and B) play no part in a NOTIFY: one setup is run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import bcw_process, eventually
from workers.registry import WORKERS
from workers.replay.apply import DISPATCH_CHANNEL
from workers.runtime.base.runtime_settings import DatabaseSettings
from workers.runtime.bus import streams
from workers.runtime.store.notify import Listener

pytestmark = pytest.mark.slow

#: what a gateway's login may know (the release's source) or guess of the channels
GUESSED = ("bcw_outbox", "bcw_dispatch", "bcw_commands", "bcw_wake", "outbox", "dispatch")
#: seconds of each spell measured
SPELL = 6.0
#: what a storm may add to a worker's CPU, in cores: a gateway's (it reaches none), a
#: worker's (shed: `STORM` notifications, then `REST` seconds deaf)
GATEWAY_BOUND = 0.03
WORKER_BOUND = 0.10


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds the process has used (/proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _storm(url: str, channels: list[str], until: float) -> int:
    """NOTIFY `channels` as fast as one login can, distinct payloads (equal ones are
    folded), until `until`; how many were sent."""
    conn = await asyncpg.connect(url)
    sent = 0
    try:
        while time.monotonic() < until:
            await conn.execute(
                "SELECT pg_notify(c, $2 || ':' || i) FROM unnest($1::text[]) AS c, "
                "generate_series(1, 2000) AS i",
                channels,
                str(sent),
            )
            sent += 2000 * len(channels)
    finally:
        await conn.close()
    return sent


async def _spell(pids: dict[str, int], storm: tuple[str, list[str]] | None) -> tuple[dict, int]:
    """Each worker's CPU (cores) over one spell, with `storm` (login URL, channels) or none."""
    before = {w: cpu_seconds(pid) for w, pid in pids.items()}
    started = time.monotonic()
    sent = 0
    if storm is None:
        await asyncio.sleep(SPELL)
    else:
        sent = await _storm(storm[0], storm[1], started + SPELL)
    elapsed = time.monotonic() - started
    return {w: (cpu_seconds(pid) - before[w]) / elapsed for w, pid in pids.items()}, sent


async def test_a_notify_storm_costs_each_worker_a_bounded_share_of_a_core(
    logins: dict[str, str],
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    """gw-1's login NOTIFYs every name it knows or guesses as fast as it can: no worker's
    CPU rises by more than `GATEWAY_BOUND` of a core (before: 10 to 25 times). The labeler's
    login, which reads the real names, NOTIFYs them as fast as it can: each listener
    sheds the storm, no worker rises by more than `WORKER_BOUND`. The gateway's login may
    neither read the names nor wake the dispatch loop by its function."""
    gateway = await asyncpg.connect(logins["bcw_gateway_bound"])
    try:
        for sql in ("SELECT * FROM wake_channels", "SELECT wake_dispatch()"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await gateway.execute(sql)
    finally:
        await gateway.close()
    real = [r["channel"] for r in await db.fetch("SELECT channel FROM wake_channels")]
    assert not set(real) & set(GUESSED)
    await streams.provision_streams(nc.jetstream(), subjects)
    procs = {
        worker: await bcw_process(
            "run",
            worker,
            BCW_DATABASE_URL=database_url,
            BCW_NATS_URL=servers.nats_url,
            BCW_SUBJECT_ROOT=subjects.root,
            BCW_HEALTH_PORT="0",
        )
        for worker in WORKERS
    }
    try:

        async def listening() -> bool:  # every relay's listener, and the dispatch loop's
            n = await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'"
            )
            return int(n) >= len(WORKERS) + 1

        await eventually(listening, within=60, what="every worker's listener")
        await asyncio.sleep(3)  # past their start
        pids = {w: p.pid for w, p in procs.items()}
        quiet, _ = await _spell(pids, None)
        by_gateway, sent_g = await _spell(pids, (logins["bcw_gateway_bound"], list(GUESSED)))
        by_worker, sent_w = await _spell(pids, (logins["bcw_labeler"], real))
        print(
            f"\nNOTIFY storms, {SPELL:.0f} s each: a gateway login sent {sent_g / SPELL:,.0f}/s, "
            f"a worker login {sent_w / SPELL:,.0f}/s (CPU, % of a core)"
        )
        print(f"{'worker':<12}{'quiet':>8}{'gateway':>9}{'worker':>8}")
        for w in WORKERS:
            print(f"{w:<12}{quiet[w]:>8.1%}{by_gateway[w]:>9.1%}{by_worker[w]:>8.1%}")
        for w in WORKERS:
            assert procs[w].returncode is None, f"{w} exited"
            assert by_gateway[w] - quiet[w] <= GATEWAY_BOUND, (w, quiet[w], by_gateway[w])
            assert by_worker[w] - quiet[w] <= WORKER_BOUND, (w, quiet[w], by_worker[w])
        assert sent_g > 50_000 and sent_w > 50_000  # a storm, each
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        await asyncio.gather(*(p.wait() for p in procs.values()))


async def test_a_listener_sheds_a_storm_and_listens_again(
    logins: dict[str, str], database_url: str
) -> None:
    """The labeler's login NOTIFYs the dispatch loop's real channel 100,000 times: the
    listener takes at most about `storm` of them a second, stops listening for `rest`
    seconds (its loop polls), then listens again and is woken by the next notification."""
    wake, stopping = asyncio.Event(), asyncio.Event()
    listener = Listener(
        DatabaseSettings(url=database_url), [DISPATCH_CHANNEL], wake, storm=500, rest=2.0
    )
    listening = asyncio.create_task(listener.run(stopping))
    attacker = await asyncpg.connect(logins["bcw_labeler"])
    channel = await attacker.fetchval(
        "SELECT channel FROM wake_channels WHERE name = $1", DISPATCH_CHANNEL
    )
    try:
        await eventually(lambda: _true(listener.listening), within=10, what="listening")
        started = time.monotonic()
        for batch in range(50):
            await attacker.execute(
                f"SELECT pg_notify('{channel}', '{batch}:' || i) FROM generate_series(1, 2000) i"
            )
        elapsed = time.monotonic() - started
        assert listener.shed >= 1
        # what it read: the storm's first second, and what was in flight when it stopped
        assert listener.notified <= 500 * (elapsed + 1) + 20_000, (listener.notified, elapsed)
        assert listener.notified < 100_000
        await eventually(lambda: _true(listener.listening), within=10, what="listening again")
        wake.clear()
        seen = listener.notified
        await attacker.execute(f"SELECT pg_notify('{channel}', 'after')")
        await asyncio.wait_for(wake.wait(), 5)
        assert listener.notified == seen + 1
    finally:
        stopping.set()
        await attacker.close()
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


async def _true(value: bool) -> bool:
    return value
