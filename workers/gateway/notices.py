"""What a reference gateway obeys: the notices workers send it (`dispatch`, `zombie`,
`event-ack`, on its durable consumer `gw-<id>`) and the revocations every gateway hears.
Only `bcw provision` makes that consumer (`provision`): a gateway's principal may pull
from and ack on it, nothing else; while it is missing the gateway says so and waits.
Owned by `workers.gateway.gateway.Gateway`; a notice reaches only a live session at its
epoch, and the gateway's sessions are the one state it touches. A notice for the epoch a
Hello under way opens waits for that session's Welcome (`Opening`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError
from opentelemetry import context, trace

from schemas import REGISTRY, MessageError
from schemas.events import Revocations
from schemas.facts import CloseReason
from schemas.notices import Dispatch, EventAck, HelloAgain, Zombie
from schemas.subjects import Subjects
from workers.gateway.facts import FactPublisher
from workers.gateway.types import Opening, Session
from workers.runtime.bus.principals import gateway_durable
from workers.runtime.bus.pull import ContinuousPull
from workers.runtime.bus.streams import ProvisionError
from workers.runtime.observability import tracing

log = logging.getLogger(__name__)

End = Callable[[Session, CloseReason], Awaitable[None]]

#: seconds between looks for a missing notices consumer, and between sayings of it
MISSING_RETRY = 1.0
MISSING_SAID = 60.0


def consumer_config(subjects: Subjects, gateway_id: str) -> ConsumerConfig:
    """The notices consumer of `gateway_id`, as `bcw provision` makes it: a pull consumer
    (no deliver subject) of its own notices, each redelivered at most 10 times."""
    durable = gateway_durable(gateway_id)
    return ConsumerConfig(
        name=durable,
        durable_name=durable,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=30.0,
        max_deliver=10,
        max_ack_pending=4096,
        max_waiting=512,
        filter_subject=subjects.gateway_notices(gateway_id),
    )


#: the server's error code when a stream has all the consumers it may have
MAX_CONSUMERS_REACHED = 10026


async def provision(js: JetStreamContext, subjects: Subjects, gateway_id: str) -> None:
    """Make (or correct) the notices consumer of `gateway_id`: `bcw provision`'s, as admin.
    ProvisionError, naming the setting, when the notices stream has all the consumers it
    may have."""
    try:
        await js.add_consumer(subjects.gateway_stream, consumer_config(subjects, gateway_id))
    except BadRequestError as error:
        if error.err_code != MAX_CONSUMERS_REACHED:
            raise
        raise ProvisionError(
            f"no notices consumer for gateway {gateway_id}: stream {subjects.gateway_stream} "
            "(or the NATS account) has all the consumers it may have — raise "
            "BCW_NATS_NOTICES_MAX_CONSUMERS (one a gateway) and run bcw provision again, or "
            "the account's consumer limit"
        ) from None


class Notices:
    def __init__(
        self,
        gateway_id: str,
        nc: NATS,
        subjects: Subjects,
        facts: FactPublisher,
        sessions: Mapping[str, Session],
        end: End,
        opening: MutableMapping[str, Opening],
    ) -> None:
        self.gateway_id = gateway_id
        self.nc = nc
        self.subjects = subjects
        self.tracer = facts.tracer
        self.facts = facts  # the gateway's publisher: a Hello asked again goes out as it went
        self.sessions = sessions  # the gateway's own (read here; `end` removes one)
        self.end = end
        self.opening = opening  # the gateway's Hellos under way, by node (read here)
        self._pull: ContinuousPull | None = None
        self._present: bool | None = None  # whether its notices consumer exists (None: unknown)
        self._missing_said = 0.0  # when its missing consumer was last said (monotonic)
        self._revocations: Subscription | None = None

    async def start(self) -> None:
        """Follow this gateway's notices consumer (made by `bcw provision`, never here),
        and the revocations; a missing consumer is said, and waited for by `follow`."""
        durable = gateway_durable(self.gateway_id)
        self._pull = ContinuousPull(
            self.nc, self.subjects.gateway_stream, durable, batch=256, window=512
        )
        await self._pull.start()
        self._revocations = await self.nc.subscribe(
            self.subjects.revocations, cb=self.on_revocation
        )
        self._present = await self._found()

    @property
    def present(self) -> bool:
        """Whether its notices consumer may exist (False: found missing, no command would
        reach a session it opens)."""
        return self._present is not False

    async def _found(self) -> bool:
        """Whether the notices consumer exists; says when it is missing, or back."""
        durable, stream = gateway_durable(self.gateway_id), self.subjects.gateway_stream
        try:
            await self.nc.jetstream(timeout=2.0).consumer_info(stream, durable)
        except NotFoundError:
            if self._present is not False or time.monotonic() - self._missing_said > MISSING_SAID:
                self._missing_said = time.monotonic()
                log.warning(
                    "gateway %s: its notices consumer %s of %s is missing: no command reaches "
                    "its sessions until `bcw provision` makes it (BCW_NATS_GATEWAYS); waiting",
                    self.gateway_id,
                    durable,
                    stream,
                )
            return False
        except Exception as error:  # no answer: its pulls will tell
            log.debug("gateway %s: no notices consumer info (%r)", self.gateway_id, error)
            return True
        if self._present is False:
            log.info("gateway %s: its notices consumer %s is back", self.gateway_id, durable)
        return True

    async def stop(self) -> None:
        """Stop following; once (a second call finds nothing to stop)."""
        pull, self._pull = self._pull, None
        revocations, self._revocations = self._revocations, None
        if pull is not None:
            await pull.stop()
        if revocations is not None:
            with contextlib.suppress(nats.errors.Error):  # a closed connection took it already
                await revocations.unsubscribe()

    async def follow(self, stopping: asyncio.Event) -> None:
        """Obey the notices until `stopping`; each is acked once obeyed (or found stale)."""
        pull = self._pull
        assert pull is not None
        while not stopping.is_set():
            if not self._present:
                self._present = await self._found()
                if not self._present:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stopping.wait(), MISSING_RETRY)
                    continue
            try:
                msgs = await pull.next_batch(1.0)
            except Exception as error:
                log.debug("gateway %s notices: %s", self.gateway_id, error)
                await asyncio.sleep(0.5)
                continue
            if not msgs and pull.unanswered():  # no consumer answered a pull: gone?
                self._present = await self._found()
            for msg in msgs:
                try:
                    await self.obey(msg)
                except Exception:
                    log.exception("gateway %s could not obey a notice", self.gateway_id)
                await msg.ack()

    async def obey(self, msg: Msg) -> None:
        """One notice, in a CONSUMER span continuing the trace that sent it."""
        span = tracing.start_consumer_span(
            self.tracer,
            msg,
            (msg.headers or {}).get("Nats-Msg-Id"),
            f"gw-{self.gateway_id}",
            self.nc,
        )
        with tracing.active(span, end=True):
            try:
                notice = REGISTRY.decode(msg.headers, msg.data)
            except MessageError as error:  # a newer worker's notice type: not ours to obey
                span.set_attribute("bcw.outcome", "unreadable")
                log.warning("gateway %s skips a notice: %s", self.gateway_id, error.reason)
                return
            if self._held(notice):
                span.set_attribute("bcw.outcome", "held")  # until its session's Welcome
                return
            await self._act(notice)

    def _held(self, notice: object) -> bool:
        """Keep `notice` for the session a Hello under way opens, when it is for that epoch
        (or, before the Hello's commit says which, for any epoch but the live session's)."""
        node_id, epoch = getattr(notice, "node_id", ""), getattr(notice, "epoch", None)
        opening = self.opening.get(node_id)
        if opening is None or epoch is None:
            return False
        live = self.sessions.get(node_id)
        if opening.epoch == epoch or (
            opening.epoch is None and (live is None or live.epoch != epoch)
        ):
            opening.held.append((notice, context.get_current()))
            return True
        return False

    async def release(self, node_id: str, opening: Opening) -> None:
        """The session `opening` opened has its Welcome (and what follows it): obey what
        waited for it, in order — stale by now if its epoch is not that session's."""
        if self.opening.get(node_id) is opening:
            del self.opening[node_id]
        for notice, arrived in opening.held:
            token = context.attach(arrived)
            try:
                await self._act(notice)
            except Exception:
                log.exception("gateway %s could not obey a held notice", self.gateway_id)
            finally:
                context.detach(token)
        opening.held.clear()

    async def _act(self, notice: object) -> None:
        """Obey one notice: only a live session at its epoch takes it."""
        session = self.sessions.get(getattr(notice, "node_id", ""))
        if session is None or getattr(notice, "epoch", session.epoch) != session.epoch:
            trace.get_current_span().set_attribute("bcw.outcome", "stale")
            return
        if isinstance(notice, Dispatch):
            span = tracing.start_delivery_span(self.tracer, notice.node_id, str(notice.command_id))
            span.set_attributes(
                {"bc.command.kind": notice.kind, "bc.command.attempt": notice.attempt}
            )
            with tracing.active(span, end=True):  # onto the daemon's stream
                await session.stream.deliver(notice)
        elif isinstance(notice, Zombie):
            await self.end(session, "fenced")
        elif isinstance(notice, EventAck):
            await session.stream.event_ack(notice.journal_id, notice.seq)
        elif isinstance(notice, HelloAgain) and session.hello is not None:
            await self.facts.publish(session.hello)  # the same fact: inboxes know its id

    async def on_revocation(self, msg: Msg) -> None:
        """Sessions holding a revoked serial end (`revoked`)."""
        try:
            notice = REGISTRY.decode(msg.headers, msg.data)
        except Exception:
            return
        if not isinstance(notice, Revocations):
            return
        serials = set(notice.serials)
        for session in [s for s in self.sessions.values() if s.cert_serial in serials]:
            await self.end(session, "revoked")
