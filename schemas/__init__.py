"""The bus contract of bc-workers: every fact, event and notice as a pydantic model.

Imported by the workers, the reference gateway and anyone who reads the bus. Pure data
and validation: this package imports no I/O library (an import-linter contract checks it).
"""

from schemas.base import GatewayId, Message, NodeId
from schemas.events import (
    BreakerOpen,
    CapabilitiesChanged,
    CommandCancelled,
    CommandCompleted,
    CommandEvent,
    CommandFailed,
    CommandReplayed,
    DuplicateSession,
    GatewayBlind,
    GatewaySeeing,
    NodeConnected,
    NodeDisconnected,
    Quarantined,
    Revocations,
)
from schemas.facts import (
    CertInfo,
    Closed,
    Events,
    Fact,
    Hello,
    Liveness,
    LivenessEntry,
    NodeEvent,
    PreviousSession,
    Progress,
    Rejected,
    Result,
    Status,
)
from schemas.notices import Dispatch, EventAck, Zombie
from schemas.registry import (
    REGISTRY,
    SCHEMA_HEADER,
    TYPE_HEADER,
    InvalidMessage,
    MessageError,
    Registry,
    UnknownMessageType,
)
from schemas.subjects import SubjectError, Subjects

__all__ = [
    "REGISTRY",
    "SCHEMA_HEADER",
    "TYPE_HEADER",
    "BreakerOpen",
    "CapabilitiesChanged",
    "CertInfo",
    "Closed",
    "CommandCancelled",
    "CommandCompleted",
    "CommandEvent",
    "CommandFailed",
    "CommandReplayed",
    "Dispatch",
    "DuplicateSession",
    "EventAck",
    "Events",
    "Fact",
    "GatewayBlind",
    "GatewayId",
    "GatewaySeeing",
    "Hello",
    "InvalidMessage",
    "Liveness",
    "LivenessEntry",
    "Message",
    "MessageError",
    "NodeConnected",
    "NodeDisconnected",
    "NodeEvent",
    "NodeId",
    "PreviousSession",
    "Progress",
    "Quarantined",
    "Registry",
    "Rejected",
    "Result",
    "Revocations",
    "Status",
    "SubjectError",
    "Subjects",
    "UnknownMessageType",
    "Zombie",
]
