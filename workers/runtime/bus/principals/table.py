"""The bus principals (DESIGN §9): who may publish and subscribe to what, as nkey users of
a nats-server configuration fragment. `bcw auth nats` writes it (`config.write`);
`docs/kubernetes.md` shows the same table, generated from `principals()`. A worker's
principal publishes what its `grants.py` says it emits (`senders`, handed over by the
registry); the other principals are the runtime's own, here.

- `admin`: everything (provision, stream setup at migrate time, dead-letter redrive).
- `worker-<name>`: pulls from and acks on its own durable consumer of the facts stream
  (`bcw provision` makes it: the worker binds it as it is, or waits); the events, notices and
  revocations its rules emit (`senders.EMITS`, and nothing another worker emits) and its own dead
  letters (never the relay's); never a fact.
- `relay`: a dedicated outbox relay (`bcw run relay`): the events, notices and revocations
  every worker's outbox holds, and the relay's dead letters; the info of the streams it
  publishes to (`relay_streams`: all it checks at start); nothing else.
- `gateway-<id>`: its own facts; pulls from and acks on its own consumer `gw-<id>` of the
  notices stream, which only `bcw provision` creates and changes; the revocation notices.
- `operator`: a person operating the fleet: lists and re-drives dead letters, reads the
  events; creates no stream or consumer.
- `subscriber`: reads the events stream message by message (and resumes from a sequence)
  and is told of new events on their subjects; touches no consumer.
- `subscriber-<app>` (`bcw auth nats --subscribers`): the same, and pulls from and acks on
  its own durable `sub-<app>` of the events stream (`bcw provision` makes it), no other.
  No worker, gateway or subscriber creates, changes or deletes a consumer: a create
  request may name any deliver subject, where the server then sends the stream's messages.
- `tester`: the `helm test` Pod (`bcw provision --check`): the streams' info, nothing else.

Every principal's replies come to an inbox of its own, `_INBOX.<its public key>.>`, to which
it may also publish (a process probes its own connection there at start: `frames.verify`)
(`connection.connect` sets that prefix when it logs in with an nkey seed), so no principal can
read another's replies (a worker's pulled facts, say).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.base import check_gateway_ids
from schemas.facts import FACT_TYPES
from schemas.subjects import Subjects
from workers.runtime.bus.principals.senders import EMITS, dead_publishers, emitted

INBOX = "_INBOX"
INBOX_PLACEHOLDER = "<key>"


def inbox_prefix(public_key: str) -> str:
    """The inbox prefix of a client logged in with `public_key`."""
    return f"{INBOX}.{public_key}"


@dataclass(frozen=True)
class Principal:
    name: str
    does: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()


def _api(*parts: str) -> str:
    return "$JS.API." + ".".join(parts)


def relay_streams(subjects: Subjects) -> tuple[str, ...]:
    """The streams a dedicated relay (`bcw run relay`) publishes to: all it checks at start,
    and all its principal may read the info of (never a facts stream: it sends no fact)."""
    return (subjects.events_stream, subjects.gateway_stream, subjects.dead_stream_of("relay"))


def gateway_durable(gateway: str) -> str:
    """The notices consumer of `gateway` (only `bcw provision` makes it)."""
    return f"gw-{gateway}"


def subscriber_durable(app: str) -> str:
    """The events consumer of the subscriber application `app` (`bcw provision` makes it)."""
    return f"sub-{app}"


def _pulls(stream: str, durable: str) -> tuple[str, ...]:
    """Pull from and ack on one durable consumer another made: nothing that changes it."""
    return (
        _api("CONSUMER.INFO", stream, durable),
        _api("CONSUMER.MSG.NEXT", stream, durable),
        f"$JS.ACK.{stream}.{durable}.>",
    )


def principals(
    subjects: Subjects, gateways: Sequence[str], subscribers: Sequence[str] = ()
) -> list[Principal]:
    """Every principal and its grants (inboxes aside: `_INBOX.<key>.>` is added per key)."""
    facts, events = subjects.facts_stream, subjects.events_stream
    notices = subjects.gateway_stream
    streams = (facts, events, notices)
    # the operator reads every publisher's dead letters, and the old dead stream's (kept
    # while an upgraded install's holds letters: `streams.narrow_old_dead_stream`)
    dead = (subjects.dead_stream, *map(subjects.dead_stream_of, dead_publishers()))
    own_facts = tuple(subjects.gateway_facts_stream(g) for g in gateways)
    made = [
        Principal(
            "admin", "bcw provision, bcw migrate's stream setup, bcw dead-letters", (">",), (">",)
        ),
        Principal(
            "tester",
            "helm test (bcw provision --check): reads the streams' settings, nothing else",
            (_api("INFO"), *(_api("STREAM.INFO", s) for s in (*streams, *dead[1:], *own_facts))),
        ),
    ]
    for worker in EMITS:
        made.append(
            Principal(
                f"worker-{worker}",
                f"bcw run {worker}",
                publish=(
                    _api("INFO"),
                    *(_api("STREAM.INFO", s) for s in streams),
                    # its own dead letters' stream (no other's: it checks it at start), and
                    # the old one (a process of a release before it checks that one)
                    _api("STREAM.INFO", subjects.dead_stream_of(worker)),
                    _api("STREAM.INFO", subjects.dead_stream),
                    # how full each gateway's own facts stream is (BCW_NATS_FACTS_GATEWAYS)
                    *(_api("STREAM.INFO", s) for s in own_facts),
                    # its own durable, which only `bcw provision` makes and changes
                    *_pulls(facts, worker),
                    _api("STREAM.MSG.GET", facts),
                    _api("DIRECT.GET", facts),
                    # its relay publishes its own outbox rows: what its rules emit
                    *emitted(subjects, worker),
                    # its dead letters, and those of its outbox rows its relay cannot
                    # publish (never `dead.relay`: only the relay's letters say "relay"),
                    # which its own dead stream alone takes
                    *subjects.dead_of(worker),
                ),
                subscribe=(f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{facts}.{worker}",),
            )
        )
    made.append(
        Principal(
            "operator",
            "a person: bcw dead-letters (list, redrive), bcw events",
            publish=(
                _api("INFO"),
                _api("STREAM.INFO", events),
                _api("STREAM.MSG.GET", events),
                # which dead streams there are (`deadletter.dead_streams`)
                _api("STREAM.NAMES"),
                *(_api("STREAM.INFO", d) for d in dead),
                *(_api("STREAM.MSG.GET", d) for d in dead),
                # a fact's letter is re-driven as the facts stream holds it (`letters`)
                _api("STREAM.MSG.GET", facts),
                # a re-driven dead letter goes away
                *(_api("STREAM.MSG.DELETE", d) for d in dead),
                # a re-drive publishes the message again where it was bound
                subjects.all_facts,
                subjects.all_events,
                subjects.revocations,
                subjects.all_notices,
            ),
            subscribe=(subjects.all_events,),
        )
    )
    made.append(
        Principal(
            "relay",
            "bcw run relay: dedicated outbox relays (the chart's relay.enabled)",
            publish=(
                _api("INFO"),
                *(_api("STREAM.INFO", s) for s in relay_streams(subjects)),
                # the old dead stream: a relay of a release before checks it at start
                _api("STREAM.INFO", subjects.dead_stream),
                subjects.all_events,
                subjects.revocations,
                subjects.all_notices,
                *subjects.dead_of("relay"),
            ),
        )
    )
    for gateway in gateways:
        durable = gateway_durable(gateway)
        made.append(
            Principal(
                f"gateway-{gateway}",
                f"the gateway {gateway}",
                publish=(
                    _api("INFO"),
                    # no STREAM.INFO: with a subject filter it lists every gateway's
                    # notice subjects, and so every gateway id
                    # its own facts, type by type (nothing else under its subject)
                    *(subjects.fact(gateway, t.BC_TYPE) for t in FACT_TYPES),
                    # its consumer, as `bcw provision` made it: no create (nor update,
                    # delete, deliver subject), which would let it send its notices anywhere
                    *_pulls(notices, durable),
                ),
                subscribe=(subjects.revocations,),
            )
        )
    reads = (_api("INFO"), _api("STREAM.INFO", events), _api("STREAM.MSG.GET", events))
    made.append(
        Principal(
            "subscriber",
            "bcw events, dashboards: reads the events message by message, no consumer",
            publish=reads,
            subscribe=(subjects.all_events,),
        )
    )
    for app in subscribers:
        made.append(
            Principal(
                f"subscriber-{app}",
                f"the subscriber application {app}: reads the events, pulls its own durable",
                publish=(*reads, *_pulls(events, subscriber_durable(app))),
                subscribe=(subjects.all_events,),
            )
        )
    return made


#: the gateway ids, each subject-safe and given once (ValueError names the bad one)
check_gateways = check_gateway_ids


def check_subscribers(apps: Sequence[str]) -> list[str]:
    """The subscriber applications' names: as gateway ids are (ValueError names the bad one)."""
    try:
        return check_gateway_ids(apps)
    except ValueError as error:
        raise ValueError(str(error).replace("gateway id", "subscriber name")) from None
