"""A rolling upgrade from the previous release, on real servers (docs/contract.md,
"Compatibility"): the previous release, installed in a virtualenv of its own, sets the
system up and runs its five workers while Hellos flow; this release's `bcw migrate` runs
under them; this release's workers start beside them; the old ones stop. Then it rolls
back: this release's workers stop and the previous release's run again, on the schema this
release's migrations left (within a major they only expand). Every effect is applied
exactly once, nothing is dead-lettered, no event is lost or duplicated.

`make test-upgrade` runs this alone; `make test` runs it with the rest."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import eventually
from tests.upgrade.conftest import run_bcw
from tests.upgrade.release import Release
from workers.bench.chaos.flow import (
    HELLO_WORKERS,
    INBOX_WORKERS,
    count_effects,
    hellos_handled,
    join_fleet,
    publish_hellos,
    wait_settled,
)
from workers.bench.common import print_table, spawn_workers, workers_bound
from workers.registry import WORKERS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

#: Hellos (one per node), published at `RATE` a second through every step of the upgrade:
#: 30 s of them with the relays in process, 15 s with dedicated ones
NODES = {"in-process": 900, "dedicated": 450}
RATE = 30.0


@pytest.mark.parametrize("relays", list(NODES))
async def test_a_rolling_upgrade_from_the_previous_release_applies_every_effect_once(
    old: Release,
    servers: Servers,
    empty_database_url: str,
    subjects: Subjects,
    nc: NATS,
    tmp_path: Path,
    relays: str,
) -> None:
    """`dedicated`: the workers relay nothing (`BCW_OUTBOX_RELAY=false`) and a `bcw run
    relay` process publishes every worker's rows; it is upgraded first, as
    docs/kubernetes.md says (a relay of the previous release does not read this one's
    outbox packs), and publishes the rows of the previous release's workers as well."""
    database_url = empty_database_url
    env = {
        "BCW_NATS_URL": servers.nats_url,
        "BCW_DATABASE_URL": database_url,
        "BCW_SUBJECT_ROOT": subjects.root,
        "BCW_HEALTH_PORT": "0",
        "BCW_LOG_LEVEL": "WARNING",
        # no daemon flushes liveness here: no session may age out meanwhile
        "BCW_LIVENESS_HEARTBEAT_INTERVAL": "3600",
    }
    if relays == "dedicated":
        env["BCW_OUTBOX_RELAY"] = "false"
    old_bcw, new_bcw = [str(old.bcw)], [sys.executable, "-m", "workers.cli"]
    n = NODES[relays]
    nodes = [f"up-{i:05d}" for i in range(n)]
    total = n * len(HELLO_WORKERS)

    # 1. the previous release sets the system up and runs
    for step in ("migrate", "provision"):
        code, out = await run_bcw(old_bcw, env, step)
        assert code == 0, f"{old.version} bcw {step}: {out}"
    await join_fleet(database_url, nodes)
    olds = await spawn_workers(env, tmp_path, old_bcw, f"v{old.version}-")
    if relays == "dedicated":
        olds["relay"] = await _relay(old_bcw, env, tmp_path, f"v{old.version}-")
    await eventually(lambda: workers_bound(nc.jetstream(), subjects), what="old workers bound")
    news: dict[str, asyncio.subprocess.Process] = {}
    # the Hellos of the previous release's gateways (gateways are upgraded last): three
    # fifths while the workers roll, one once the old ones stopped — on a loaded machine
    # the roll may outlast the first part, never the second — and the last one after the
    # rollback, for the previous release's workers again
    shape = as_sent_by(old, "hello")
    rolling, after, back = nodes[: 3 * n // 5], nodes[3 * n // 5 : 4 * n // 5], nodes[4 * n // 5 :]
    publishing = asyncio.create_task(publish_hellos(nc, subjects, rolling, RATE, shape=shape))
    try:
        await eventually(
            lambda: _at_least(database_url, total // 5), within=120, what="old workers applying"
        )
        # 2. this release's migrations, under the running old workers
        code, out = await run_bcw(new_bcw, env, "migrate")
        assert code == 0, f"bcw migrate: {out}"
        if relays == "dedicated":  # the relay first, then the workers
            news["relay"] = await _relay(new_bcw, env, tmp_path, "new-")
            olds["relay"].send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(olds.pop("relay").wait(), 60) == 0
        news |= await spawn_workers(env, tmp_path, new_bcw, "new-")
        await eventually(
            lambda: _at_least(database_url, total // 2), within=120, what="both applying"
        )
        # 3. the old ones stop, as a Deployment's rollout stops them: SIGTERM
        for proc in olds.values():
            proc.send_signal(signal.SIGTERM)
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in olds.values())), 60)
        await publishing
        await publish_hellos(nc, subjects, after, RATE, shape=shape)  # for the new ones alone
        upgraded = await wait_settled(database_url, n - len(back), within=180)
        # 4. the rollback: this release's workers stop, the previous release's run again
        for proc in news.values():
            proc.send_signal(signal.SIGTERM)
        new_codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in news.values())), 60)
        olds = await spawn_workers(env, tmp_path, old_bcw, f"v{old.version}-again-")
        if relays == "dedicated":
            olds["relay"] = await _relay(old_bcw, env, tmp_path, f"v{old.version}-again-")
        await publish_hellos(nc, subjects, back, RATE, shape=shape)
        settled = await wait_settled(database_url, n, within=180)
        figures = await count_effects(database_url, subjects, nc, nodes)
    finally:
        publishing.cancel()
        for proc in [*olds.values(), *news.values()]:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*(p.wait() for p in [*olds.values(), *news.values()]))
        _print_logs(tmp_path)
    print_table(
        f"rolling upgrade {old.version} ({old.commit[:12]}) → this checkout",
        ("figure", "value"),
        [(k, str(v)) for k, v in figures.items()],
    )
    assert codes == [0] * len(WORKERS), "every old worker stops cleanly on SIGTERM"
    assert new_codes == [0] * len(news), "every new worker stops cleanly on SIGTERM"
    assert upgraded >= 0, "every Hello so far handled by this release's workers"
    assert settled >= 0, "every Hello handled by its three workers, the outbox empty"
    assert (figures["effects applied"], figures["duplicates"], figures["lost"]) == (n, 0, 0)
    assert figures["dead-lettered"] == 0
    assert [figures[f"inbox rows ({w})"] for w in INBOX_WORKERS] == [n] * len(INBOX_WORKERS)
    assert figures["nodes labeled"] == n


async def _relay(
    command: list[str], env: dict[str, str], logs: Path, tag: str
) -> asyncio.subprocess.Process:
    """A dedicated relay (`bcw run relay`) of the release `command` runs."""
    relay_env = {**env, "BCW_OUTBOX_RELAY": "true"}
    return (await spawn_workers(relay_env, logs, command, tag, names=["relay"]))["relay"]


def as_sent_by(release: Release, bc_type: str) -> Callable[[bytes], bytes]:
    """A body as `release`'s producers send it: only the fields its schema has (what this
    release added since, they do not know)."""
    schema = json.loads((release.source / "schemas" / "json" / f"{bc_type}.v1.json").read_text())
    known = set(schema["properties"])

    def shape(body: bytes) -> bytes:
        return json.dumps({k: v for k, v in json.loads(body).items() if k in known}).encode()

    return shape


def _print_logs(directory: Path) -> None:
    """What the workers said (shown by pytest when the test fails)."""
    for log in sorted(directory.glob("*.log")):
        text = log.read_text()
        if text.strip():
            print(f"--- {log.name}\n{text[-3000:]}")


async def _at_least(database_url: str, n: int) -> bool:
    return await hellos_handled(database_url) >= n
