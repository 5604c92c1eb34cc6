"""How the embedded servers are known to be up, and to be ours: a port chosen free can be
taken by another process before the server binds it, and a server of someone else's then
answers there. A nats-server is told by its `server_name` (its INFO line), a postmaster
by its pid in its own `postmaster.pid`; a first start whose port was taken tries another
(`PortTaken`), a restart keeps its port (its clients' URL) and says it is taken.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from workers.embedded.install import EmbeddedError

#: first starts tried, each on a new port, while the port chosen is taken before it is bound
PORT_TRIES = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: `postmaster.pid`'s status line once the server accepts connections
READY = ("ready", "standby")


class PortTaken(EmbeddedError):
    """The port chosen was taken (by another process) before the server could bind it."""


def log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def _exited(
    process: subprocess.Popen[bytes], what: str, port: int, log: Path, since: int
) -> EmbeddedError:
    """Why a server that was starting has exited: its port taken (its log says so past
    `since`, where this start began writing), or see its log."""
    with contextlib.suppress(OSError), log.open("rb") as text:
        text.seek(since)
        if b"already in use" in text.read().lower():
            return PortTaken(f"{what} could not bind port {port}: it is in use")
    return EmbeddedError(f"{what} exited with {process.returncode}; see {log}")


def nats_name(port: int) -> str | None:
    """The `server_name` of the nats-server answering on `port` (its INFO line), if any."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        if sock.connect_ex(("127.0.0.1", port)) != 0:
            return None
        data = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in data and len(data) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    if not data.startswith(b"INFO "):
        return None
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(data[5:].split(b"\r\n", 1)[0]).get("server_name"))
    return None


def wait_ready(
    process: subprocess.Popen[bytes],
    what: str,
    port: int,
    log: Path,
    since: int,
    ready: Callable[[], bool],
    within: float,
) -> None:
    """Until `ready()` — this server, not another one answering on `port` (which was taken
    between choosing and binding it) — or `process` exits (`_exited`)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise _exited(process, what, port, log, since)
        if ready():
            return
        time.sleep(0.05)
    raise EmbeddedError(f"{what} was not ready on port {port} within {within:.0f} s; see {log}")


def postmaster_ready(data: Path, pid: int) -> bool:
    """Whether the postmaster `pid` (this one, not a stale lock file's) has bound its port
    and accepts connections: `postmaster.pid` names it and says ready (or standby)."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[0].strip() == str(pid) and lines[7].strip() in READY
