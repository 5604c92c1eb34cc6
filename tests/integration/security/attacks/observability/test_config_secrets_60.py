"""Issue 60, items 3 and 4 (`bcw config` shows the `OTEL_*` it uses and a `PostgreSQL TLS`
line), attacked as anyone who reads a pod's `bcw config` (a support bundle, a pasted
issue, `kubectl exec … bcw config`): which secret in the environment does it print?

Held (pinned): the OTLP headers of all signals and of traces (`***`), a password in the
OTLP endpoint's URL or in `BCW_DATABASE_URL`'s user part, a NATS token, the client key
file's content (only its path is named).

Found, and hidden since: `OTEL_EXPORTER_OTLP_LOGS_HEADERS` and `…_METRICS_HEADERS` (the same standard
secrets, for the other signals: an API key an operator injects cluster-wide for every
signal is shown in clear); `BCW_DATABASE_URL`'s `password=` and `sslpassword=` query
parameters (libpq's and asyncpg's own forms: the client key's passphrase rides there for
the `PostgreSQL TLS` a user sets up) were shown as written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.support import bcw

pytestmark = pytest.mark.slow

HELD = {
    "OTLP headers": {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=SECRET-1"},
    "OTLP traces headers": {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=SECRET-1"},
    "OTLP endpoint password": {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://u:SECRET-1@otlp.example:4318"
    },
    "database password": {"BCW_DATABASE_URL": "postgresql://bcw:SECRET-1@db.example:5432/bcw"},
    "NATS token": {"BCW_NATS_URL": "nats://SECRET-1@nats.example:4222"},
}
FOUND = {
    "OTLP logs headers": {"OTEL_EXPORTER_OTLP_LOGS_HEADERS": "api-key=SECRET-1"},
    "OTLP metrics headers": {"OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-api-key=SECRET-1"},
    "database password= parameter": {
        "BCW_DATABASE_URL": "postgresql://bcw@db.example:5432/bcw?password=SECRET-1"
    },
    "database sslpassword= parameter": {
        "BCW_DATABASE_URL": "postgresql://bcw@db.example/bcw?sslmode=require&sslpassword=SECRET-1"
    },
}


async def _config(env: dict[str, str]) -> str:
    clean = {k: "" for k in os.environ if k.startswith(("OTEL_", "BCW_"))}
    outs = []
    for args in (("config",), ("config", "--json")):
        code, out = await bcw(*args, **{**clean, **env})
        assert code == 0, out
        outs.append(out)
    return "\n".join(outs)


@pytest.mark.parametrize("env", HELD.values(), ids=HELD.keys())
async def test_bcw_config_hides_the_secrets_it_knows(env: dict[str, str]) -> None:
    out = await _config(env)
    assert "SECRET-1" not in out
    assert next(iter(env)) in out  # the variable is shown, its secret is not


async def test_the_tls_line_names_the_key_file_never_its_content(tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\nSECRET-1\n-----END PRIVATE KEY-----\n")
    cert, ca = tmp_path / "client.crt", tmp_path / "ca.crt"
    cert.write_text("cert")
    ca.write_text("ca")
    url = (
        f"postgresql://bcw@db.example/bcw?sslmode=verify-full&sslrootcert={ca}"
        f"&sslcert={cert}&sslkey={key}"
    )
    out = await _config({"BCW_DATABASE_URL": url})
    assert "SECRET-1" not in out and "PostgreSQL TLS" in out


@pytest.mark.parametrize("env", FOUND.values(), ids=FOUND.keys())
async def test_bcw_config_hides_every_standard_secret(env: dict[str, str]) -> None:
    assert "SECRET-1" not in await _config(env)
