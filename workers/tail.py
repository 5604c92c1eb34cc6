"""`bcw events`: follow the session events workers publish, like a subscriber would.

An ordered consumer on the events stream (no state on the server, nothing to clean
up), filtered by type (NATS wildcards) on the server and by node on the client. The
equivalent with the `nats` CLI:

    nats sub --stream BC_EVENTS 'bc.events.node.>'          # or: nats stream view BC_EVENTS
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from schemas.subjects import Subjects
from workers.display import printable
from workers.runtime.base.settings import Settings
from workers.runtime.bus import connection

DURATION = re.compile(r"^(\d+)([smhd])$")


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`10m`, `2h`, `1d` ago, or an ISO 8601 time."""
    match = DURATION.match(text)
    if match:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
        return (now or datetime.now(UTC)) - timedelta(**{unit: int(match.group(1))})
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def render(msg: Msg, body: dict[str, Any], as_json: bool) -> str:
    bc_type = (msg.headers or {}).get("Bc-Type", "?")
    when = msg.metadata.timestamp.isoformat(timespec="seconds") if msg.metadata.timestamp else "-"
    if as_json:
        return json.dumps({"time": when, "type": bc_type, "subject": msg.subject, "event": body})
    rest = " ".join(f"{k}={v}" for k, v in body.items() if k not in ("nodeId", "epoch"))
    line = (
        f"{when} {bc_type:<32} {body.get('nodeId', '-'):<24} epoch={body.get('epoch', '-')} {rest}"
    )
    return printable(line)  # what a node said never reaches the terminal as a control


async def follow(
    settings: Settings,
    *,
    event_type: str = ">",
    node: str | None = None,
    since: str | None = None,
    everything: bool = False,
    as_json: bool = False,
    count: int | None = None,
    idle_exit: float | None = None,
    out: Callable[[str], None] = print,
) -> int:
    subjects = Subjects(settings.subject_root)
    nc = await connection.connect(settings.nats, name="bcw events")
    shown = 0
    done = asyncio.Event()
    last = asyncio.get_running_loop().time()

    async def on_message(msg: Msg) -> None:
        nonlocal shown, last
        last = asyncio.get_running_loop().time()
        if done.is_set():
            return
        try:
            body = json.loads(msg.data)
        except ValueError:
            return
        if node is not None and body.get("nodeId") != node:
            return
        out(render(msg, body, as_json))
        shown += 1
        if count is not None and shown >= count:
            done.set()

    options: dict[str, Any] = {"deliver_policy": DeliverPolicy.NEW}
    if everything:
        options = {"deliver_policy": DeliverPolicy.ALL}
    elif since:
        options = {
            "deliver_policy": DeliverPolicy.BY_START_TIME,
            "opt_start_time": parse_since(since).isoformat(),
        }
    try:
        js = nc.jetstream()
        await js.subscribe(
            subjects.event(event_type),
            stream=subjects.events_stream,
            ordered_consumer=True,
            cb=on_message,
            config=ConsumerConfig(**options),
        )
        while not done.is_set():
            await asyncio.sleep(0.1)
            if idle_exit is not None and asyncio.get_running_loop().time() - last > idle_exit:
                break
    finally:
        await nc.close()
    return 0
