"""The embedded servers (what `make demo` and the tests start) change nothing outside
their own directory, also when run as root: PostgreSQL, which refuses root, runs in a user
namespace instead of as a system user — no `useradd`, no mode changes on the parents of its
data directory, no copy of its binaries elsewhere."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import asyncpg

from workers.embedded.servers import EmbeddedPostgres


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _modes(path: Path) -> dict[Path, int]:
    return {parent: parent.stat().st_mode for parent in [path, *path.parents]}


async def test_postgres_leaves_everything_outside_its_directory_as_it_was(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # as /root is: only its owner may traverse it
    home = private / "deep" / "pg"
    accounts = {name: _digest(name) for name in ("/etc/passwd", "/etc/group")}
    modes = _modes(private)
    scratch = set(os.listdir(tempfile.gettempdir()))

    server = EmbeddedPostgres(home).start()
    try:
        conn = await asyncpg.connect(server.url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM pg_stat_activity") >= 1
        finally:
            await conn.close()
        server.kill()  # a crash, then a start on the same data, as the fault tests do
        server.start()
    finally:
        server.stop()

    assert {name: _digest(name) for name in accounts} == accounts
    assert _modes(private) == modes
    added = set(os.listdir(tempfile.gettempdir())) - scratch
    assert not [name for name in added if name.startswith("bcw-pginstall")]
    owners = {path.stat().st_uid for path in home.rglob("*")}
    assert owners == {os.geteuid()}
