"""Base models and field types shared by every message on the bus.

Imported by the fact, event and notice modules; imports no I/O library. Every message
is a frozen pydantic model that validates strictly and ignores fields it does not know
(a tolerant reader: a newer producer's optional field takes no effect here and is not an
error; `docs/contract.md`, "Compatibility").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel

GATEWAY_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
GATEWAY_ID_RE = re.compile(GATEWAY_ID_PATTERN)

#: A gateway id is a single subject token: letters, digits, `_` and `-`, 1 to 64 long.
GatewayId = Annotated[str, StringConstraints(pattern=GATEWAY_ID_PATTERN)]


def check_gateway_ids(gateways: Iterable[str]) -> list[str]:
    """The gateway ids, each subject-safe and given once (ValueError names the bad one)."""
    seen: list[str] = []
    for gateway in gateways:
        if not GATEWAY_ID_RE.fullmatch(gateway):  # fullmatch: no newline after it either
            raise ValueError(f"{gateway!r} is not a gateway id ({GATEWAY_ID_PATTERN})")
        if gateway in seen:
            raise ValueError(f"{gateway!r} is given twice")
        seen.append(gateway)
    return seen


#: A node id: printable, no whitespace, 1 to 253 long (a DNS name fits).
NodeId = Annotated[str, StringConstraints(pattern=r"^[!-~]{1,253}$")]
#: An opaque identifier (boot, journal, session, certificate serial).
Ident = Annotated[str, StringConstraints(min_length=1, max_length=256)]
#: A short name (a command kind, a lane, a role, a capability as advertised).
Name = Annotated[str, StringConstraints(max_length=256)]
Epoch = Annotated[int, "epoch"]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^([0-9a-f]{64})?$")]


class Message(BaseModel):
    """Base of every bus message. Subclasses set `BC_TYPE` and `BC_SCHEMA`, the major
    version of the type's schema: a minor version only adds optional fields, so it is not
    on the wire; a reader that does not know a field drops it."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    BC_TYPE: ClassVar[str]
    BC_SCHEMA: ClassVar[int] = 1
    #: fields no worker stores as they came (sanitized first): a NUL in them is no reason
    #: to refuse the message (`registry.Registry.validate`)
    NEVER_STORED: ClassVar[frozenset[str]] = frozenset()


class SnakeMessage(Message):
    """Facts and notices: field names are snake_case on the wire, as in the session protocol."""


class CamelMessage(Message):
    """Events: camelCase on the wire (what operators know), snake_case in Python."""

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        strict=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )
