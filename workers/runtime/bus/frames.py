"""Many messages handed to the connection as one write of protocol frames.

nats-py builds each publish on its own — a subject check, a header block built key by
key with a regular expression, a formatted command, a list append and a flush kick —
about 5 µs of a core per message, paid for every ack of a fact and every message the
relay publishes. A batch's acks, and a fast batch of the relay's, are framed here in
one pass and handed to the client's write buffer at once: the same bytes on the wire,
the same checks (`nats.aio.client` refuses the same subjects, header keys and
payloads), one buffer append. Where the client does not have the buffer this uses (a
nats-py other than the one tested: `FrameWriter.buffered` is false), the callers publish
message by message as before.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

#: what nats-py refuses in a subject: whitespace would end the command early (and CR/LF
#: would let a value inject commands of its own)
_SUBJECT_INVALID = re.compile(r"[ \t\r\n]")
_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_LINE = b"NATS/1.0\r\n"
#: the client internals a write uses (nats-py 2.x); without them, one publish a message
_INTERNALS = ("_send_command", "_flush_pending", "_flush_queue", "_pending_data_size")


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

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self.buffered = all(hasattr(nc, name) for name in _INTERNALS)

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
