"""Dead letters: copies of messages that cannot be handled, with the reason, on
`<root>.dead.<worker>` (each publisher's in a stream of its own, `BC_DEAD_<worker>`);
listing and re-driving them (`bcw dead-letters`).

Called by the consumer loop (before it terminates a message), by the max-deliveries
advisory listener, and by the CLI. Nothing is dropped silently.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from schemas.subjects import SubjectError, Subjects

log = logging.getLogger(__name__)

REASON = "Bc-Dead-Reason"
SUBJECT = "Bc-Dead-Subject"
STREAM_SEQ = "Bc-Dead-Stream-Seq"
WORKER = "Bc-Dead-Worker"
CAUSE = "Bc-Dead-Cause"
ORIGINAL_MSG_ID = "Bc-Dead-Msg-Id"
#: set (to the body's size) when the body was too large to travel with its dead letter;
#: the whole message is kept in PostgreSQL (`outbox_dead`)
TRUNCATED = "Bc-Dead-Truncated"
#: a relay's letter: the worker whose outbox row it was (the one whose sending a redrive
#: is checked against, `letters.refusal`)
SENDER = "Bc-Dead-Sender"
#: what a letter says of itself, and what the server wrote on the stored fact (where a
#: gateway's own facts stream sourced it from): neither goes back with a re-drive
_DEAD_HEADERS = (
    REASON,
    SUBJECT,
    STREAM_SEQ,
    WORKER,
    CAUSE,
    ORIGINAL_MSG_ID,
    TRUNCATED,
    SENDER,
    "Nats-Stream-Source",
)


def _header_value(text: str) -> str:
    return " ".join(text.split())[:1024]


#: causes that say the message itself is bad (every worker would say the same): each worker
#: that reads it letters it once, in its own stream (its replicas' copies dropped as
#: duplicates within the 2-minute window); a redrive of them all re-sends it once (`resend`)
SHARED_CAUSES = frozenset({"invalid", "unsupported-major"})


def _copy_owner(worker: str, cause: str) -> str:
    return "all" if cause in SHARED_CAUSES else worker


#: an `invalid` fact's letter keeps this much of its body (the facts stream keeps it whole,
#: and a redrive re-sends that copy): a flood of large junk costs little
INVALID_KEPT = 4096


def subject_of(subjects: Subjects, worker: str, cause: str, subject: str) -> str:
    """Where a letter goes: `<root>.dead.<worker>.<cause>.<source>`, the source being the
    fact's gateway (or `outbox` for what an outbox held). The worker's own dead stream
    (`BC_DEAD_<worker>`, bounded in bytes) keeps a bounded number of letters per subject, so
    one gateway's flood of junk evicts only its own oldest letters of that cause — never
    another gateway's, nor a parked fact. Pure."""
    try:
        source = subjects.parse_fact(subject)[0]
    except SubjectError:
        source = "outbox" if subjects.stream_of(subject) != subjects.facts_stream else "unknown"
    token = cause if _TOKEN.fullmatch(cause) else "other"
    return f"{subjects.dead(worker)}.{token}.{source}"


_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


async def dead_letter(
    js: JetStreamContext,
    subjects: Subjects,
    worker: str,
    *,
    subject: str,
    stream: str,
    stream_seq: int,
    data: bytes,
    headers: Mapping[str, str] | None,
    reason: str,
    cause: str,
    sender: str | None = None,
    truncated: int | None = None,
) -> None:
    """Publish the copy and wait for its PubAck. Raises if JetStream did not take it.
    `truncated`: the size of a body too large to travel with its letter (`data` is then
    empty or a head of it)."""
    if cause == "invalid" and len(data) > INVALID_KEPT and truncated is None:
        data, truncated = data[:INVALID_KEPT], len(data)
    out = {k: v for k, v in (headers or {}).items() if k not in _DEAD_HEADERS}
    original_id = out.pop("Nats-Msg-Id", "")
    if sender is not None:
        out[SENDER] = sender
    if truncated is not None:
        out[TRUNCATED] = str(truncated)
    out.update(
        {
            REASON: _header_value(reason),
            CAUSE: cause,
            SUBJECT: subject,
            STREAM_SEQ: str(stream_seq),
            WORKER: worker,
            ORIGINAL_MSG_ID: original_id,
            # one copy per stream position, even if two replicas dead-letter it at once —
            # and, for a fact bad for every worker alike, one for all the workers
            "Nats-Msg-Id": f"dead:{_copy_owner(worker, cause)}:{stream}:{stream_seq}",
        }
    )
    await js.publish(subject_of(subjects, worker, cause, subject), data, headers=out, timeout=5)
    log.warning("dead-lettered %s seq %d for %s: %s", subject, stream_seq, worker, reason)


async def dead_letter_msg(
    js: JetStreamContext, subjects: Subjects, worker: str, msg: Msg, reason: str, cause: str
) -> None:
    meta = msg.metadata
    await dead_letter(
        js,
        subjects,
        worker,
        subject=msg.subject,
        stream=meta.stream,
        stream_seq=meta.sequence.stream,
        data=msg.data,
        headers=msg.headers,
        reason=reason,
        cause=cause,
    )


def max_deliveries_subject(stream: str, consumer: str) -> str:
    return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}"


async def watch_max_deliveries(
    nc: NATS, js: JetStreamContext, subjects: Subjects, worker: str
) -> None:
    """Dead-letter the facts JetStream stopped redelivering (the advisory is lost otherwise).

    A queue group makes one replica handle each advisory; the dead letter's Nats-Msg-Id
    dedupes the rare double.
    """

    async def on_advisory(msg: Msg) -> None:
        try:
            advisory = json.loads(msg.data)
            seq = int(advisory["stream_seq"])
            stored = await js.get_msg(subjects.facts_stream, seq)
            await dead_letter(
                js,
                subjects,
                worker,
                subject=stored.subject or "",
                stream=subjects.facts_stream,
                stream_seq=seq,
                data=stored.data or b"",
                headers=stored.headers,
                reason=f"max deliveries reached ({advisory.get('deliveries')})",
                cause="max-deliveries",
            )
        except Exception:
            log.exception("could not dead-letter after a max-deliveries advisory")

    await nc.subscribe(
        max_deliveries_subject(subjects.facts_stream, worker),
        queue=f"bcw-{worker}-advisories",
        cb=on_advisory,
    )


@dataclass(frozen=True)
class DeadLetter:
    #: the dead stream holding it (its publisher's, or the old one: `dead_streams`) and its
    #: sequence there: together its identity (`key`)
    stream: str
    seq: int
    #: the subject it is stored on (`<root>.dead.<worker>`: who published it)
    on: str
    worker: str
    reason: str
    cause: str
    subject: str
    stream_seq: int
    time: datetime | None
    headers: dict[str, str]
    data: bytes

    @property
    def key(self) -> str:
        """`STREAM:SEQ`: what `bcw dead-letters` shows and `--seq` takes."""
        return f"{self.stream}:{self.seq}"


def parse_key(text: str) -> tuple[str, int]:
    """(stream, seq) of `STREAM:SEQ`; ValueError for anything else. Pure."""
    stream, colon, seq = text.rpartition(":")
    if not colon or not stream or not seq.isdigit() or int(seq) < 1:
        raise ValueError(f"{text!r} is no dead letter (STREAM:SEQ, as listed)")
    return stream, int(seq)


def _letter(stream: str, seq: int, raw: Any) -> DeadLetter:
    headers = dict(raw.headers or {})
    return DeadLetter(
        stream=stream,
        seq=seq,
        on=raw.subject or "",
        worker=headers.get(WORKER, ""),
        reason=headers.get(REASON, ""),
        cause=headers.get(CAUSE, ""),
        subject=headers.get(SUBJECT, ""),
        stream_seq=int(headers.get(STREAM_SEQ, "0") or 0),
        time=raw.time,
        headers=headers,
        data=raw.data or b"",
    )


def is_dead(subjects: Subjects, stream: str) -> bool:
    """Whether `stream` is a dead stream: a publisher's own, or the old one. Pure."""
    return stream == subjects.dead_stream or stream.startswith(f"{subjects.dead_stream}_")


async def dead_streams(
    js: JetStreamContext, subjects: Subjects, worker: str | None = None
) -> list[str]:
    """The dead streams to read, in name order: `worker`'s own and the old one (`BC_DEAD`,
    kept while an upgraded install's holds letters); without a worker, every stream that
    takes dead letters (the server's list of names), and the old one."""
    if worker is not None:
        return sorted({subjects.dead_stream, subjects.dead_stream_of(worker)})
    names, offset = {subjects.dead_stream}, 0
    while True:
        request = json.dumps({"subject": subjects.all_dead, "offset": offset}).encode()
        reply = json.loads((await js._nc.request(f"{js._prefix}.STREAM.NAMES", request, 5)).data)
        if "error" in reply:
            raise RuntimeError(f"the server lists no streams: {reply['error']}")
        got = reply.get("streams") or []
        names.update(got)
        offset += len(got)
        if not got or offset >= int(reply.get("total", 0)):
            return sorted(n for n in names if is_dead(subjects, n))


async def list_dead_letters(
    js: JetStreamContext,
    subjects: Subjects,
    worker: str | None = None,
    limit: int = 1000,
    cause: str | None = None,
    after: tuple[str, int] | None = None,
) -> list[DeadLetter]:
    """Dead letters of every dead stream, stream by stream (`dead_streams`), each in its
    order; from the one after `after` (stream, seq) on (a page: ask again `after` the last
    one's for the next), at most `limit`, filtered.

    Read as `bcw events` reads: each request asks the stream for its next message at or
    after a sequence (`next_by_subj`), so the gaps re-driven letters leave cost nothing;
    the listing stops at the stream's last sequence when it began."""
    out: list[DeadLetter] = []
    for stream in await dead_streams(js, subjects, worker):
        if after is not None and stream < after[0]:
            continue
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            continue
        first = after[1] + 1 if after is not None and stream == after[0] else 0
        seq = max(info.state.first_seq, first, 1)
        while seq <= info.state.last_seq and len(out) < limit:
            try:
                raw = await js.get_msg(stream, seq=seq, subject=">", next=True)
            except NotFoundError:  # none at or after it
                break
            if raw.seq is None or raw.seq > info.state.last_seq:
                break
            letter = _letter(stream, raw.seq, raw)
            if (worker is None or letter.worker == worker) and (
                cause is None or letter.cause == cause
            ):
                out.append(letter)
            seq = raw.seq + 1
    return out


async def dead_letters_at(
    js: JetStreamContext, subjects: Subjects, keys: Sequence[tuple[str, int]]
) -> tuple[list[DeadLetter], list[str]]:
    """The dead letters at these (stream, seq), looked up directly; and the `STREAM:SEQ`
    that hold none (never one, re-driven already, or no dead stream's)."""
    found, missing = [], []
    for stream, seq in keys:
        try:
            if not is_dead(subjects, stream):
                raise NotFoundError
            found.append(_letter(stream, seq, await js.get_msg(stream, seq)))
        except NotFoundError:
            missing.append(f"{stream}:{seq}")
    return found, missing


async def resend(js: JetStreamContext, subjects: Subjects, letter: DeadLetter, body: bytes) -> None:
    """Publish `body` (what `letters.checked` found the letter's source sent) to the
    letter's original subject again, then delete the letter.

    The fact keeps its `fact_id`, so a fact that took effect after all is still absorbed
    by the inbox.
    """
    headers = {key: value for key, value in letter.headers.items() if key not in _DEAD_HEADERS}
    original = letter.headers.get(ORIGINAL_MSG_ID) or "unknown"
    # one re-send per message, however many letters hold it (each worker that read a bad
    # fact letters it in its own stream): the stream drops the others as duplicates
    headers["Nats-Msg-Id"] = f"redrive:{letter.subject}:{letter.stream_seq}:{original}"
    await js.publish(letter.subject, body, headers=headers, timeout=5)
    await js.delete_msg(letter.stream, letter.seq)
