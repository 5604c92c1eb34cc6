"""The workers at sslmode=verify-full against a PostgreSQL with TLS on (a CA and a server
certificate made by the test), the URL as docs/kubernetes.md gives it with the CA from the
URL (`sslrootcert=`) or from the libpq variable (`PGSSLROOTCERT`, the chart's way):
`bcw migrate` and a `bcw run` worker doing real work connect over TLS (their login is
refused without it; pg_stat_ssl says so). A CA that does not verify the server, a CA
file that does not exist and a wrong password are one line at once, not waited on.

What is real: the `bcw` command in subprocesses, the session's nats-server, a PostgreSQL
of this folder's own with TLS on (conftest)."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import asyncpg
import nats
import pytest

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.connecting.conftest import PASSWORD, TlsPostgres
from tests.integration.flow import HelloFlow
from tests.integration.support import bcw, bcw_process, count, eventually
from workers.runtime.bus import streams


def _one_line(out: str, *names: str) -> str:
    lines = [line for line in out.splitlines() if line.strip() and " INFO " not in line]
    assert len(lines) == 1, out
    assert "Traceback" not in out
    for name in names:
        assert name in lines[0], out
    return lines[0]


@pytest.mark.parametrize("ca_from", ["url", "PGSSLROOTCERT"])
async def test_migrate_and_a_worker_run_at_verify_full(
    tls_postgres: TlsPostgres, servers: Servers, ca_from: str, tmp_path: Path
) -> None:
    database = f"tls_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(tls_postgres.admin_url)
    try:
        await admin.execute(f"CREATE DATABASE {database} OWNER bcw_tls")
    finally:
        await admin.close()
    url = tls_postgres.url(database) + "?sslmode=verify-full"
    env = {"BCW_SUBJECT_ROOT": f"t{uuid.uuid4().hex[:10]}", "BCW_NATS_URL": servers.nats_url}
    if ca_from == "url":
        env["BCW_DATABASE_URL"] = f"{url}&sslrootcert={tls_postgres.ca}"
    else:
        env |= {"BCW_DATABASE_URL": url, "PGSSLROOTCERT": str(tls_postgres.ca)}

    code, out = await asyncio.wait_for(bcw("config", **env), 30)
    assert code == 0, out
    shown = next(line for line in out.splitlines() if line.startswith("PostgreSQL TLS"))
    origin = "BCW_DATABASE_URL" if ca_from == "url" else "PGSSLROOTCERT"
    assert (
        f"sslmode=verify-full (BCW_DATABASE_URL), sslrootcert={tls_postgres.ca} ({origin})" in shown
    )

    code, out = await asyncio.wait_for(bcw("migrate", **env), 120)
    assert code == 0, out  # its login is refused without TLS: it ran over TLS
    code, out = await asyncio.wait_for(bcw("migrate", "--wait", "30s", **env), 60)
    assert code == 0 and "schema current" in out, out

    admin_db = tls_postgres.admin_url.replace("/postgres?", f"/{database}?")
    subjects = Subjects(env["BCW_SUBJECT_ROOT"])
    nc = await nats.connect(servers.nats_url)
    flow = HelloFlow(20)
    await flow.admit(admin_db)
    await streams.provision_streams(nc.jetstream(), subjects)
    process = await bcw_process("run", "labeler", output=True, BCW_HEALTH_PORT="0", **env)
    try:
        await flow.publish(nc, subjects, per_second=200)
        labeled = "SELECT count(DISTINCT node_id) FROM node_labels WHERE source = 'system'"
        await eventually(lambda: _equal(admin_db, labeled, flow.size), within=90, what="Hellos")
        over_tls = await count(
            admin_db,
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.application_name = 'bcw-labeler' AND s.ssl AND a.usename = 'bcw_tls'",
        )
        assert over_tls >= 1
    finally:
        process.send_signal(signal.SIGTERM)
        out_bytes, _ = await asyncio.wait_for(process.communicate(), 30)
        await nc.close()
    assert process.returncode == 0, out_bytes.decode()


async def _equal(url: str, sql: str, n: int) -> bool:
    return await count(url, sql) == n


async def _bcw_on(url: str, servers: Servers, command: str, **env: str) -> tuple[int, str]:
    """`bcw <command>` on the database `url` and the session's NATS (within 60 s)."""
    return await asyncio.wait_for(
        bcw(
            *command.split(),
            BCW_DATABASE_URL=url,
            BCW_NATS_URL=servers.nats_url,
            BCW_HEALTH_PORT="0",
            **env,
        ),
        60,
    )


