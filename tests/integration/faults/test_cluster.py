"""A three-server JetStream cluster on loopback with every stream at 3 replicas: one
server is killed mid-stream (SIGKILL, no goodbye) and later restarted, while two
replicas of each worker run as `bcw run` processes and one of them is `kill -9`ed.
Every Hello takes effect exactly once; nothing is dead-lettered.

What is real: three nats-server processes with cluster routes, PostgreSQL, ten worker
processes. The cluster is this module's own; PostgreSQL is the session's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from schemas.subjects import Subjects
from tests.integration.flow import HelloFlow
from tests.integration.support import count, eventually
from workers.embedded.servers import EmbeddedNatsCluster
from workers.registry import WORKERS
from workers.runtime.bus import streams

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsCluster]:
    servers = EmbeddedNatsCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield servers
    finally:
        servers.stop()


async def _provisioned(js: nats.js.JetStreamContext, subjects: Subjects) -> bool:
    try:  # the cluster needs a meta leader before it takes streams
        await streams.provision_streams(js, subjects, replicas=3)
    except Exception:
        return False
    return True


async def _spawn(name: str, env: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "workers.cli",
            "run",
            name,
            env={**os.environ, **env},
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=out,
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_server_and_a_worker_replica_killed_mid_stream(
    cluster: EmbeddedNatsCluster, database_url: str, tmp_path: Path
) -> None:
    subjects = Subjects(f"t{uuid.uuid4().hex[:10]}")
    nc = await nats.connect(
        cluster.url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.2
    )
    js = nc.jetstream()
    await eventually(lambda: _provisioned(js, subjects), within=30, what="R3 streams")
    flow = HelloFlow(800)
    await flow.admit(database_url)
    env = {
        "BCW_DATABASE_URL": database_url,
        "BCW_NATS_URL": cluster.url,
        "BCW_NATS_STREAM_REPLICAS": "3",
        "BCW_SUBJECT_ROOT": subjects.root,
        "BCW_HEALTH_PORT": "0",
        "BCW_CONSUMER_ACK_WAIT": "5",
        "BCW_DATABASE_COMMAND_TIMEOUT": "4",
        "BCW_DATABASE_POOL_MAX": "3",
        "BCW_LIVENESS_HEARTBEAT_INTERVAL": "3600",  # nobody flushes here; no session may age out
    }
    processes = {
        (name, replica): await _spawn(name, env, tmp_path / f"{name}-{replica}.log")
        for name in sorted(WORKERS)
        for replica in (1, 2)
    }
    try:
        publishing = asyncio.create_task(flow.publish(nc, subjects, per_second=25))
        await eventually(
            lambda: _handled_above(database_url, 150), within=60, what="progress before the faults"
        )
        victim = cluster.servers[0]
        victim.kill()  # SIGKILL mid-stream
        processes[("labeler", 1)].kill()  # kill -9 one worker replica
        await asyncio.sleep(8)
        victim.start()  # back, with its store: it catches up from the others
        await publishing
        await eventually(lambda: flow.done(database_url), within=120, what="every Hello handled")
        await flow.assert_exact(database_url, nc, subjects)
    except BaseException:
        _show_logs(tmp_path)
        raise
    finally:
        for process in processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        codes = await asyncio.gather(*(asyncio.wait_for(p.wait(), 15) for p in processes.values()))
        await nc.close()
    assert sorted(codes) == [-signal.SIGKILL] + [0] * 9  # the rest drained and exited cleanly


def _show_logs(directory: Path) -> None:
    for log in sorted(directory.glob("*.log")):
        print(f"--- {log.name}\n{log.read_text()[-3000:]}")


async def _handled_above(database_url: str, n: int) -> bool:
    return await count(database_url, "SELECT count(*) FROM processed_facts") > n
