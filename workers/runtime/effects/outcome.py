"""One outcome vocabulary for every fact a worker handles, settled in one place.

Handlers return an `Outcome` per fact; the consume loop settles each
(`FactConsumer._settle` in `consumer.py`: ack, nak or dead letter); no worker acks, naks
or terminates a message itself. Pure data, no I/O here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    APPLIED = "applied"
    """The fact's effects were written (and its outbox rows, and its inbox row). Ack."""
    STALE = "stale"
    """Fenced out: a newer session owns the row, the write matched nothing. Normal; ack."""
    FOREIGN = "foreign"
    """From a gateway that does not hold (nor held) the node's session at the fact's epoch
    (`provenance`): changes nothing; counted and logged. Ack; kept in the inbox."""
    IGNORED = "ignored"
    """The worker's rules do not act on this fact: by what it is (no transaction was
    opened), or by its record (`Worker.recorded`). Ack."""
    DUPLICATE = "duplicate"
    """Already in the inbox: a redelivery or a re-publish. Ack without effect."""
    RETRY = "retry"
    """Not now: redeliver after `delay` seconds (nak). The handler wrote nothing for it."""
    RELEASED = "released"
    """Not handled here (the process is stopping mid-outage): nak for redelivery at once.
    Never dead-lettered for it: the fact did nothing wrong."""
    DEAD = "dead"
    """Retrying cannot help: copy to the dead-letter subject with `reason`, then terminate."""


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    delay: float = 0.0
    reason: str = ""
    #: for DEAD: a low-cardinality class of the reason (`invalid`, `handler`, …), a metric label
    cause: str = ""

    @property
    def acks(self) -> bool:
        return self.kind in (Kind.APPLIED, Kind.STALE, Kind.FOREIGN, Kind.IGNORED, Kind.DUPLICATE)

    @property
    def keeps_inbox_row(self) -> bool:
        """Only a fact that was handled (applied, fenced out, foreign) stays in the inbox."""
        return self.kind in (Kind.APPLIED, Kind.STALE, Kind.FOREIGN)


APPLIED = Outcome(Kind.APPLIED)
STALE = Outcome(Kind.STALE)
FOREIGN = Outcome(Kind.FOREIGN)
IGNORED = Outcome(Kind.IGNORED)
DUPLICATE = Outcome(Kind.DUPLICATE)
RELEASED = Outcome(Kind.RELEASED)


def retry_after(seconds: float) -> Outcome:
    return Outcome(Kind.RETRY, delay=max(0.0, seconds))


def dead(reason: str, cause: str = "handler") -> Outcome:
    return Outcome(Kind.DEAD, reason=reason, cause=cause)
