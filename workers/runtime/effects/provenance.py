"""Facts bound to their gateway: a fact about a node takes effect only when it comes from
a gateway the node's Hello transaction issued an epoch to (`session_epochs`).

- Session-scoped facts (`hello`, `closed`, `progress`, `rejected`): the fact's epoch was
  issued to the fact's gateway. A `hello` must also be the one Hello fact of its epoch,
  when the Hello transaction recorded which (`session_epochs.hello_fact_id`): one epoch,
  one Hello; another one of the epoch, with other content, is foreign.
- Facts that are true whichever session carried them (`result`, `status`): the gateway
  was issued the fact's epoch or a later one, so a result replayed through the node's
  next gateway after a reconnect is still accepted.
- `events`: the gateway was issued an epoch whose Hello named the events' journal.
- `liveness` flushes are not checked here: each entry is fenced on node, epoch and
  gateway in the flush's own statement, so an entry for a node held elsewhere matches
  nothing (and earns its sender a zombie notice, which only concerns the sender).

Anything else is *foreign*: acked, kept in the inbox, changes nothing, counted
(`bcw_facts_total{outcome="foreign"}`) and logged once per gateway and minute.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections.abc import Sequence

import asyncpg

from schemas.facts import (
    Closed,
    Events,
    Fact,
    Hello,
    NodeFact,
    Progress,
    Rejected,
    Result,
    Status,
)


class Binding(enum.IntEnum):
    """How a fact is tied to the epochs issued to its gateway (the SQL's `rule`)."""

    EPOCH = 0
    """the fact's epoch was issued to its gateway"""
    SINCE = 1
    """its gateway was issued the fact's epoch or a later one"""
    JOURNAL = 2
    """its gateway was issued an epoch with the fact's journal"""
    HELLO = 3
    """as EPOCH, and it is the Hello fact the epoch's Hello transaction recorded"""


def binding(fact: Fact) -> Binding | None:
    """The rule a fact is checked by; None when it is not checked here."""
    if isinstance(fact, Hello):
        return Binding.HELLO
    if isinstance(fact, Closed | Progress | Rejected):
        return Binding.EPOCH
    if isinstance(fact, Result | Status):
        return Binding.SINCE
    if isinstance(fact, Events):
        return Binding.JOURNAL
    return None


# The facts (their positions) not bound to their gateway: none, as a rule, so nothing
# comes back. EXISTS in the target list is evaluated per row through the primary key; the
# fence (OFFSET 0) keeps it there — as a WHERE NOT EXISTS it could become an anti-join
# that scans the whole table.
UNBOUND = """
SELECT i FROM (
    SELECT f.i, EXISTS (
        SELECT 1 FROM session_epochs s
         WHERE s.node_id = f.node_id AND s.gateway_id = f.gateway_id
           AND CASE f.rule WHEN 0 THEN s.epoch = f.epoch
                           WHEN 1 THEN s.epoch >= f.epoch
                           WHEN 2 THEN s.journal_id = f.journal_id
                           ELSE s.epoch = f.epoch
                                AND (s.hello_fact_id IS NULL OR s.hello_fact_id = f.fact_id) END
    ) AS bound
      FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::int[], $6::uuid[])
           WITH ORDINALITY AS f(node_id, gateway_id, epoch, journal_id, rule, fact_id, i)
    OFFSET 0
) checked
 WHERE NOT bound
"""


_RULES: dict[type[Fact], int | None] = {}


def _rule(fact: Fact) -> int | None:
    """`binding(fact)` for node facts, as the SQL's int; memoized by type (a hot path)."""
    kind = type(fact)
    if kind not in _RULES:
        rule = binding(fact) if isinstance(fact, NodeFact) else None
        _RULES[kind] = None if rule is None else int(rule)
    return _RULES[kind]


async def foreign(conn: asyncpg.Connection, facts: Sequence[Fact]) -> set[uuid.UUID]:
    """The ids of the facts in `facts` that do not come from a gateway of their node."""
    checked = [(fact, rule) for fact in facts if (rule := _rule(fact)) is not None]
    if not checked:
        return set()
    fields = [fact.__dict__ for fact, _ in checked]  # not getattr: a missing one raises inside
    rows = await conn.fetch(
        UNBOUND,
        [f["node_id"] for f in fields],
        [f["gateway_id"] for f in fields],
        [f.get("epoch") for f in fields],
        [f.get("journal_id") for f in fields],
        [rule for _, rule in checked],
        [fact.fact_id for fact, _ in checked],
    )
    return {checked[row["i"] - 1][0].fact_id for row in rows}


class ForeignLog:
    """Says once per gateway and `every` seconds that its facts were foreign, and how many."""

    def __init__(self, log: logging.Logger, worker: str, every: float = 60.0) -> None:
        self._log = log
        self._worker = worker
        self._every = every
        self._said_at: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def saw(self, fact: Fact, now: float | None = None) -> bool:
        """Count one foreign fact; log it if its gateway was not logged in the last minute."""
        now = time.monotonic() if now is None else now
        gateway = fact.gateway_id
        self._since[gateway] = self._since.get(gateway, 0) + 1
        said = self._said_at.get(gateway)
        if said is not None and now - said < self._every:
            return False
        count = self._since.pop(gateway)
        self._said_at[gateway] = now
        self._log.warning(
            "%s: ignored %d fact(s) from gateway %s about nodes it does not hold, e.g. %s %s "
            "for node %s",
            self._worker,
            count,
            gateway,
            fact.BC_TYPE,
            fact.fact_id,
            getattr(fact, "node_id", "?"),
        )
        return True
