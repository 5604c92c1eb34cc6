"""`bcw events`: follow the session events workers publish, like a subscriber would.

It reads the events stream message by message (`STREAM.MSG.GET` with `next_by_subj`:
the next event of the type asked for, from a sequence on) and is woken by the events'
own subjects as they are published: no consumer is created, so a read-only principal
(`subscriber`) can do all of it, and nothing is left on the server. Filtered by type
(NATS wildcards) on the server and by node on the client. `--json` lines carry each
event's stream sequence: a subscriber resumes with `--start-seq` one past the last it
handled. The equivalent with the `nats` CLI: `nats stream view BC_EVENTS`, or
`nats sub 'bc.events.node.>'` for new ones (which sees a re-published event twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from schemas.subjects import Subjects
from workers.runtime.base.settings import RuntimeSettings
from workers.runtime.bus import connection
from workers.tools.display import printable


def render(
    subject: str,
    headers: Mapping[str, str] | None,
    when: datetime | None,
    body: dict[str, Any],
    as_json: bool,
    seq: int | None = None,
) -> str:
    """One event as a line: JSON (with its stream sequence, to resume from, and its
    `Nats-Msg-Id`, to drop a re-publication by) or text for a terminal."""
    bc_type = (headers or {}).get("Bc-Type", "?")
    stamp = when.isoformat(timespec="seconds") if when else "-"
    if as_json:
        return json.dumps(
            {
                "seq": seq,
                "msgId": (headers or {}).get("Nats-Msg-Id"),
                "time": stamp,
                "type": bc_type,
                "subject": subject,
                "event": body,
            }
        )
    rest = " ".join(f"{k}={v}" for k, v in body.items() if k not in ("nodeId", "epoch"))
    line = (
        f"{stamp} {bc_type:<32} {body.get('nodeId', '-'):<24} epoch={body.get('epoch', '-')} {rest}"
    )
    return printable(line)  # what a node said never reaches the terminal as a control


async def first_sequence(
    nc: NATS,
    subjects: Subjects,
    wanted: str,
    since: datetime | None,
    everything: bool,
    start_seq: int | None = None,
    warn: Callable[[str], None] = print,
) -> int:
    """Where reading starts: the stream's first event, the event at `start_seq` (or the
    first kept after it, with a warning when the stream no longer holds it), the first at
    or after `since`, or (none of them) the next one published."""
    js = nc.jetstream()
    state = (await js.stream_info(subjects.events_stream)).state
    if start_seq is not None:
        if start_seq < state.first_seq:
            warn(
                f"bcw events: the stream no longer holds events {start_seq} to "
                f"{state.first_seq - 1} (past its retention): reading on from {state.first_seq}"
            )
        return max(start_seq, state.first_seq, 1)
    if everything:
        return max(1, state.first_seq)
    if since is None:
        return state.last_seq + 1
    request = {"start_time": since.isoformat(), "next_by_subj": wanted}
    reply = await nc.request(
        f"$JS.API.STREAM.MSG.GET.{subjects.events_stream}", json.dumps(request).encode(), 5
    )
    found = json.loads(reply.data).get("message")
    return int(found["seq"]) if found else state.last_seq + 1


async def follow(
    settings: RuntimeSettings,
    *,
    event_type: str = ">",
    node: str | None = None,
    since: datetime | None = None,
    everything: bool = False,
    start_seq: int | None = None,
    as_json: bool = False,
    count: int | None = None,
    idle_exit: float | None = None,
    out: Callable[[str], None] = print,
    warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> int:
    subjects = Subjects(settings.subject_root)
    wanted = subjects.event(event_type)
    nc = await connection.connect(settings.nats, name="bcw events")
    shown = 0
    loop = asyncio.get_running_loop()
    last = loop.time()
    published = asyncio.Event()

    async def woken(_msg: object) -> None:  # the event itself is read from the stream
        published.set()

    try:
        js = nc.jetstream()
        await nc.subscribe(wanted, cb=woken)
        seq = await first_sequence(nc, subjects, wanted, since, everything, start_seq, warn)
        while count is None or shown < count:
            try:
                msg = await js.get_msg(subjects.events_stream, seq=seq, subject=wanted, next=True)
            except NotFoundError:  # nothing newer: wait for a publish (or look again soon)
                if idle_exit is not None and loop.time() - last > idle_exit:
                    break
                published.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(published.wait(), 0.5)
                continue
            seq, last = (msg.seq or seq) + 1, loop.time()
            try:
                body = json.loads(msg.data or b"")
            except ValueError:
                continue
            if not isinstance(body, dict) or (node is not None and body.get("nodeId") != node):
                continue
            out(render(msg.subject or "", msg.headers, msg.time, body, as_json, msg.seq))
            shown += 1
    finally:
        await nc.close()
    return 0