@pytest.mark.parametrize("command", ["migrate", "migrate --wait 60s", "run labeler"])
@pytest.mark.parametrize("ca_from", ["url", "PGSSLROOTCERT"])
async def test_a_ca_that_does_not_verify_the_server_is_one_line_at_once(
    tls_postgres: TlsPostgres, servers: Servers, command: str, ca_from: str
) -> None:
    url = tls_postgres.url("bcw") + "?sslmode=verify-full"
    env = {}
    if ca_from == "url":
        url = f"{url}&sslrootcert={tls_postgres.other_ca}"
        setting = f"BCW_DATABASE_URL (sslrootcert {tls_postgres.other_ca})"
    else:
        env = {"PGSSLROOTCERT": str(tls_postgres.other_ca)}
        setting = f"PGSSLROOTCERT (sslrootcert {tls_postgres.other_ca})"
    started = time.monotonic()
    code, out = await _bcw_on(url, servers, command, **env)
    assert code == 2, out
    _one_line(out, setting, "certificate verify failed")
    assert time.monotonic() - started < 20  # at once: not waited on


@pytest.mark.parametrize("command", ["config", "migrate", "migrate --wait 60s", "run labeler"])
@pytest.mark.parametrize("param", ["sslrootcert", "sslcert", "sslkey"])
async def test_a_tls_file_that_does_not_exist_is_one_line_at_once(
    tls_postgres: TlsPostgres, servers: Servers, command: str, param: str, tmp_path: Path
) -> None:
    missing = tmp_path / f"{param}.pem"
    url = f"{tls_postgres.url('bcw')}?sslmode=verify-full&sslrootcert={tls_postgres.ca}"
    url = (
        url.replace(f"{tls_postgres.ca}", str(missing))
        if param == "sslrootcert"
        else f"{url}&{param}={missing}"
    )
    started = time.monotonic()
    code, out = await _bcw_on(url, servers, command)
    assert code == 2, out
    line = _one_line(out, f"BCW_DATABASE_URL: its {param}={missing} does not exist")
    assert time.monotonic() - started < 20, line
    variable = {"sslrootcert": "PGSSLROOTCERT", "sslcert": "PGSSLCERT", "sslkey": "PGSSLKEY"}[param]
    require = f"{tls_postgres.url('bcw')}?sslmode=require"
    code, out = await _bcw_on(require, servers, command, **{variable: str(missing)})
    assert code == 2, out
    _one_line(out, f"{variable}: {missing} does not exist")


@pytest.mark.parametrize("command", ["migrate", "migrate --wait 60s", "run labeler"])
async def test_a_wrong_password_is_one_line_at_once(
    tls_postgres: TlsPostgres, servers: Servers, command: str
) -> None:
    """Credentials the server refuses: exit 3 (docs: 2 a setting, 3 refused), at once."""
    base = tls_postgres.url("bcw", user="bcw_pw:wrong-password")
    url = f"{base}?sslmode=verify-full&sslrootcert={tls_postgres.ca}"
    started = time.monotonic()
    code, out = await _bcw_on(url, servers, command)
    assert code == 3, out
    _one_line(out, "BCW_DATABASE_URL", "refused the credentials")
    assert "wrong-password" not in out
    assert time.monotonic() - started < 20
    right = f"{tls_postgres.url('bcw', user=f'bcw_pw:{PASSWORD}')}?sslmode=verify-full&sslrootcert={tls_postgres.ca}"
    conn = await asyncpg.connect(right)  # the same login with its password is let in
    await conn.close()
