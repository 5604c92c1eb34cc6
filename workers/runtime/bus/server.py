"""The nats-server bc-workers runs on: the oldest version it accepts, what a version has
(fast batches), and the JetStream configuration it needs (`bcw auth nats` writes it).

One floor everywhere: nats-server 2.10 (stream sources with subject filters, consumers
with several filter subjects). JetStream fast batches (`allow_batched`) need 2.14: on an
older server the streams are made without them and the outbox relay publishes one
message at a time (measured in docs/benchmarks.md), so `bcw provision` never tries to set
what the server does not keep.
"""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client as NATS

from workers.runtime.base.release import parse

#: the oldest nats-server bc-workers runs on
FLOOR = (2, 10)
#: the first with JetStream fast batches (`allow_batched`)
FAST_BATCHES = (2, 14)


def _minor(text: str) -> tuple[int, ...]:
    """(major, minor) of a nats-server version; (0,) for one that does not parse."""
    version = parse(text)
    return version.release[:2] if version is not None else (0,)


def too_old(text: str) -> str | None:
    """Why bc-workers does not run on nats-server `text`, or None. Pure."""
    if _minor(text) >= FLOOR:
        return None
    return (
        f"nats-server {text or '(no version)'} is older than "
        f"{'.'.join(map(str, FLOOR))}, the oldest bc-workers runs on (fast batches need "
        f"{'.'.join(map(str, FAST_BATCHES))}): upgrade the server"
    )


def has_fast_batches(text: str) -> bool:
    """Whether nats-server `text` keeps `allow_batched` on a stream. Pure."""
    return _minor(text) >= FAST_BATCHES


def server_version(nc: NATS) -> str:
    """The version the connected server announced (`0.0.0` when not connected)."""
    version = nc.connected_server_version
    return f"{version.major}.{version.minor}.{version.patch}"


#: The nats-server configuration bc-workers needs of JetStream (`bcw auth nats` writes it
#: beside `auth.conf`; docs/durability.md says why).
JETSTREAM_FRAGMENT = """\
# Written by `bcw auth nats`: JetStream as bc-workers needs it.
#
# sync_interval: always -- JetStream writes each message to disk before it acknowledges
# it. With the default (a flush every 2 minutes, acknowledged at once) a power loss of a
# majority of an R3 cluster's servers, or one server's OS crash with a pause or a
# partition, can lose messages JetStream had acknowledged (Jepsen, NATS 2.12.1;
# nats-server issue 7564): a lost fact is a lost effect until something repeats it, a
# lost event is lost for its subscribers. It costs throughput: docs/benchmarks.md.
#
# Include this file only if your configuration has no `jetstream { }` block of its own:
# a second block replaces the first whole (its store_dir and limits fall back to their
# defaults). If it has one, add `sync_interval: always` to it instead.
jetstream {
  sync_interval: always
}
"""


def write_jetstream_fragment(directory: Path) -> Path:
    """`DIR/jetstream.conf`: the JetStream settings above; the path written."""
    path = directory / "jetstream.conf"
    path.write_text(JETSTREAM_FRAGMENT)
    return path
