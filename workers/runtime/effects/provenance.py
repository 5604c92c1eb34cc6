"""Facts bound to their gateway: a fact about a node takes effect only when it comes from
a gateway that holds, or held, what the fact speaks of — and only for what that gateway
could have seen. Checked in two places, both named in `FENCES`, one row per fact type:

- here, before any rule sees the fact (`check`): the fact's epoch was issued to the
  fact's gateway (`session_epochs`) — for a `hello`, it must also be the one Hello fact
  the epoch's Hello transaction recorded; for `events`, the gateway was issued an epoch
  on the events' journal. What this asks only ever becomes true, so a confirmation is
  remembered a minute (`KnownBindings`), the Hello's excepted;
- in the worker's write, under the node's lock, where it can change. Routing and
  sightings are fenced on the session of now: a flush entry matches node, epoch
  and gateway; a close, the row's epoch and gateway. Facts are not (the seed: they are
  true whichever session carried them), but each counts only for what its gateway saw
  at its epoch: an answer (`progress`, `result`, `rejected`), for a command delivered at
  the fact's epoch, whatever epoch it is at now (a BUSY only for the delivery of now);
  `events`, any seq from the holder of the journal now, from a former holder only seqs
  the journal has reached without it; `status`, never a generation above the node's spec
  generation, its trust version only from the session of now.

Anything failing the first is *foreign*: acked, kept in the inbox, changes nothing, counted
(`bcw_facts_total{outcome="foreign"}`) and logged once per gateway and minute; the second
is *stale*. A Hello that passes is handed on as its transaction recorded it
(`as_recorded`): the session before it is what that transaction saw under the node's
lock, never the gateway's word. What a former holder's true fact does is the same
whatever order the facts are applied in (docs/runtime.md).
"""

from __future__ import annotations

import enum
import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from schemas.facts import (
    Closed,
    Events,
    Fact,
    Hello,
    Liveness,
    NodeFact,
    PreviousSession,
    Progress,
    Rejected,
    Result,
    Status,
    is_duplicate_identity,
)


class Binding(enum.IntEnum):
    """How a fact is tied to the epochs issued to its gateway (the SQL's `rule`)."""

    EPOCH = 0
    """the fact's epoch was issued to its gateway"""
    JOURNAL = 2
    """its gateway was issued an epoch with the fact's journal"""
    HELLO = 3
    """as EPOCH, and it is the Hello fact the epoch's Hello transaction recorded"""


@dataclass(frozen=True)
class Fence:
    """What a fact of one type must come from: the binding checked here (None: none, its
    write checks it all), and the fence of the worker's write."""

    binding: Binding | None
    write: str


#: Every fact type's fencing, in one place (docs/contract.md, "Every fact fenced on its
#: holder"); tests/integration/security/gateways/test_fences.py tries each row as the
#: holder, as a former holder (its true facts and its forged ones) and as a stranger.
#: The write fences are kept by their workers: answers in `workers.replay.deliveries`,
#: events and status in `workers.recorder.decide`.
FENCES: dict[type[Fact], Fence] = {
    Hello: Fence(Binding.HELLO, "the node's row at the Hello's epoch (a later one: stale)"),
    Liveness: Fence(None, "each entry: the row's node, epoch and gateway; folded per gateway"),
    Closed: Fence(Binding.EPOCH, "the row's epoch and gateway"),
    Progress: Fence(
        Binding.EPOCH,
        "the command, in flight at the fact's epoch (the delivery of now); forward only",
    ),
    Result: Fence(
        Binding.EPOCH,
        "the command, delivered at the fact's epoch (whatever its epoch now), not finished",
    ),
    Rejected: Fence(Binding.EPOCH, "the command, dispatched at the fact's epoch now"),
    Events: Fence(
        Binding.JOURNAL,
        "any seq from the journal's holder of now; a former holder's, up to where the "
        "journal stands without it (its ack; an older journal's highest stored seq)",
    ),
    Status: Fence(
        Binding.EPOCH,
        "the session of now only (its last one's, once closed); a generation at most the "
        "node's spec generation",
    ),
}


def binding(fact: Fact) -> Binding | None:
    """The rule a fact is checked by here; None when it is not checked here."""
    fence = FENCES.get(type(fact))
    return fence.binding if fence is not None else None


# The facts (their positions) not bound to their gateway: none, as a rule, so nothing
# comes back but the Hellos, each with the session before it as its Hello transaction
# recorded it under the node's lock. EXISTS in the target list is evaluated per row
# through the primary key; the fence (OFFSET 0) keeps it there — as a WHERE NOT EXISTS
# it could become an anti-join that scans the whole table.
UNBOUND = """
SELECT c.i, c.bound, e.previous_epoch, e.previous_gateway_id, e.previous_boot_id,
       e.previous_journal_id, e.previous_live, e.proven, e.duplicate,
       p.proven IS FALSE AS previous_takeover, o.epoch AS honest_epoch,
       o.gateway_id AS honest_gateway_id, o.boot_id AS honest_boot_id,
       o.journal_id AS honest_journal_id
  FROM (
    SELECT f.i, f.rule, f.node_id, f.epoch, EXISTS (
        SELECT 1 FROM session_epochs s
         WHERE s.node_id = f.node_id AND s.gateway_id = f.gateway_id
           AND CASE f.rule WHEN 0 THEN s.epoch = f.epoch
                           WHEN 2 THEN s.journal_id = f.journal_id
                           ELSE s.epoch = f.epoch
                                AND (s.hello_fact_id IS NULL OR s.hello_fact_id = f.fact_id) END
    ) AS bound
      FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::int[], $6::uuid[])
           WITH ORDINALITY AS f(node_id, gateway_id, epoch, journal_id, rule, fact_id, i)
    OFFSET 0
  ) c
  LEFT JOIN session_epochs e ON c.rule = 3 AND c.bound AND e.node_id = c.node_id AND e.epoch = c.epoch
  LEFT JOIN session_epochs p ON p.node_id = e.node_id AND p.epoch = e.previous_epoch
  LEFT JOIN LATERAL (SELECT h.epoch, h.gateway_id, h.boot_id, h.journal_id FROM session_epochs h
                      WHERE p.proven IS FALSE AND h.node_id = e.node_id AND h.epoch < p.epoch
                        AND h.proven IS DISTINCT FROM false
                      ORDER BY h.epoch DESC LIMIT 1) o ON true
 WHERE NOT c.bound OR c.rule = 3
"""


