"""The fact recorder's rules, pure: no await, no clock, no I/O.

Facts are not fenced (the seed): events and status reports are true whichever session
carried them, from any epoch its gateway held. What the rules guard is that nothing moves
backwards, that a gateway that held the node once takes nothing the node has not reached
since — no event seq past where the journal stood without it, no generation the node
was never given — and that an approver set is never paired with a trust version newer
than its own. Applied by `workers.recorder.apply`.
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
    """`gateway` holds the journal now: the node's session is routed to it, on that
    journal. Pure."""
    return session_gateway == gateway and session_journal == journal


def event_bound(
    session_gateway: str | None,
    session_journal: str | None,
    acked: int,
    gateway: str,
    journal: str,
    highest_stored: int | None,
) -> int | None:
    """The highest seq that events from `gateway` on `journal` may store; None: any. Pure.

    Only a gateway issued an epoch on the journal gets here (`provenance`). The one that
    holds it now stores any seq. A former holder stores only seqs the journal has been
    seen to reach without it, so it can take no seq the daemon has yet to send:

    - on the node's journal of now, up to its ack (`acked`: every seq up to it is
      stored, so nothing new — what was not acked, the daemon sends again to its gateway
      of now after the Welcome, whatever order the facts come in);
    - on an older journal (one no session continues: the daemon lost it), up to the
      highest seq stored on it: the gaps its last batches left, never past its end.
    """
    if holds_journal(session_gateway, session_journal, gateway, journal):
        return None
    if session_journal == journal:
        return acked
    return highest_stored or 0


def events_within(fact: Events, bound: int | None) -> list[NodeEvent]:
    """The events of `fact` at or below `bound` (all when None). Pure."""
    return [e for e in fact.events if bound is None or e.seq <= bound]


def counted_status(report: Status, current: bool, spec_generation: int) -> Status | None:
    """What a status report says that counts, or None when it counts for nothing. Pure.

    A report claiming a generation above the node's spec generation is not true (no
    such generation was ever given to the node): nothing of it counts. Only the node's
    session of now (`current`: its epoch, its gateway — the last one, once closed) says
    the node's status: an earlier session's report counts for nothing. Nothing true is
    lost by that — the daemon sends its latest status right after every Welcome (the
    seed) — and a former holder cannot claim a generation given to the node after it
    lost it, nor raise back a trust version the session of now's Hello stored lower.
    """
    if report.observed_generation > spec_generation or not current:
        return None
    return report


def from_current_session(
    session_epoch: int, session_gateway: str | None, epoch: int, gateway: str
) -> bool:
    """A status report from the node's session of now: its epoch, at its gateway. Pure."""
    return session_epoch == epoch and session_gateway == gateway
