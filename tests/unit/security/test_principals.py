"""The bus principals: the generated configuration and the documentation agree with the
code, and every principal's grants are what DESIGN §9 says (the server enforces them in
tests/integration/security/test_bus_principals.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.js.api import DiscardPolicy

from schemas.subjects import Subjects
from workers.cli.main import main
from workers.registry import ROLES, WORKER_NAMES, WORKERS
from workers.runtime.base.settings_docs import block
from workers.runtime.bus import principals, streams
from workers.runtime.store import roles_doc

SUBJECTS = Subjects("bc")

ROOT = Path(__file__).resolve().parents[3]


def test_the_principals_name_every_worker() -> None:
    """Every worker of the registry has its bus principal and its database group (its
    `grants.py`, composed by the registry), and nothing else is one."""
    made = [p.name for p in principals.principals(SUBJECTS, ["gw-1"])]
    assert [n for n in made if n.startswith("worker-")] == [f"worker-{w}" for w in sorted(WORKERS)]
    assert {ROLES.worker_of(g) for g in ROLES.GROUPS} - {None} == set(WORKERS)
    assert all((ROOT / "workers" / w / "grants.py").is_file() for w in WORKERS)


def test_the_documentation_shows_the_generated_tables() -> None:
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    assert block(doc, "principals") == principals.markdown(Subjects("bc"))
    assert block(doc, "roles") == roles_doc.markdown(ROLES)  # the database's groups


def test_every_database_group_says_what_it_is_for() -> None:
    assert set(ROLES.PURPOSES) == set(ROLES.GROUPS)
    assert "| `bcw_gateway_bound` |" in roles_doc.markdown(ROLES)


def test_every_group_that_reads_sessions_reads_their_last_sight_and_no_other() -> None:
    """`node_last_seen` (docs/contract.md's entry point) to every group that reads
    `node_sessions`, with the range rows it reads as its caller; to no other."""

    def reading(table: str) -> set[str]:
        return {
            group
            for group, grants in ROLES.GROUPS.items()
            if any(g.table == table and "SELECT" in g.privileges for g in grants)
        }

    sessions = reading("node_sessions")
    assert sessions >= {"bcw_liveness", "bcw_replay", "bcw_reader", "bcw_operator"}
    assert reading("node_last_seen") == sessions
    assert reading("liveness_ranges") >= sessions


def _grants(name: str) -> principals.Principal:
    made = {p.name: p for p in principals.principals(Subjects("t1"), ["gw-1"])}
    return made[name]


def test_no_principal_but_admin_and_operator_may_publish_a_fact_except_its_own_gateway() -> None:
    made = principals.principals(Subjects("t1"), ["gw-1", "gw-2"])
    for principal in made:
        facts = [s for s in principal.publish if s.startswith("t1.facts") or s in (">", "t1.>")]
        types = [
            "hello",
            "liveness",
            "closed",
            "progress",
            "result",
            "rejected",
            "events",
            "status",
        ]
        expected = {
            "admin": [">"],  # a gateway: its own facts, type by type, and nothing else
            "operator": ["t1.facts.>"],  # a re-drive publishes a dead-lettered fact again
            "gateway-gw-1": [f"t1.facts.gw-1.{t}" for t in types],
            "gateway-gw-2": [f"t1.facts.gw-2.{t}" for t in types],
        }.get(principal.name, [])
        assert facts == expected, principal.name


def _consumer_calls(grants: tuple[str, ...]) -> list[str]:
    return [s for s in grants if s.startswith(("$JS.API.CONSUMER.", "$JS.ACK."))]


def test_a_gateway_only_pulls_and_acks_on_its_own_consumer() -> None:
    """No create, update or delete (a create names any deliver subject): `bcw provision`
    makes its consumer; the gateway pulls from it and acks what it obeyed."""
    assert _consumer_calls(_grants("gateway-gw-1").publish) == [
        "$JS.API.CONSUMER.INFO.T1_GATEWAY.gw-gw-1",
        "$JS.API.CONSUMER.MSG.NEXT.T1_GATEWAY.gw-gw-1",
        "$JS.ACK.T1_GATEWAY.gw-gw-1.>",
    ]
    assert _grants("gateway-gw-1").subscribe == ("t1.revocations",)


@pytest.mark.parametrize("worker", WORKER_NAMES)
def test_a_worker_only_pulls_and_acks_on_its_own_consumer(worker: str) -> None:
    """No create, update or delete (a create names any deliver subject, where the server
    sends every fact): `bcw provision` makes its durable; the worker binds it."""
    assert _consumer_calls(_grants(f"worker-{worker}").publish) == [
        f"$JS.API.CONSUMER.INFO.T1_FACTS.{worker}",
        f"$JS.API.CONSUMER.MSG.NEXT.T1_FACTS.{worker}",
        f"$JS.ACK.T1_FACTS.{worker}.>",
    ]


def test_the_subscriber_reads_events_only_and_touches_no_consumer() -> None:
    subscriber = _grants("subscriber")
    assert subscriber.subscribe == ("t1.events.>",)
    assert subscriber.publish == (
        "$JS.API.INFO",
        "$JS.API.STREAM.INFO.T1_EVENTS",
        "$JS.API.STREAM.MSG.GET.T1_EVENTS",
    )


def test_a_subscriber_application_pulls_and_acks_on_its_own_durable_only() -> None:
    made = {p.name: p for p in principals.principals(Subjects("t1"), ["gw-1"], ["siem", "dash"])}
    for app in ("siem", "dash"):
        grants = made[f"subscriber-{app}"]
        assert grants.subscribe == ("t1.events.>",)
        assert grants.publish[:3] == made["subscriber"].publish
        assert _consumer_calls(grants.publish) == [
            f"$JS.API.CONSUMER.INFO.T1_EVENTS.sub-{app}",
            f"$JS.API.CONSUMER.MSG.NEXT.T1_EVENTS.sub-{app}",
            f"$JS.ACK.T1_EVENTS.sub-{app}.>",
        ]
    with pytest.raises(ValueError, match="subscriber name"):
        principals.check_subscribers(["a.b"])


def test_the_configuration_gives_each_key_its_inbox(tmp_path: Path) -> None:
    written = principals.write(tmp_path, Subjects("bc"), ["gw-1"])
    conf = (tmp_path / "auth.conf").read_text()
    for seed_file in written[1:]:
        key = principals.public_key(seed_file.read_bytes().strip())
        assert f'nkey: "{key}"' in conf
        assert f'"_INBOX.{key}.>"' in conf
        assert seed_file.stat().st_mode & 0o777 == 0o600
    again = principals.write(tmp_path, Subjects("bc"), ["gw-1", "gw-2"])
    assert [p.read_bytes() for p in again[1:] if p.name != "gateway-gw-2.nk"] == [
        p.read_bytes() for p in written[1:]
    ]  # a new gateway changes nobody's key


@pytest.mark.parametrize("bad", ["gw 1", "", "x" * 65, "gw.1"])
def test_a_bad_gateway_id_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        principals.check_gateways([bad])


def test_a_gateway_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        principals.check_gateways(["gw-1", "gw-1"])


@pytest.mark.parametrize(
    ("mode", "content", "said"),
    [
        (0o644, None, "readable or writable by others"),
        (0o620, None, "readable or writable by others"),
        (0o600, b"not a seed\n", "holds no nkey seed"),
    ],
)
def test_an_existing_seed_file_is_reused_only_if_it_is_its_owners_alone(
    tmp_path: Path, mode: int, content: bytes | None, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "auth"
    assert main(["auth", "nats", "--out", str(out)]) == 0
    seed = out / "admin.nk"
    if content is not None:
        seed.write_bytes(content)
    seed.chmod(mode)
    capsys.readouterr()
    assert main(["auth", "nats", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("bcw auth nats: --out: ") and said in error and "Traceback" not in error
    seed.chmod(0o600)
    if content is None:  # as its owner's alone, it is reused: the same key
        before = seed.read_bytes()
        assert main(["auth", "nats", "--out", str(out)]) == 0
        assert seed.read_bytes() == before


def test_auth_nats_writes_a_principal_per_subscriber_application(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "auth"
    assert main(["auth", "nats", "--out", str(out), "--subscribers", "siem, dashboards"]) == 0
    assert (out / "subscriber-siem.nk").exists() and (out / "subscriber-dashboards.nk").exists()
    assert "# subscriber-siem: " in (out / "auth.conf").read_text()
    capsys.readouterr()
    assert main(["auth", "nats", "--out", str(out), "--subscribers", "a.b"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("bcw auth nats: --subscribers: ") and "subscriber name" in error


def test_provision_makes_the_consumers_of_the_listed_gateways_and_applications() -> None:
    from workers.runtime.base.runtime_settings import NatsSettings

    nats = NatsSettings(gateways="gw-1,gw-2", facts_gateways="gw-2,gw-3", subscribers="siem")
    assert nats.notices_gateways == ("gw-1", "gw-2", "gw-3")
    assert nats.subscriber_apps == ("siem",)
    with pytest.raises(ValueError, match="gw 4"):
        NatsSettings(gateways="gw 4")


@pytest.mark.parametrize(
    ("pattern", "subject", "covered"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.b.d", False),
        ("a", "a.b", False),
        (">", "x", True),
        ("a.b.c", "a.b", False),
    ],
)
def test_subject_patterns(pattern: str, subject: str, covered: bool) -> None:
    assert principals.matches(pattern, subject) is covered


def test_every_worker_declares_what_it_emits_and_every_message_has_a_sender() -> None:
    from workers.registry import WORKERS

    assert sorted(principals.EMITS) == sorted(WORKERS) == sorted(WORKER_NAMES)
    sent = [t for made in principals.EMITS.values() for t in made]
    assert len(sent) == len(set(sent))  # one sender per message type
    from schemas import events, notices
    from schemas.base import CamelMessage, SnakeMessage

    assert {*events.EVENT_TYPES, *notices.NOTICE_TYPES} == set(sent)  # all a worker may publish
    defined = {
        c
        for module in (events, notices)
        for c in vars(module).values()
        if isinstance(c, type)
        and issubclass(c, CamelMessage | SnakeMessage)
        and "BC_TYPE" in vars(c)
    }
    assert defined == set(sent)  # and no message class is left out of those tuples


def test_an_outbox_refuses_what_its_worker_does_not_emit() -> None:
    from schemas.events import CapabilitiesChanged
    from schemas.notices import Zombie
    from workers.runtime.effects.batch import OutboxBatch

    subjects = Subjects("t1")
    zombie = Zombie(node_id="n1", epoch=1)
    with pytest.raises(principals.NotEmitted, match="labeler emits no zombie"):
        OutboxBatch("labeler").add(zombie, subjects.notice("gw-1", "zombie"))
    OutboxBatch("liveness").add(zombie, subjects.notice("gw-1", "zombie"))
    OutboxBatch("tally").add(zombie, subjects.notice("gw-1", "zombie"))  # not a worker: free
    changed = CapabilitiesChanged(
        node_id="n1", epoch=1, capabilities=["gpu"], added=["gpu"], removed=[]
    )
    assert OutboxBatch("labeler").add(changed, subjects.event(changed.BC_TYPE))


def test_each_listed_gateway_has_a_stream_of_its_own_that_only_it_fills() -> None:
    """With gateways listed, the facts stream takes no subject (it sources their streams,
    and holds what they hold: no bound of its own); each gateway's stream takes exactly
    that gateway's facts, bounded in bytes, refusing new ones when full. No subject is
    taken by two streams (the server would refuse the overlap)."""
    limits = streams.StreamLimits(max_bytes=8 * 2**30, gateways=("gw-1", "gw-2"), per_gateway=2**30)
    configs = {c.name: c for c in streams.stream_configs(SUBJECTS, limits=limits)}
    facts = configs[SUBJECTS.facts_stream]
    assert facts.subjects is None and facts.max_bytes == -1
    assert [s.name for s in facts.sources or []] == ["BC_FACTS_gw-1", "BC_FACTS_gw-2"]
    for gateway in ("gw-1", "gw-2"):
        own = configs[SUBJECTS.gateway_facts_stream(gateway)]
        assert own.subjects == [f"bc.facts.{gateway}.>"]
        assert (own.max_bytes, own.discard, own.max_age) == (2**30, DiscardPolicy.NEW, 86400)
    taken = [s for c in configs.values() for s in c.subjects or ()]
    assert len(taken) == len(set(taken))
    assert configs[SUBJECTS.events_stream].max_bytes == 8 * 2**30
    # and without: one facts stream takes them all, as before
    [single] = [c for c in streams.stream_configs(SUBJECTS) if c.name == SUBJECTS.facts_stream]
    assert single.subjects == ["bc.facts.>"] and not single.sources


def test_every_worker_may_read_how_full_each_gateways_stream_is_and_nobody_else_may_more() -> None:
    table = {p.name: p for p in principals.principals(SUBJECTS, ["gw-1"])}
    info = "$JS.API.STREAM.INFO.BC_FACTS_gw-1"
    assert all(info in table[f"worker-{w}"].publish for w in WORKER_NAMES)
    assert info not in table["gateway-gw-1"].publish  # a gateway reads no stream's info


@pytest.mark.parametrize(
    "gateways", [[], ["gw-1", "gw-2"]], ids=["one-facts-stream", "per-gateway"]
)
def test_the_tester_reads_the_info_of_the_streams_the_check_looks_at_and_nothing_else(
    gateways: list[str],
) -> None:
    """`helm test`'s `bcw provision --check` reads each stream of the contract's info: the
    `tester` principal may do that, for exactly those streams, and nothing else (no message,
    no consumer, no subscription)."""
    tester = {p.name: p for p in principals.principals(SUBJECTS, ["gw-1", "gw-2"])}["tester"]
    checked = streams.stream_configs(
        SUBJECTS, limits=streams.StreamLimits(gateways=tuple(gateways))
    )
    assert {f"$JS.API.STREAM.INFO.{c.name}" for c in checked} <= set(tester.publish)
    everything = streams.stream_configs(
        SUBJECTS, limits=streams.StreamLimits(gateways=("gw-1", "gw-2"))
    )
    assert set(tester.publish) == {
        "$JS.API.INFO",
        *(f"$JS.API.STREAM.INFO.{c.name}" for c in everything),
    }
    assert tester.subscribe == ()