def as_recorded(hello: Hello, row: Mapping[str, Any]) -> Hello:
    """The Hello as its Hello transaction recorded it (`session_epochs`): the session
    before it (past a takeover attempt: the node's last session that was not one), whether
    it is a duplicate identity (its judgement, migration 0049: for a
    node that proves its Hellos, two proven sessions only), whether its proof was taken —
    never the gateway's word for them. `proven` false says, from 0049 on, that the node
    has a Hello key and this Hello proved nothing (a takeover attempt); an epoch recorded
    before 0049 said false for any Hello without a proof, read as NULL (nothing checked).
    An epoch recorded without them (issued before 0.4, or by a writer that did not say)
    keeps what the fact says. Pure."""
    if row["previous_epoch"] is None:
        return hello
    live = row["previous_live"]
    # a takeover attempt before it proved nothing of the node (its boot, its journal):
    # the session before it is the node's last one that was not
    of = "honest_" if row.get("previous_takeover") else "previous_"
    previous = PreviousSession(
        epoch=row[f"{of}epoch"] if row[f"{of}epoch"] is not None else row["previous_epoch"],
        gateway_id=row[f"{of}gateway_id"],
        boot_id=row[f"{of}boot_id"],
        journal_id=row[f"{of}journal_id"],
        live=hello.previous.live if live is None else live,
    )
    judged = row.get("duplicate")
    if judged is None:  # an epoch issued before 0049
        duplicate = is_duplicate_identity(previous.live, previous.boot_id, hello.boot_id)
        proven = row["proven"] or None
    else:
        duplicate, proven = judged, row["proven"]
    return hello.model_copy(update={"previous": previous, "duplicate": duplicate, "proven": proven})


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
    database); at most `size` bindings (about 12 MiB), then it starts afresh. Those past
    their time are dropped once a `ttl`: what a process remembers follows the sessions of
    the last minute, not every epoch it ever saw."""

    def __init__(self, ttl: float = 60.0, size: int = 50_000) -> None:
        self._ttl = ttl
        self._size = size
        self._until: dict[BindingKey, float] = {}
        self._pruned = -math.inf

    def __len__(self) -> int:
        return len(self._until)

    def holds(self, binding: BindingKey, now: float) -> bool:
        until = self._until.get(binding)
        return until is not None and until > now

    def confirmed(self, bindings: Sequence[BindingKey], now: float) -> None:
        if now - self._pruned >= self._ttl:
            self._until = {b: until for b, until in self._until.items() if until > now}
            self._pruned = now
        if len(self._until) + len(bindings) > self._size:
            self._until.clear()
        until = now + self._ttl
        for binding in bindings:
            self._until[binding] = until


@dataclass(frozen=True)
class Checked:
    """What the database says of a batch's facts: the ids of those that do not come from a
    gateway of their node, and each bound Hello as its transaction recorded it."""

    strangers: set[uuid.UUID]
    hellos: dict[uuid.UUID, Hello]


async def check(
    conn: asyncpg.Connection, facts: Sequence[Fact], known: KnownBindings | None = None
) -> Checked:
    """Check `facts` against the epochs issued to their gateways; bindings `known` holds
    are not asked again, those the database confirms are added."""
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
        return Checked(set(), {})
    rows = await conn.fetch(
        UNBOUND,
        [binding[1] for _, _, binding in checked],
        [binding[2] for _, _, binding in checked],
        [binding[3] for _, _, binding in checked],
        [binding[4] for _, _, binding in checked],
        [rule for _, rule, _ in checked],
        [fact.fact_id for fact, _, _ in checked],
    )
    unbound = {row["i"] - 1 for row in rows if not row["bound"]}
    hellos = {}
    for row in rows:
        fact = checked[row["i"] - 1][0]
        if row["bound"] and isinstance(fact, Hello):
            hellos[fact.fact_id] = as_recorded(fact, row)
    if known is not None:
        known.confirmed(
            [
                b
                for i, (_, rule, b) in enumerate(checked)
                if i not in unbound and rule != Binding.HELLO
            ],
            now,
        )
    return Checked({checked[i][0].fact_id for i in unbound}, hellos)


async def foreign(
    conn: asyncpg.Connection, facts: Sequence[Fact], known: KnownBindings | None = None
) -> set[uuid.UUID]:
    """The ids of the facts in `facts` that do not come from a gateway of their node."""
    return (await check(conn, facts, known)).strangers


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
