"""NATS the same way: a server away is waited on (`bcw run`; test_cli_errors), a setting
that can never work is one line at once — a CA that does not verify the server (nats-py
alone would wait for ever on it), a TLS, credentials or nkey file that does not exist.

What is real: the `bcw` command in subprocesses, a nats-server of this module's own with
TLS on (a CA and a certificate made by the test), the session's PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.connecting.conftest import make_ca, make_server_cert
from tests.integration.support import bcw
from workers.embedded.servers import EmbeddedNats


@dataclass(frozen=True)
class TlsNats:
    url: str
    ca: Path
    other_ca: Path


@pytest.fixture(scope="module")
def tls_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNats]:
    certs = tmp_path_factory.mktemp("nats-tls-certs")
    ca, other_ca = make_ca(certs, "ca"), make_ca(certs, "other-ca")
    cert, key = make_server_cert(certs, "ca")
    server = EmbeddedNats(
        tmp_path_factory.mktemp("nats-tls"),
        extra=["--tls", "--tlscert", str(cert), "--tlskey", str(key)],
    ).start()
    yield TlsNats(f"tls://localhost:{server.port}", ca, other_ca)
    server.stop()


def _one_line(out: str, *names: str) -> None:
    lines = [line for line in out.splitlines() if line.strip() and " INFO " not in line]
    assert len(lines) == 1 and "Traceback" not in out, out
    assert all(name in lines[0] for name in names), out


@pytest.mark.parametrize("command", ["provision", "run labeler"])
async def test_a_ca_that_does_not_verify_nats_is_one_line_at_once(
    tls_nats: TlsNats, database_url: str, command: str
) -> None:
    env = {
        "BCW_NATS_URL": tls_nats.url,
        "BCW_DATABASE_URL": database_url,
        "BCW_HEALTH_PORT": "0",
        "BCW_SUBJECT_ROOT": f"t{uuid.uuid4().hex[:10]}",
    }
    started = time.monotonic()
    code, out = await asyncio.wait_for(
        bcw(*command.split(), **env, BCW_NATS_TLS_CA_FILE=str(tls_nats.other_ca)), 60
    )
    assert code == 2, out
    _one_line(out, "BCW_NATS_TLS_CA_FILE", "certificate verify failed")
    assert time.monotonic() - started < 20
    if command == "provision":  # the right CA: the same command works
        code, out = await asyncio.wait_for(
            bcw("provision", **env, BCW_NATS_TLS_CA_FILE=str(tls_nats.ca)), 60
        )
        assert code == 0, out


@pytest.mark.parametrize(
    "variable",
    ["BCW_NATS_TLS_CA_FILE", "BCW_NATS_CREDS_FILE", "BCW_NATS_NKEY_SEED_FILE"],
)
@pytest.mark.parametrize("command", ["config", "provision", "run labeler"])
async def test_a_nats_file_that_does_not_exist_is_one_line_at_once(
    tls_nats: TlsNats, command: str, variable: str, tmp_path: Path
) -> None:
    code, out = await asyncio.wait_for(
        bcw(*command.split(), BCW_NATS_URL=tls_nats.url, **{variable: str(tmp_path / "nope")}),
        60,
    )
    assert code == 2, out
    _one_line(out, variable)


async def test_an_nkey_seed_that_is_not_one_is_one_line_at_once(
    tls_nats: TlsNats, database_url: str, tmp_path: Path
) -> None:
    seed = tmp_path / "bad.nk"
    seed.write_text("not a seed\n")
    code, out = await asyncio.wait_for(
        bcw(
            "run",
            "labeler",
            BCW_NATS_URL=tls_nats.url,
            BCW_DATABASE_URL=database_url,
            BCW_NATS_TLS_CA_FILE=str(tls_nats.ca),
            BCW_NATS_NKEY_SEED_FILE=str(seed),
            BCW_HEALTH_PORT="0",
        ),
        60,
    )
    assert code == 2, out
    _one_line(out, "BCW_NATS_NKEY_SEED_FILE")
