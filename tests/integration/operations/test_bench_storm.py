"""`bcw bench storm` runs its gateways in processes of their own: a small herd through
them reaches every worker, and the figures are printed (the bench itself waits for every
effect — labels, replays, the outbox published — before it prints them)."""

from __future__ import annotations

import re

from tests.conftest import Servers
from tests.integration.support import bcw


async def test_a_small_storm_through_gateway_processes_applies_every_effect(
    servers: Servers,
) -> None:
    code, out = await bcw(
        "bench", "storm", "--nodes", "300", "--gateways", "4", "--processes", "2",
        BCW_NATS_URL=servers.nats_url, BCW_DATABASE_URL=servers.postgres_url,
    )  # fmt: skip
    assert code == 0, out
    assert "300 nodes over 4 gateways in 2 processes" in out
    accepted = re.search(r"Hellos accepted by the gateways\s+([\d,]+) /s", out)
    assert accepted is not None and int(accepted.group(1).replace(",", "")) > 0
    for worker in ("labeler", "liveness", "quarantine", "replay"):
        assert re.search(rf"{worker}: Hello facts/s\s+[\d,]+", out), out
    assert "Traceback" not in out


async def test_bench_hello_prints_what_a_proof_adds_to_the_hello_transaction(
    servers: Servers,
) -> None:
    code, out = await bcw(
        "bench", "hello", "--nodes", "400", "--rounds", "1",
        BCW_NATS_URL=servers.nats_url, BCW_DATABASE_URL=servers.postgres_url,
    )  # fmt: skip
    assert code == 0, out
    without = re.search(r"without a proof\s+([\d,]+)", out)
    proven = re.search(
        r"with a proof \(HMAC-SHA256 in SQL, its one-time id taken\)\s+([\d,]+)", out
    )
    assert without is not None and proven is not None, out
    assert int(without.group(1).replace(",", "")) > 0 and int(proven.group(1).replace(",", "")) > 0
    assert "what the proof adds" in out and "Traceback" not in out
