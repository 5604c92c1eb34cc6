"""`--json` on the commands a script reads: `bcw quarantine status`, `bcw migrate --status`,
`bcw provision --check`, `bcw auth db` — one JSON object per line, the field names of
docs/operations.md, nothing else on stdout; `--json` without the listing it goes with is
refused (exit 2).

What is real: the `bcw` command in a subprocess, the session's nats-server and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid

import asyncpg

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import bcw


async def _stdout(*args: str, **env: str) -> tuple[int, list[dict[str, object]], str]:
    """(exit code, stdout's JSON objects, stderr) of `bcw args`: every stdout line is one."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    objects = [json.loads(line) for line in out.decode().splitlines()]
    assert all(isinstance(o, dict) for o in objects)
    return proc.returncode or 0, objects, err.decode()


async def test_quarantine_status_json(database_url: str, db: asyncpg.Connection) -> None:
    code, held, _ = await _stdout("quarantine", "status", "--json", BCW_DATABASE_URL=database_url)
    assert (code, held) == (0, [])
    await db.execute("INSERT INTO nodes (node_id, role) VALUES ('n1', 'compute')")
    await db.execute(
        "INSERT INTO quarantines (node_id, epoch, gateway_id, alternations, gateways, "
        "serials, held) VALUES ('n1', 3, 'gw-2', 4, '{gw-1,gw-2}', '{n1-serial}', 'breaker')"
    )
    code, held, _ = await _stdout("quarantine", "status", "--json", BCW_DATABASE_URL=database_url)
    assert code == 0
    [one] = held
    assert set(one) == {
        "node_id",
        "epoch",
        "gateway_id",
        "held",
        "alternations",
        "gateways",
        "serials",
        "decided_at",
    }
    assert (one["node_id"], one["epoch"], one["gateway_id"], one["held"]) == (
        "n1",
        3,
        "gw-2",
        "breaker",
    )
    assert (one["gateways"], one["serials"], one["alternations"]) == (
        ["gw-1", "gw-2"],
        ["n1-serial"],
        4,
    )
    assert isinstance(one["decided_at"], str) and "T" in one["decided_at"]


async def test_migrate_status_json(database_url: str, empty_database_url: str) -> None:
    code, rows, _ = await _stdout("migrate", "--status", "--json", BCW_DATABASE_URL=database_url)
    assert code == 0 and rows
    assert all(set(r) == {"name", "state", "applied_at", "release", "refused"} for r in rows)
    assert {r["state"] for r in rows} == {"applied"} and not any(r["refused"] for r in rows)
    code, rows, _ = await _stdout(
        "migrate", "--status", "--json", BCW_DATABASE_URL=empty_database_url
    )
    assert code == 0 and {(r["state"], r["applied_at"]) for r in rows} == {("pending", None)}
    code, out = await bcw("migrate", "--json", BCW_DATABASE_URL=empty_database_url)
    assert code == 2 and out.strip() == "bcw migrate: --json goes with --status"


async def test_provision_check_json(servers: Servers, subjects: Subjects) -> None:
    env = {"BCW_NATS_URL": servers.nats_url, "BCW_SUBJECT_ROOT": subjects.root}
    code, streams, _ = await _stdout("provision", "--check", "--json", **env)
    assert code == 1  # nothing provisioned under this root: missing
    assert streams and all(set(s) == {"stream", "state"} for s in streams)
    assert {s["state"] for s in streams} == {"missing"}
    assert {subjects.facts_stream, subjects.events_stream} <= {s["stream"] for s in streams}
    assert (await bcw("provision", **env))[0] == 0
    code, streams, _ = await _stdout("provision", "--check", "--json", **env)
    assert code == 0 and "missing" not in {s["state"] for s in streams}
    code, out = await bcw("provision", "--json", **env)
    assert code == 2 and out.strip() == "bcw provision: --json goes with --check"


async def test_auth_db_json(database_url: str, db: asyncpg.Connection) -> None:
    login = f"json_{uuid.uuid4().hex[:8]}_t"
    await db.execute(f"CREATE ROLE {login} NOLOGIN")
    try:
        code, bound, _ = await _stdout("auth", "db", "--json", BCW_DATABASE_URL=database_url)
        assert (code, bound) == (0, [])
        code, bound, _ = await _stdout(
            "auth", "db", "--bind", f"{login}=gw-7", "--json", BCW_DATABASE_URL=database_url
        )
        assert code == 0
        [one] = bound
        assert set(one) == {"login", "gateway_id", "bound_at", "in_group"}
        assert (one["login"], one["gateway_id"], one["in_group"]) == (login, "gw-7", False)
        code, bound, err = await _stdout(
            "auth",
            "db",
            "--unbind",
            login,
            "--unbind",
            login,
            "--json",
            BCW_DATABASE_URL=database_url,
        )
        assert (code, bound) == (0, []) and "was bound to no gateway" in err
    finally:
        await db.execute("DELETE FROM gateway_logins WHERE login = $1", login)
        await db.execute(f"DROP ROLE {login}")
