"""JetStream's durability as shipped: `bcw auth nats` writes a `jetstream.conf` with
`sync_interval: always`, and a real nats-server that includes it syncs every message
before it acknowledges (read back from its monitoring endpoint); the demo's `--durable`
servers do the same (and PostgreSQL runs with fsync)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import asyncpg
import pytest

from tests.integration.support import bcw
from workers.embedded.servers import (
    EmbeddedNats,
    EmbeddedPostgres,
    embedded_servers,
    free_port,
)


def _jetstream_config(monitor: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=5) as answer:
        return dict(json.load(answer)["jetstream"]["config"])


async def test_the_generated_fragment_makes_a_server_sync_always(tmp_path: Path) -> None:
    code, out = await bcw("auth", "nats", "--gateways", "gw-1", "--out", str(tmp_path / "auth"))
    assert code == 0, out
    fragment = tmp_path / "auth" / "jetstream.conf"
    assert str(fragment) in out
    assert "sync_interval: always" in fragment.read_text()
    assert "jetstream.conf" in (tmp_path / "auth" / "auth.conf").read_text()

    monitor = free_port()
    main = tmp_path / "main.conf"
    # as an operator would: the include path is relative to the including file
    main.write_text(f'http: 127.0.0.1:{monitor}\ninclude "auth/jetstream.conf"\n')
    server = EmbeddedNats(tmp_path / "nats", extra=["-c", str(main)]).start()
    try:
        config = _jetstream_config(monitor)
        assert config["sync_always"] is True
        assert str(config["store_dir"]).startswith(str(tmp_path / "nats"))
    finally:
        server.stop()


async def test_durable_embedded_servers_write_before_they_acknowledge(tmp_path: Path) -> None:
    monitor = free_port()
    nats = EmbeddedNats(tmp_path / "nats", sync_always=True, extra=["-m", str(monitor)]).start()
    postgres = EmbeddedPostgres(tmp_path / "postgres", durable=True).start()
    try:
        assert _jetstream_config(monitor)["sync_always"] is True
        conn = await asyncpg.connect(postgres.url)
        try:
            assert await conn.fetchval("SHOW fsync") == "on"
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        finally:
            await conn.close()
    finally:
        postgres.stop()
        nats.stop()
    with embedded_servers(tmp_path / "demo", durable=True) as (demo_nats, demo_postgres):
        assert demo_nats.sync_always and demo_postgres.durable  # what `bcw demo --durable` runs
    code, out = await bcw("demo", "--help")
    assert code == 0 and "--durable" in out and "sync_interval" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_bcw_demo_durable_runs_its_nats_server_syncing_always(tmp_path: Path) -> None:
    code, out = await bcw(
        "demo", "--durable", "--nodes", "20", "--gateways", "2", "--directory", str(tmp_path)
    )
    assert code == 0, out
    assert "sync_interval: always" in out and "fsync on" in out
    # the configuration file its nats-server was started with (`-c`)
    assert "sync_interval: always" in (tmp_path / "nats" / "nats-server.conf").read_text()
