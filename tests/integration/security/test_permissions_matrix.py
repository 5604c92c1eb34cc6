"""Every cell of the bus's permissions table, tried on a real nats-server: each principal
of `principals()` logs in with its own nkey and publishes to, then subscribes to, every
subject of the contract (facts, events, notices, revocations, dead letters, inboxes, the
JetStream API and acks); what its grants cover goes through and everything else is
refused — the expectation computed from the same table the server's `auth.conf` is."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from schemas.events import EVENT_TYPES, Revocations
from schemas.facts import FACT_TYPES
from schemas.notices import NOTICE_TYPES
from schemas.subjects import Subjects
from workers.embedded.servers import EmbeddedNats
from workers.registry import DEAD_PUBLISHERS, WORKER_NAMES
from workers.runtime.bus import principals

pytestmark = pytest.mark.slow

SUBJECTS = Subjects("mx")  # a root of its own: nothing here touches another test's streams
GATEWAYS = ["gw-1", "gw-2"]
SUBSCRIBERS = ["siem", "dash"]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("matrix")
    principals.write(directory, SUBJECTS, GATEWAYS, SUBSCRIBERS)
    return directory


@pytest.fixture(scope="module")
def server(keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    conf = keys / "server.conf"
    conf.write_text('include "auth.conf"\n')
    embedded = EmbeddedNats(tmp_path_factory.mktemp("nats-matrix"), extra=["-c", str(conf)])
    embedded.start()
    yield embedded.url
    embedded.stop()


@pytest.fixture(scope="module")
def identities(keys: Path) -> dict[str, tuple[Path, str]]:
    """Each principal's seed file and public key."""
    return {
        seed.stem: (seed, principals.public_key(seed.read_bytes().strip()))
        for seed in sorted(keys.glob("*.nk"))
    }


