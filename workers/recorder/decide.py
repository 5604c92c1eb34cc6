"""The fact recorder's rules, pure: no await, no clock, no I/O.

Facts are not fenced: events and status reports are true whichever session carried
them. What the rules guard is that nothing moves backwards and that an approver set is
never paired with a trust version newer than its own. Applied by
`workers.recorder.apply`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from schemas.facts import Events, NodeEvent, Status


@dataclass(frozen=True)
class StoredStatus:
    """What a node's row holds of its status."""

    observed_generation: int
    trust_version: int
    approver_set_epoch: int | None
    approver_set_sha256: str | None


def apply_reports(stored: StoredStatus, reports: Iterable[Status]) -> StoredStatus:
    """The row after `reports` (in stream order). Pure.

    - `observed_generation` only rises;
    - a report's non-zero `trust_version` only raises the stored one (0 = unchanged);
    - the approver set is taken from a report that names its trust version (> 0) when
      that version is at least the recorded one, so a late, older report never pairs an
      old set with a newer version; an empty digest clears both columns (NULL); a report
      without a digest leaves them as they are.
    """
    generation = stored.observed_generation
    trust = stored.trust_version
    epoch, digest = stored.approver_set_epoch, stored.approver_set_sha256
    for report in reports:
        generation = max(generation, report.observed_generation)
        if report.trust_version > 0:
            if report.approver_set_sha256 is not None and report.trust_version >= trust:
                if report.approver_set_sha256 == "" or report.approver_set_epoch is None:
                    epoch, digest = None, None
                else:
                    epoch, digest = report.approver_set_epoch, report.approver_set_sha256
            trust = max(trust, report.trust_version)
    return StoredStatus(generation, trust, epoch, digest)


def unique_events(batches: Sequence[Events]) -> dict[tuple[str, str], dict[int, NodeEvent]]:
    """Events of a fact batch by (node, journal) and seq; the first copy of a seq wins. Pure."""
    out: dict[tuple[str, str], dict[int, NodeEvent]] = {}
    for fact in batches:
        journal = out.setdefault((fact.node_id, fact.journal_id), {})
        for event in fact.events:
            journal.setdefault(event.seq, event)
    return out


def highest_contiguous(base: int, stored_seqs: Iterable[int]) -> int:
    """The highest seq n such that every seq in base+1 … n is stored (base if none). Pure."""
    present = set(stored_seqs)
    n = base
    while n + 1 in present:
        n += 1
    return n


def holds_journal(
    session_gateway: str | None, session_journal: str | None, gateway: str, journal: str
) -> bool:
    """Events count only from the gateway that holds their journal now: the node's session
    is routed to that gateway, on that journal. A former holder's, or a stranger's, change
    nothing (the daemon sends again what was not acked, to its gateway of now). Pure."""
    return session_gateway == gateway and session_journal == journal


def from_current_session(
    session_epoch: int, session_gateway: str | None, epoch: int, gateway: str
) -> bool:
    """A status report counts only from the node's current session: its epoch, at its
    gateway. Pure."""
    return session_epoch == epoch and session_gateway == gateway
