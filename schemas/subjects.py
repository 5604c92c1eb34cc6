"""Subject and stream names: the one place that spells them.

Used by the runtime, the workers, the reference gateway and the tests. The subject root
(`bc` by default) is configurable so that tenants and tests do not see each other.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from schemas.base import GATEWAY_ID_RE

ROOT_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


class SubjectError(ValueError):
    """A subject that does not have the shape the contract gives it."""


@dataclass(frozen=True)
class Subjects:
    """Names of subjects and streams under one subject root."""

    root: str = "bc"

    def __post_init__(self) -> None:
        if not ROOT_RE.match(self.root):
            raise SubjectError(
                f"subject root {self.root!r} must match {ROOT_RE.pattern} (one subject token)"
            )

    # streams ---------------------------------------------------------------
    @property
    def stream_prefix(self) -> str:
        return _stream_prefix(self.root)

    @property
    def facts_stream(self) -> str:
        return f"{self.stream_prefix}_FACTS"

    def gateway_facts_stream(self, gateway_id: str) -> str:
        """The stream that takes one gateway's facts, bounded in bytes, when each gateway
        has its own (`BCW_NATS_FACTS_GATEWAYS`); the facts stream then sources them all."""
        return f"{self.facts_stream}_{gateway_id}"

    def gateway_facts(self, gateway_id: str) -> str:
        """Every fact of one gateway (its own facts stream's subject)."""
        return f"{self.root}.facts.{gateway_id}.>"

    @property
    def events_stream(self) -> str:
        return f"{self.stream_prefix}_EVENTS"

    @property
    def gateway_stream(self) -> str:
        return f"{self.stream_prefix}_GATEWAY"

    @property
    def dead_stream(self) -> str:
        """The one dead-letter stream of releases before each publisher had its own: kept,
        narrowed to `legacy_dead`, while it holds letters (listed and re-driven)."""
        return f"{self.stream_prefix}_DEAD"

    def dead_stream_of(self, publisher: str) -> str:
        """The dead letters of one publisher (a worker, the relay), bounded in bytes: its
        junk evicts only its own letters."""
        return f"{self.dead_stream}_{publisher}"

    def dead_of(self, publisher: str) -> list[str]:
        """The subjects of one publisher's dead letters (its own stream's)."""
        return [self.dead(publisher), f"{self.dead(publisher)}.>"]

    @property
    def legacy_dead(self) -> str:
        """What the old dead stream keeps taking once each publisher has its own: a subject
        nothing publishes to, so it overlaps none of theirs."""
        return f"{self.root}.dead"

    # subjects --------------------------------------------------------------
    def fact(self, gateway_id: str, fact_type: str) -> str:
        return f"{self.root}.facts.{gateway_id}.{fact_type}"

    def fact_filter(self, fact_type: str) -> str:
        """Every gateway's facts of one type (a consumer's filter subject)."""
        return f"{self.root}.facts.*.{fact_type}"

    @property
    def all_facts(self) -> str:
        return f"{self.root}.facts.>"

    def event(self, event_type: str) -> str:
        return f"{self.root}.events.{event_type}"

    @property
    def all_events(self) -> str:
        return f"{self.root}.events.>"

    @property
    def revocations(self) -> str:
        return f"{self.root}.revocations"

    def notice(self, gateway_id: str, notice_type: str) -> str:
        return f"{self.root}.gw.{gateway_id}.{notice_type}"

    def gateway_notices(self, gateway_id: str) -> str:
        return f"{self.root}.gw.{gateway_id}.>"

    @property
    def all_notices(self) -> str:
        return f"{self.root}.gw.>"

    def dead(self, worker: str) -> str:
        return f"{self.root}.dead.{worker}"

    @property
    def all_dead(self) -> str:
        return f"{self.root}.dead.>"

    def stream_of(self, subject: str) -> str | None:
        """The stream of the contract that holds `subject`; None for a subject none holds."""
        return _stream_of(self.root, subject)

    def parse_fact(self, subject: str) -> tuple[str, str]:
        """Split `<root>.facts.<gateway_id>.<type>` into (gateway_id, type)."""
        return _parse_fact(self.root, subject)


@functools.lru_cache(maxsize=4096)  # a consumer sees a few subjects per gateway, over and over
def _parse_fact(root: str, subject: str) -> tuple[str, str]:
    parts = subject.split(".")
    if (
        len(parts) != 4
        or parts[0] != root
        or parts[1] != "facts"
        or not GATEWAY_ID_RE.match(parts[2])
    ):
        raise SubjectError(f"not a fact subject under root {root!r}: {subject!r}")
    return parts[2], parts[3]


#: a subject's second token → the stream holding it (its name after the root's prefix)
_STREAM_KINDS = {"facts": "FACTS", "events": "EVENTS", "gw": "GATEWAY", "dead": "DEAD"}


def _stream_prefix(root: str) -> str:
    return root.upper().replace("-", "_")


@functools.lru_cache(maxsize=4096)  # the relay asks for every message it publishes
def _stream_of(root: str, subject: str) -> str | None:
    """The stream of root `root` holding `subject` (its `FACTS`, `EVENTS`, `GATEWAY` or
    `DEAD_<publisher>`); None for a subject none holds."""
    first, _, rest = subject.partition(".")
    if first != root:
        return None
    kind, dot, tail = rest.partition(".")
    if kind == "revocations" and not dot:
        return f"{_stream_prefix(root)}_EVENTS"
    stream = _STREAM_KINDS.get(kind) if tail else None
    if stream == "DEAD":  # each publisher's letters: a stream of its own
        return f"{_stream_prefix(root)}_DEAD_{tail.partition('.')[0]}"
    return None if stream is None else f"{_stream_prefix(root)}_{stream}"


def split_gateway_subject(subject: str) -> tuple[str, str, str] | None:
    """(`facts` or `gw`, gateway_id, type) of `<root>.facts|gw.<gateway_id>.<type>`; None for
    any other subject. Rootless: for names and records, never for a decision."""
    parts = subject.split(".")
    if len(parts) >= 4 and parts[-3] in ("facts", "gw"):
        return parts[-3], parts[-2], parts[-1]
    return None
