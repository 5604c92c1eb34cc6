"""Many messages handed to the connection as one write of protocol frames.

nats-py builds each publish on its own — a subject check, a header block built key by
key with a regular expression, a formatted command, a list append and a flush kick —
about 5 µs of a core per message, paid for every ack of a fact and every message the
relay publishes. A batch's acks, and a fast batch of the relay's, are framed here in
one pass and handed to the client's write buffer at once: the same bytes on the wire,
the same checks (`nats.aio.client` refuses the same subjects, header keys and
payloads), one buffer append. Where the client does not have the buffer this uses, where
a probe at start finds the frames do not arrive as sent (`verify`: a nats-py whose
internals changed), or where the operator turned it off (`BCW_NATS_FAST_PATH=false`),
`FrameWriter.buffered` is false and the callers publish and ack message by message
through nats-py's public API, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import weakref
from collections.abc import Iterable, Mapping, Sequence

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

#: what nats-py refuses in a subject: whitespace would end the command early (and CR/LF
#: would let a value inject commands of its own)
_SUBJECT_INVALID = re.compile(r"[ \t\r\n]")
_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_LINE = b"NATS/1.0\r\n"
log = logging.getLogger(__name__)

#: the client internals a write uses (nats-py 2.x); without them, one publish a message
_INTERNALS = ("_send_command", "_flush_pending", "_flush_queue", "_pending_data_size")
#: what `verify` found of each connection (absent: not verified, the internals decide)
_VERIFIED: weakref.WeakKeyDictionary[NATS, bool] = weakref.WeakKeyDictionary()


def has_internals(nc: NATS) -> bool:
    return all(hasattr(nc, name) for name in _INTERNALS)


async def verify(nc: NATS, enabled: bool = True, within: float = 2.0) -> bool:
    """Whether this process writes frames on `nc` (the fast path): it must be `enabled`
    (`BCW_NATS_FAST_PATH`), the client must have the internals, and a probe — two
    messages with headers to an inbox of this connection, written as frames — must come
    back exactly as sent. Otherwise every `FrameWriter` of `nc` takes the public API,
    with a WARNING that says why. Run once per connection, at start."""
    if not enabled:
        _VERIFIED[nc] = False
        log.info(
            "the fast path is off (BCW_NATS_FAST_PATH=false): one publish and one ack a message"
        )
        return False
    if not has_internals(nc):
        _VERIFIED[nc] = False
        log.warning(
            "this nats-py has not the internals the fast path writes through: "
            "one publish and one ack a message"
        )
        return False
    inbox, reply = nc.new_inbox(), nc.new_inbox()  # nobody answers the reply: a probe
    got: asyncio.Queue[Msg] = asyncio.Queue()
    sub = await nc.subscribe(inbox, cb=got.put)
    sent = [(b"probe-1", {"Bc-Probe": "1"}), (b"probe-2", {"Bc-Probe": "2"})]
    ok = False
    try:
        frames = b"".join(
            hpub(check_subject(inbox), reply, header_block(headers), body) for body, headers in sent
        )
        await FrameWriter(nc, probing=True).write(frames, len(sent))
        received = [await asyncio.wait_for(got.get(), within) for _ in sent]
        ok = [(m.data, dict(m.headers or {})) for m in received] == [
            (body, headers) for body, headers in sent
        ]
    except Exception as error:  # anything but the frames back as sent: the public API
        log.debug("fast path probe failed: %r", error)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    _VERIFIED[nc] = ok
    if not ok:
        log.warning(
            "the fast path's probe did not come back from this connection's inbox as sent "
            "(a nats-py whose internals changed, or an auth.conf from before 0.4 that lets "
            "no principal publish to its own inbox: apply `bcw auth nats`'s): one publish "
            "and one ack a message"
        )
    return ok


@functools.lru_cache(maxsize=4096)  # a relay publishes to a few subjects, over and over
def check_subject(subject: str) -> bytes:
    """`subject` as sent; raises `BadSubjectError` where nats-py's publish would."""
    if not subject or _SUBJECT_INVALID.search(subject):
        raise nats.errors.BadSubjectError
    return subject.encode()


@functools.lru_cache(maxsize=64)
def _header_key(key: str) -> bytes:
    key = key.strip()
    if not _HEADER_KEY.fullmatch(key):
        raise nats.errors.BadHeaderError(key)
    return key.encode() + b": "


def _line(key: str, value: str) -> bytes:
    value = value.strip()
    if "\r" in value or "\n" in value:  # rare; `str.translate` costs 0.8 µs even when not
        value = value.replace("\r", " ").replace("\n", " ")
    return _header_key(key) + value.encode() + b"\r\n"


#: the lines of headers that repeat from message to message (a type, a schema): made once
_repeated_line = functools.lru_cache(maxsize=256)(_line)
#: headers whose value is each message's own: not worth remembering
_OWN_VALUE = frozenset({"Nats-Msg-Id", "traceparent", "tracestate"})


def header_block(headers: Mapping[str, str]) -> bytes:
    """The header block nats-py would send for `headers`: keys checked, values trimmed,
    CR/LF in a value made spaces, empty keys skipped."""
    lines = [_HEADER_LINE]
    for key, value in headers.items():
        if key in _OWN_VALUE:
            lines.append(_line(key, value))
        elif key.strip():
            lines.append(_repeated_line(key, value))
    lines.append(b"\r\n")
    return b"".join(lines)


def hpub(subject: bytes, reply: str, headers: bytes, body: bytes) -> bytes:
    """One message with headers, as a protocol frame."""
    head = len(headers)
    return b"HPUB %b %b %d %d\r\n%b%b\r\n" % (
        subject,
        reply.encode(),
        head,
        head + len(body),
        headers,
        body,
    )


def acks(msgs: Iterable[Msg]) -> bytes:
    """An ack (an empty message to its reply subject, as `Msg.ack` sends) for each of
    `msgs`, as protocol frames; a message without a reply subject is refused as
    `Msg.ack` refuses it (the others are the server's own `$JS.ACK…` subjects)."""
    frames = []
    for msg in msgs:
        if not msg.reply:
            raise nats.errors.NotJSMessageError
        frames.append(b"PUB %b 0\r\n\r\n" % msg.reply.encode())
    return b"".join(frames)


class FrameWriter:
    """Hands frames to a connection's write buffer, checked as nats-py checks a publish."""

    def __init__(self, nc: NATS, probing: bool = False) -> None:
        self._nc = nc
        # what `verify` found of this connection, else whether the internals are there
        self.buffered = has_internals(nc) and (probing or _VERIFIED.get(nc, True))

    async def write(self, frames: bytes, count: int) -> None:
        """Send `frames` (`count` messages) in one write; only where `buffered`."""
        nc = self._nc
        if nc.is_closed:
            raise nats.errors.ConnectionClosedError
        if nc.is_draining_pubs:
            raise nats.errors.ConnectionDrainingError
        if not nc.is_connected and (
            nc._max_pending_size <= 0 or len(frames) + nc._pending_data_size > nc._max_pending_size
        ):
            raise nats.errors.OutboundBufferLimitError  # as publish: nowhere to keep them
        nc.stats["out_msgs"] += count
        await nc._send_command(frames)
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()

    async def write_acks(self, msgs: Sequence[Msg]) -> None:
        """Ack every one of `msgs`, in one write where `buffered`."""
        if not self.buffered:
            for msg in msgs:
                await msg.ack()
            return
        if msgs:
            await self.write(acks(msgs), len(msgs))
            for msg in msgs:
                msg._ackd = True  # as Msg.ack: a second ack of it is refused
