"""What follows a Welcome on a daemon's stream: the Ack of the done results its Hello
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
from collections.abc import Awaitable, Callable, Sequence
from uuid import UUID

from workers.gateway.admission import DesiredState
from workers.gateway.types import DaemonStream

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
