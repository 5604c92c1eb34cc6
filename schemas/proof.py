"""A Hello's proof: the exact bytes a node's daemon authenticates, and how.

The daemon holds a key it was given when it joined (the control plane registers the same
key with `enroll_hello_key`); for each Hello it sends an HMAC-SHA256 by that key over
`message(...)`, with the time and a one-time id it used: its own clock (or its last `at`
+ 1 if that is later: the `at` rises) and a random id, or the time and challenge a refusal
gave it (`CHALLENGE_RE`; a daemon whose clock is wrong, or whose `at` was taken). The
database's Hello transaction (`hello_proof_holds`, its body
migrations/core/0059_proofs_kept_in_the_same_second.sql's; made in 0030) computes the
same MAC before it changes anything, so a gateway that holds no node's key cannot open
that node's session.
docs/contract.md ("The Hello's proof") gives the same bytes with a test vector.

Pure: the fake daemon signs with it, the tests compare it with the SQL; no I/O here.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Annotated

from pydantic import Field, StringConstraints

from schemas.base import SnakeMessage

VERSION_LINE = "bc-hello-proof-v1"
#: a proof's time may be this far from the control plane's clock, either way (seconds)
MAX_SKEW_SECONDS = 300
NONCE_RE = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
#: a nonce beginning `srv-` is the server's: a challenge the database issued for one node,
#: one gateway and one time (`gateway_hello_challenge`), signed with that time as `at`; the
#: database takes no other nonce beginning so
CHALLENGE_RE = re.compile(r"^srv-[0-9a-f]{16}-[0-9a-f]{40}$")
MAC_RE = re.compile(r"^[0-9a-f]{64}$")


class HelloProof(SnakeMessage):
    """What a daemon sends beside its Hello to prove it holds the node's key."""

    #: Unix seconds: the daemon's clock, or the time of the server's challenge it signs
    at: Annotated[int, Field(ge=0, le=2**62)]
    #: a one-time id: 16 to 64 of [A-Za-z0-9_-] (32 random hex digits)
    nonce: Annotated[str, StringConstraints(pattern=NONCE_RE.pattern)]
    mac: Annotated[str, StringConstraints(pattern=MAC_RE.pattern)]  # hex HMAC-SHA256 of `message`


def message(
    node_id: str, boot_id: str, journal_id: str, gateway_id: str, at: int, nonce: str
) -> bytes:
    """The bytes that are authenticated: seven lines joined by LF (no trailing LF), UTF-8 —
    the version line, the node id, boot id, journal id, the id of the gateway the daemon
    dialled, the time as a decimal integer, the one-time id. Pure."""
    fields = (VERSION_LINE, node_id, boot_id, journal_id, gateway_id, str(int(at)), nonce)
    return "\n".join(fields).encode("utf-8")


def prove(
    key: bytes,
    node_id: str,
    boot_id: str,
    journal_id: str,
    gateway_id: str,
    at: int,
    nonce: str | None = None,
) -> HelloProof:
    """The proof of a Hello by `key` (a fresh one-time id unless `nonce` is given). Pure
    but for the random id."""
    nonce = nonce if nonce is not None else secrets.token_hex(16)
    mac = hmac.new(
        key, message(node_id, boot_id, journal_id, gateway_id, at, nonce), hashlib.sha256
    )
    return HelloProof(at=int(at), nonce=nonce, mac=mac.hexdigest())


def new_key() -> bytes:
    """A node's Hello key: 32 random bytes."""
    return secrets.token_bytes(32)
