"""A `bcw run` told to stop while it still starts — a pod deleted as it comes up, a
Deployment rolled on a loaded node, where the imports alone take seconds — stops
cleanly: exit 0, never killed by the signal it was sent.

What is real: the `bcw` command in a subprocess, the session's nats-server and
PostgreSQL. The window is held open, not hit by luck: a thread freezes the process
(SIGSTOP) the moment it first catches SIGTERM, the test sends SIGTERM into that frozen
start and lets it go on (SIGCONT).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

from tests.conftest import Servers
from tests.integration.support import bcw_process

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)
LATE_IMPORT = "asyncpg/protocol/protocol."  # a library `bcw run` loads long after it starts


def _catches_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    (caught,) = (line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & SIGTERM_BIT)


def _freeze_once_it_catches_sigterm(pid: int, within: float) -> bool:
    """Stop `pid` as soon as it has a SIGTERM handler; whether it had loaded LATE_IMPORT."""
    deadline = time.monotonic() + within
    while not _catches_sigterm(pid):
        assert time.monotonic() < deadline, "the process never caught SIGTERM"
        time.sleep(0.0002)
    os.kill(pid, signal.SIGSTOP)
    return LATE_IMPORT in Path(f"/proc/{pid}/maps").read_text()


async def test_a_sigterm_while_bcw_run_still_imports_ends_it_with_exit_0(
    servers: Servers, database_url: str
) -> None:
    env = {
        "BCW_NATS_URL": servers.nats_url,
        "BCW_DATABASE_URL": database_url,
        "BCW_HEALTH_PORT": "0",
        "BCW_SUBJECT_ROOT": f"t{uuid.uuid4().hex[:10]}",
    }
    process = await bcw_process("run", "labeler", output=True, **env)
    try:
        loaded = await asyncio.to_thread(_freeze_once_it_catches_sigterm, process.pid, 30)
        process.send_signal(signal.SIGTERM)
    finally:
        process.send_signal(signal.SIGCONT)
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert not loaded, "SIGTERM was deferred only after the heavy imports: the window is open"
    assert process.returncode == 0, out.decode()
    assert b"Traceback" not in out
