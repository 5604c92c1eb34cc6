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


BindingKey = tuple[int, str, str, int | None, str | None]
"""what a fact's binding asks: (rule, node, gateway, epoch, journal)"""


class KnownBindings:
    """Bindings the database confirmed, remembered for `ttl` seconds, so that the facts of
    a session — its gateway sends many — are looked up once in a while, not one by one.

    Sound because what a binding asks only ever becomes true: an epoch is issued once, to
    one gateway (the Hello transaction raises the epoch with each Hello), and its row of
    `session_epochs` is deleted only once it is a day old and a later epoch exists — a
    confirmed binding is trusted at most `ttl` seconds beyond that. Only confirmations
    are remembered: a fact found foreign is asked again the next time (its Hello may
    have committed since). A Hello's binding names the Hello fact itself
    (`Binding.HELLO`): never remembered, each Hello is asked. One per consumer (one
    database); at most `size` bindings (about 12 MiB), then it starts afresh."""

    def __init__(self, ttl: float = 60.0, size: int = 50_000) -> None:
        self._ttl = ttl
        self._size = size
        self._until: dict[BindingKey, float] = {}

    def holds(self, binding: BindingKey, now: float) -> bool:
        until = self._until.get(binding)
        return until is not None and until > now

    def confirmed(self, bindings: Sequence[BindingKey], now: float) -> None:
        if len(self._until) + len(bindings) > self._size:
            self._until.clear()
        until = now + self._ttl
        for binding in bindings:
            self._until[binding] = until


async def foreign(
    conn: asyncpg.Connection, facts: Sequence[Fact], known: KnownBindings | None = None
) -> set[uuid.UUID]:
    """The ids of the facts in `facts` that do not come from a gateway of their node;
    bindings `known` holds are not asked again, those the database confirms are added."""
    now = time.monotonic()
    checked: list[tuple[Fact, int, BindingKey]] = []
    for fact in facts:
        rule = _rule(fact)
        if rule is None:
            continue
        f = fact.__dict__  # the fields without getattr's cost
        binding = (rule, f["node_id"], f["gateway_id"], f.get("epoch"), f.get("journal_id"))
        if known is None or rule == Binding.HELLO or not known.holds(binding, now):
            checked.append((fact, rule, binding))
    if not checked:
        return set()
    rows = await conn.fetch(
        UNBOUND,
        [binding[1] for _, _, binding in checked],
        [binding[2] for _, _, binding in checked],
        [binding[3] for _, _, binding in checked],
        [binding[4] for _, _, binding in checked],
        [rule for _, rule, _ in checked],
        [fact.fact_id for fact, _, _ in checked],
    )
    unbound = {row["i"] - 1 for row in rows}
    if known is not None:
        known.confirmed(
            [
                b
                for i, (_, rule, b) in enumerate(checked)
                if i not in unbound and rule != Binding.HELLO
            ],
            now,
        )
    return {checked[i][0].fact_id for i in unbound}


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