def probes(identities: dict[str, tuple[Path, str]]) -> list[str]:
    """One concrete subject for every kind of thing a principal might try."""
    s = SUBJECTS
    streams = [s.facts_stream, s.events_stream, s.gateway_stream, s.dead_stream]
    streams += [s.dead_stream_of(p) for p in DEAD_PUBLISHERS]  # each publisher's
    streams += [s.gateway_facts_stream(g) for g in GATEWAYS]  # each gateway's own facts
    consumers = [*WORKER_NAMES, *(f"gw-{g}" for g in GATEWAYS), "spy", "siem"]
    consumers += [principals.subscriber_durable(a) for a in SUBSCRIBERS]
    out = [f"{s.root}.facts.{g}.{t.BC_TYPE}" for g in GATEWAYS for t in FACT_TYPES]
    out += [s.fact(g, "bogus") for g in GATEWAYS]
    out += [s.event(t.BC_TYPE) for t in EVENT_TYPES if t is not Revocations]
    out += [s.event("made.up"), s.revocations]
    out += [
        s.notice(g, t) for g in GATEWAYS for t in [*(n.BC_TYPE for n in NOTICE_TYPES), "made-up"]
    ]
    out += [s.dead(w) for w in [*WORKER_NAMES, "relay", "gateway"]]
    out += [f"{s.dead(w)}.invented.{w}-1" for w in [*DEAD_PUBLISHERS, "gateway"]]
    out += [s.legacy_dead, "$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST"]
    for stream in streams:
        out += [
            f"$JS.API.STREAM.{op}.{stream}"
            for op in ("INFO", "CREATE", "UPDATE", "DELETE", "PURGE", "MSG.GET", "MSG.DELETE")
        ]
        out += [f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}"]
        for name in consumers:
            out += [
                f"$JS.API.CONSUMER.{op}.{stream}.{name}"
                for op in ("CREATE", "DURABLE.CREATE", "INFO", "DELETE", "MSG.NEXT")
            ]
            out += [f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{s.notice(GATEWAYS[0], 'dispatch')}"]
            out += [f"$JS.ACK.{stream}.{name}.1.1.1.1.0"]
    out += [
        f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{s.facts_stream}.{w}" for w in WORKER_NAMES
    ]
    out += [principals.inbox_prefix(key) + ".x" for _, key in identities.values()]  # inboxes
    return out


def _allowed(grants: tuple[str, ...], subject: str) -> bool:
    return any(principals.matches(grant, subject) for grant in grants)


async def _refused(url: str, seed: Path, key: str, subjects: list[str], kind: str) -> set[str]:
    """What the server refused of `subjects` to this principal (publish or subscribe)."""
    complaints: list[str] = []

    async def on_error(error: Exception) -> None:
        complaints.append(str(error))

    nc = await nats.connect(
        url,
        nkeys_seed=str(seed),
        inbox_prefix=principals.inbox_prefix(key),
        error_cb=on_error,
        max_reconnect_attempts=0,
    )
    try:
        for subject in subjects:
            if kind == "Publish":
                await nc.publish(subject, b"")
            else:
                await nc.subscribe(subject)
        await nc.flush()
        await asyncio.sleep(0.5)  # the server's complaints arrive after the flush's pong
        await nc.flush()
    finally:
        await nc.close()
    pattern = re.compile(rf'permissions violation for {kind.lower()} to "([^"]+)"', re.I)
    return {m.group(1).lower() for c in complaints for m in pattern.finditer(c)}


@pytest.mark.parametrize("kind", ["Publish", "Subscription"])
async def test_every_principal_against_every_subject(
    identities: dict[str, tuple[Path, str]], server: str, kind: str
) -> None:
    subjects = probes(identities)
    assert len(subjects) > 200
    made = principals.principals(SUBJECTS, GATEWAYS, SUBSCRIBERS)
    assert {p.name for p in made} == set(identities)
    for principal in made:
        seed, key = identities[principal.name]
        publish, subscribe = principals.grants_of(principal, principals.inbox_prefix(key) + ".>")
        grants = publish if kind == "Publish" else subscribe
        # (nats-py hands the server's complaint over in lower case)
        wanted = {subject.lower() for subject in subjects if not _allowed(grants, subject)}
        refused = await _refused(server, seed, key, subjects, kind)
        assert refused == wanted, (principal.name, refused ^ wanted)


def test_a_worker_may_publish_only_what_its_rules_emit() -> None:
    """The table itself, read as an operator would: no worker can send another's messages."""
    made = {p.name: p for p in principals.principals(SUBJECTS, GATEWAYS)}
    dispatch = SUBJECTS.notice("gw-1", "dispatch")
    revocations = SUBJECTS.revocations
    senders = {name for name, p in made.items() if _allowed(p.publish, dispatch)}
    assert senders == {"admin", "worker-replay", "relay", "operator"}
    senders = {name for name, p in made.items() if _allowed(p.publish, revocations)}
    assert senders == {"admin", "worker-quarantine", "relay", "operator"}
    labeler = made["worker-labeler"].publish
    assert _allowed(labeler, SUBJECTS.event("node.capabilities-changed"))
    assert not _allowed(labeler, SUBJECTS.event("node.connected"))


def test_each_publisher_of_dead_letters_reaches_its_own_stream_only() -> None:
    """The table, read for dead letters: each worker and the relay publish under their own
    subjects only and read the info of their own dead stream only (never another's; the old
    one's, which an older release's process checks at start); the operator reads and
    deletes in every one of them."""
    made = {p.name: p for p in principals.principals(SUBJECTS, GATEWAYS)}
    for publisher in DEAD_PUBLISHERS:
        name = publisher if publisher == "relay" else f"worker-{publisher}"
        grants = made[name].publish
        for other in DEAD_PUBLISHERS:
            mine = other == publisher
            info = f"$JS.API.STREAM.INFO.{SUBJECTS.dead_stream_of(other)}"
            assert _allowed(grants, f"{SUBJECTS.dead(other)}.x.y") == mine, (name, other)
            assert _allowed(grants, info) == mine, (name, other)
        assert not _allowed(grants, SUBJECTS.legacy_dead)
        assert not _allowed(grants, f"$JS.API.STREAM.MSG.GET.{SUBJECTS.dead_stream}")
    operator = made["operator"].publish
    for stream in (SUBJECTS.dead_stream, *map(SUBJECTS.dead_stream_of, DEAD_PUBLISHERS)):
        for op in ("INFO", "MSG.GET", "MSG.DELETE"):
            assert _allowed(operator, f"$JS.API.STREAM.{op}.{stream}")
    assert not _allowed(operator, f"{SUBJECTS.dead('relay')}.x")  # it plants no letter
