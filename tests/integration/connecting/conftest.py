"""A PostgreSQL of this folder's own with TLS on: a CA and a server certificate made here
(openssl), the certificate's names `localhost` and 127.0.0.1; a login that only TLS
admits (`bcw_tls`, the workers' and `bcw migrate`'s) and one with a password
(`bcw_pw`, scram over TLS). The shared server is not touched. And a local endpoint that
talks as a test says (`endpoint`): a server that hangs, or one that is hostile."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.embedded.install import EmbeddedError, postgres_install
from workers.embedded.servers import EmbeddedPostgres

#: first match wins: `bcw_tls` trusted over TLS only, `bcw_pw` by its password over TLS;
#: without TLS only `postgres` (the test's own connections)
HBA = """\
hostssl   all bcw_tls  127.0.0.1/32 trust
hostssl   all postgres 127.0.0.1/32 trust
hostssl   all all      127.0.0.1/32 scram-sha-256
hostnossl all postgres 127.0.0.1/32 trust
hostnossl all all      127.0.0.1/32 reject
"""
PASSWORD = "right-password"


@dataclass(frozen=True)
class TlsPostgres:
    port: int
    ca: Path  # the CA that signed the server's certificate
    other_ca: Path  # a CA that did not
    admin_url: str  # postgres, without TLS

    def url(self, database: str, user: str = "bcw_tls", host: str = "localhost") -> str:
        return f"postgresql://{user}@{host}:{self.port}/{database}"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> Path:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )
    return directory / f"{name}.crt"


def make_server_cert(directory: Path, ca: str) -> tuple[Path, Path]:
    (directory / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        cwd=directory,
    )
    (directory / "server.key").chmod(0o600)
    return directory / "server.crt", directory / "server.key"


def _with_openssl(install: Path) -> bool:
    pg_config = install / "bin" / "pg_config"
    if not pg_config.exists():
        return False
    done = subprocess.run([pg_config, "--configure"], capture_output=True, text=True, check=False)
    return "--with-openssl" in done.stdout or "--with-ssl=openssl" in done.stdout


def tls_install() -> Path:
    """A PostgreSQL built with OpenSSL: the embedded wheel's when it is (it is not, as of
    18.6), else the system's (`pg_config` on PATH, Debian's /usr/lib/postgresql/N)."""
    candidates = []
    with contextlib.suppress(EmbeddedError):
        candidates.append(postgres_install())
    on_path = shutil.which("pg_config")
    if on_path:
        done = subprocess.run([on_path, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(done.stdout.strip()).parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*"), reverse=True)
    for install in candidates:
        if _with_openssl(install):
            return install
    pytest.skip("no PostgreSQL built with OpenSSL here (apt-get install postgresql)")


@pytest.fixture(scope="module")
def tls_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsPostgres]:
    certs = tmp_path_factory.mktemp("pg-tls-certs")
    ca = make_ca(certs, "ca")
    other_ca = make_ca(certs, "other-ca")
    cert, key = make_server_cert(certs, "ca")
    hba = certs / "pg_hba.conf"
    hba.write_text(HBA)
    install = tls_install()
    server = EmbeddedPostgres(
        tmp_path_factory.mktemp("pg-tls"),
        name="bcw-tls",
        install=install,
        settings={
            "ssl": "on",
            "ssl_cert_file": str(cert),
            "ssl_key_file": str(key),
            "hba_file": str(hba),
            "password_encryption": "scram-sha-256",
            "max_connections": "60",
            "shared_buffers": "32MB",
        },
    ).start()
    admin_url = f"postgresql://postgres@127.0.0.1:{server.port}/postgres?sslmode=disable"
    for sql in (
        "CREATE ROLE bcw_tls LOGIN SUPERUSER",
        f"CREATE ROLE bcw_pw LOGIN PASSWORD '{PASSWORD}'",
        "CREATE DATABASE bcw OWNER bcw_tls",
    ):
        _psql(server, sql)
    try:
        yield TlsPostgres(server.port, ca, other_ca, admin_url)
    finally:
        server.stop()


def _psql(server: EmbeddedPostgres, sql: str) -> None:
    import asyncio

    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(
            f"postgresql://postgres@127.0.0.1:{server.port}/postgres", ssl=False
        )
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


#: what an `endpoint` says to each connection
Speak = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def endpoint(speak: Speak | None = None) -> AsyncIterator[int]:
    """A port on 127.0.0.1 that accepts every connection, `speak`s to it (without a
    `speak`: never says a word) and holds it open; each connection is cut on leaving."""
    held: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        if speak is not None:
            with contextlib.suppress(Exception):
                await speak(reader, writer)
                await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        for writer in held:
            writer.transport.abort()
        server.close()
