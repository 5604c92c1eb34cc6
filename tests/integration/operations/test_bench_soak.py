"""`bcw bench soak`: the five workers in processes of their own under the simulator's
churn, each sampled from /proc; the figures are printed and a slope above the bound
fails the run (here a bound no process can meet, to see it fail). With `--heap`, each
worker traces its allocations and the run names what its heap gained."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Servers
from tests.integration.support import bcw


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_short_soak_prints_each_process_and_fails_above_the_bound(
    servers: Servers, tmp_path: Path
) -> None:
    code, out = await bcw(
        "bench",
        "soak",
        "--minutes",
        "0.3",
        "--nodes",
        "20",
        "--gateways",
        "2",
        "--max-slope=-1000000",
        "--heap",
        BCW_NATS_URL=servers.nats_url,
        BCW_DATABASE_URL=servers.postgres_url,
        TMPDIR=str(tmp_path),  # the workers' logs stay with the test
    )
    assert code == 1, out
    assert re.search(r"\d+ churn rounds \(0 failed checks\), 0 dead-lettered", out), out
    for worker in ("labeler", "liveness", "quarantine", "recorder", "replay"):
        row = re.search(
            rf"^\s+{worker}\s+([\d.]+) / ([\d.]+) / ([\d.]+)\s+[-+][\d.]+\s+(\d+) -> (\d+)"
            rf"\s+(\d+) -> (\d+)\s+(\d+) -> (\d+)",
            out,
            re.M,
        )
        assert row is not None, out
        # the last sample: a start under load may briefly hold a second, failed connection
        rss, fds, postgres, nats = float(row[1]), int(row[4]), int(row[7]), int(row[9])
        assert 20 < rss < 500 and fds > 3 and postgres >= 1 and nats == 1, row[0]
        assert f"FAIL {worker}: memory grew" in out
        heap = re.search(rf"^{worker}: traced heap [-+][\d,]+ KiB/h after the warm-up", out, re.M)
        assert heap is not None, out
    assert "Traceback" not in out
    assert _logs(tmp_path) == [
        "heap",
        *(f"{w}.log" for w in ("labeler", "liveness", "quarantine", "recorder", "replay")),
    ]


def _logs(tmp_path: Path) -> list[str]:
    [logs] = tmp_path.glob("bcw-soak-*")
    return sorted(log.name for log in logs.iterdir())
