"""What comes just before a Welcome — the Hello fact published, or the session closed
(`publish_hello`) — and what follows it on a daemon's stream: the Ack of the done results its Hello
carried (stored now: the Hello fact that holds them was acknowledged by JetStream), then
the node's full desired state when the daemon is behind it (`admission.desired_state_due`),
then the notices that waited for the session (`Notices.release`) — all before anything
else the workers send it.

`Gateway.hello` returns the Welcome to its caller, the daemon's side of the stream, which
takes it before its next await (as a transport writes it first); what follows goes out
from the next turn of the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from uuid import UUID

from schemas.facts import Hello
from workers.gateway.admission import Code, DesiredState
from workers.gateway.facts import FactPublisher
from workers.gateway.types import DaemonStream, Refused, Session

log = logging.getLogger(__name__)


async def follow(
    stream: DaemonStream,
    acked: Sequence[UUID],
    desired: DesiredState | None,
    then: Callable[[], Awaitable[None]],
) -> None:
    """Send, right after the Welcome the caller is returning (the gateway runs this as a
    task of its own), what follows it; `then` last (the session opens: what waited for it
    goes out), whatever became of the rest."""
    await asyncio.sleep(0)  # the Welcome first: the daemon has read it when these arrive
    try:
        if acked:
            await stream.ack_results(acked)
        if desired is not None:
            await stream.desired_state(desired)
    except Exception as error:  # the stream ended meanwhile: the next Hello says it again
        log.debug("what follows a Welcome was not sent: %r", error)
    finally:
        await then()


async def publish_hello(
    facts: FactPublisher,
    sessions: MutableMapping[str, Session],
    close: Callable[[str, int, str], Awaitable[bool]],
    hello: Hello,
) -> None:
    """Publish the Hello fact of a session just opened. One the bus refuses after its
    retries (an outage longer than them, a fact above its max payload) leaves an epoch
    raised and no fact: the session is closed (`close(node, epoch, reason)`, the fenced
    write) and the Hello refused UNAVAILABLE, with no pushback (the daemon's own back-off
    spreads its next Hellos over an outage), so that it says Hello again rather than hold a
    session that no worker will ever hear of."""
    try:
        await facts.publish(hello)
    except Exception as error:
        log.warning(
            "gateway %s: the Hello of %s (epoch %d) could not be published (%r): its session "
            "is closed and the Hello refused",
            hello.gateway_id,
            hello.node_id,
            hello.epoch,
            error,
        )
        session = sessions.get(hello.node_id)
        if session is not None and session.epoch == hello.epoch:
            del sessions[hello.node_id]
        await close(hello.node_id, hello.epoch, "stream-closed")
        raise Refused(
            Code.UNAVAILABLE, "the Hello could not be recorded: say Hello again"
        ) from error
