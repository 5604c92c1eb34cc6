"""The rows a group may touch, beyond the tables and columns it may (issue #41, "grants as
the job"): each statement an attacker ran with a worker's login, and the legitimate one
beside it, tried as that login in a transaction rolled back. `CELLS` is the table: who,
what, and what must come of it — refused (by a row rule, a trigger or a privilege), or the
rows it may touch. The rules themselves are `workers/runtime/store/policies.py` and
migration 0032; `test_db_matrix.py` tries every table and column privilege."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg
import pytest

from tests.integration import fleet
from workers.registry import GROUP_RULES

pytestmark = pytest.mark.slow

REFUSED = -1


@dataclass(frozen=True)
class Cell:
    group: str
    what: str
    statement: str
    #: REFUSED, or how many rows it touches
    expected: int


OLD = "compute_now() - interval '2 days'"
CELLS = (
    # the quarantine records or marks certificates revoked, never live
    Cell(
        "bcw_quarantine",
        "record a live certificate",
        "INSERT INTO node_certs (serial, node_id, identity_generation, role, not_after) "
        "VALUES ('evil', 'n1', 1, 'worker', compute_now() + interval '1 year')",
        REFUSED,
    ),
    Cell(
        "bcw_quarantine",
        "record a revoked certificate",
        "INSERT INTO node_certs (serial, node_id, identity_generation, role, not_after, "
        "revoked_at, revocation_reason) VALUES ('r1', 'n1', 1, 'worker', compute_now(), "
        "compute_now(), 'duplicate identity')",
        1,
    ),
    Cell(
        "bcw_quarantine",
        "un-revoke a certificate",
        "UPDATE node_certs SET revoked_at = NULL, revocation_reason = NULL "
        "WHERE serial = 'n2-serial'",
        REFUSED,
    ),
    Cell(
        "bcw_quarantine",
        "revoke a certificate",
        "UPDATE node_certs SET revoked_at = compute_now(), revocation_reason = 'x' "
        "WHERE serial = 'n1-serial'",
        1,
    ),
    # … and prunes alternations a day old, never the fresh ones it counts
    Cell("bcw_quarantine", "delete every alternation", "DELETE FROM node_alternations", 1),
    # the recorder deletes events past the retention floor only
    Cell("bcw_recorder", "delete every node event", "DELETE FROM node_events", 1),
    Cell(
        "bcw_recorder",
        "make an old event young",
        "UPDATE node_events SET recorded_at = compute_now() WHERE seq = 1",
        REFUSED,
    ),
    Cell(
        "bcw_recorder",
        "touch a young event",
        "UPDATE node_events SET recorded_at = compute_now() - interval '1 year' WHERE seq = 2",
        0,
    ),
    # the liveness worker clears a session's gateway through its function, never sets one
    Cell(
        "bcw_liveness",
        "route a session to another gateway",
        "UPDATE node_sessions SET gateway_id = 'gw-2' WHERE node_id = 'n1'",
        REFUSED,
    ),
    Cell(
        "bcw_liveness",
        "disconnect a session as read",
        "SELECT liveness_disconnect('{n1}', '{1}', '{gw-1}', '{liveness-timeout}', NULL)",
        1,
    ),
    Cell(
        "bcw_liveness",
        "see a session for ever",
        "UPDATE node_sessions SET last_seen = compute_now() + interval '10 years' "
        "WHERE node_id = 'n1'",
        REFUSED,
    ),
    Cell(
        "bcw_liveness",
        "see a session now",
        "UPDATE node_sessions SET last_seen = compute_now() WHERE node_id = 'n1'",
        1,
    ),
    Cell(
        "bcw_liveness",
        "see a gateway for ever",
        "UPDATE liveness_gateways SET last_flush_at = compute_now() + interval '1 day'",
        REFUSED,
    ),
    Cell(
        "bcw_liveness",
        "see a new gateway for ever",
        "INSERT INTO liveness_gateways (gateway_id, last_flush_at) "
        "VALUES ('gw-9', compute_now() + interval '1 day')",
        REFUSED,
    ),
    Cell(
        "bcw_liveness",
        "see a gateway's range for ever",
        "UPDATE liveness_ranges SET applied_at = compute_now() + interval '1 day'",
        REFUSED,
    ),
    Cell(
        "bcw_liveness",
        "see a gateway for ever by a whole flush",
        "UPDATE liveness_gateways SET whole_flush_at = compute_now() + interval '1 day'",
        REFUSED,
    ),
    # a worker says as of when it applied its facts, never for another (migration 0044)
    Cell(
        "bcw_liveness",
        "say it is caught up",
        "INSERT INTO consumer_watermarks VALUES ('liveness', now(), now(), now())",
        1,
    ),
    Cell(
        "bcw_liveness",
        "say the quarantine is behind",
        "INSERT INTO consumer_watermarks VALUES ('quarantine', now(), now(), now())",
        REFUSED,
    ),
    Cell(
        "bcw_liveness",
        "move the quarantine's watermark",
        "UPDATE consumer_watermarks SET moved_at = now() WHERE consumer = 'quarantine'",
        0,
    ),
    Cell(
        "bcw_quarantine",
        "say the liveness controller is behind",
        "INSERT INTO consumer_watermarks VALUES ('liveness', now(), now(), now())",
        REFUSED,
    ),
    Cell(
        "bcw_quarantine",
        "rename its row the liveness controller's",
        "UPDATE consumer_watermarks SET consumer = 'liveness' WHERE consumer = 'quarantine'",
        REFUSED,
    ),
    Cell(
        "bcw_quarantine",
        "say it moved",
        "UPDATE consumer_watermarks SET moved_at = now() WHERE consumer = 'quarantine'",
        1,
    ),
    Cell(
        "bcw_replay",
        "release its holds by the quarantine's watermark",
        "UPDATE consumer_watermarks SET applied_through = now()",
        REFUSED,
    ),
    # a row seen "ahead" once the clock stepped back is still written: only a move is checked
    Cell(
        "bcw_liveness",
        "flush a session seen ahead of a clock that stepped back",
        "UPDATE node_sessions SET last_seen = GREATEST(last_seen, compute_now()), "
        "load = 1 WHERE node_id = 'n3'",
        1,
    ),
    # the legacy gateway group rebinds no session epoch to another gateway
    Cell(
        "bcw_gateway",
        "rebind an issued epoch",
        "UPDATE node_sessions SET gateway_id = 'gw-2' WHERE node_id = 'n1'",
        REFUSED,
    ),
    Cell(
        "bcw_gateway",
        "a session's next epoch, on another gateway",
        "UPDATE node_sessions SET gateway_id = 'gw-2', session_epoch = 2 WHERE node_id = 'n1'",
        1,
    ),
    # a worker buries only its own outbox rows
    *(
        cell
        for worker in ("labeler", "liveness", "quarantine", "recorder", "replay")
        for cell in (
            Cell(
                f"bcw_{worker}",
                "bury another worker's row",
                "INSERT INTO outbox_dead (id, msg_id, subject, headers, body, created_at, "
                "reason, worker) VALUES (-1, gen_random_uuid(), 'bc.gw.gw-1.dispatch', '{}', "
                "'', now(), 'x', " + ("'replay'" if worker != "replay" else "'labeler'") + ")",
                REFUSED,
            ),
            Cell(
                f"bcw_{worker}",
                "bury a row of no owner, another's type",
                "INSERT INTO outbox_dead (id, msg_id, subject, headers, body, created_at, "
                "reason) VALUES (-1, gen_random_uuid(), 'bc.gw.gw-1.dispatch', "
                '\'{"Bc-Type": "'
                + ("dispatch" if worker != "replay" else "zombie")
                + "\"}', '', now(), 'x')",
                REFUSED,
            ),
            Cell(
                f"bcw_{worker}",
                "bury its own row",
                "INSERT INTO outbox_dead (id, msg_id, subject, headers, body, created_at, "
                f"reason, worker) VALUES (-1, gen_random_uuid(), 'x', '{{}}', '', now(), 'x', "
                f"'{worker}')",
                1,
            ),
        )
    ),
)


def _touched(status: str) -> int:
    """Rows a command status says were touched (`UPDATE 3`, `INSERT 0 1`, `SELECT 1`)."""
    return int(status.split()[-1])


async def _outcome(conn: asyncpg.Connection, statement: str) -> tuple[int, str]:
    transaction = conn.transaction()
    await transaction.start()
    try:
        return _touched(await conn.execute(statement)), ""
    except (
        asyncpg.InsufficientPrivilegeError,
        asyncpg.CheckViolationError,
        asyncpg.exceptions.RaiseError,
    ) as refused:
        return REFUSED, str(refused)
    finally:
        await transaction.rollback()


async def _world(db: asyncpg.Connection) -> None:
    """n1 at epoch 1 on gw-1 with a live certificate, n2's revoked; one alternation and one
    node event a day old and one of now; gw-1's sight."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
    await fleet.join(db, "n2")
    await db.execute(
        "UPDATE node_certs SET revoked_at = compute_now(), revocation_reason = 'x' "
        "WHERE serial = 'n2-serial'"
    )
    await db.execute(
        f"INSERT INTO node_alternations (node_id, epoch, issued_at) VALUES ('n1', 1, {OLD}), "
        "('n1', 2, compute_now())"
    )
    await db.execute(
        "INSERT INTO node_events (node_id, journal_id, seq, kind, body, at, recorded_at) VALUES "
        f"('n1', 'j', 1, 'k', '{{}}', now(), {OLD}), ('n1', 'j', 2, 'k', '{{}}', now(), now())"
    )
    await db.execute(
        "INSERT INTO liveness_gateways (gateway_id, last_flush_at) VALUES ('gw-1', now())"
    )
    await db.execute(
        "INSERT INTO liveness_ranges (gateway_id, range_start, range_end, stream_seq, applied_at,"
        " oldest_at, sessions, entries) VALUES ('gw-1', 0, 4294967296, 1, now(), now(), 0, '[]')"
    )
    await db.execute("INSERT INTO consumer_watermarks VALUES ('quarantine', now(), now(), now())")
    # n3 seen a minute ahead: written when the clock was there, before it stepped back
    await fleet.session(db, "n3", epoch=1, gateway_id="gw-1")
    await db.execute("SELECT set_compute_now_offset(interval '1 minute')")
    await db.execute("UPDATE node_sessions SET last_seen = compute_now() WHERE node_id = 'n3'")
    await db.execute("SELECT set_compute_now_offset(interval '0')")


@pytest.mark.parametrize("group", sorted({cell.group for cell in CELLS}))
async def test_every_row_rule_as_its_login(
    group: str, logins: dict[str, str], db: asyncpg.Connection
) -> None:
    await _world(db)
    wrong = []
    conn = await asyncpg.connect(logins[group])
    try:
        for cell in (c for c in CELLS if c.group == group):
            touched, why = await _outcome(conn, cell.statement)
            if touched != cell.expected:
                wrong.append(f"{cell.what}: {touched} (expected {cell.expected}) {why}")
    finally:
        await conn.close()
    assert wrong == [], "\n".join(wrong)


def test_every_rule_of_the_table_has_a_cell() -> None:
    """A row rule nobody tries is a rule nobody knows holds."""
    tried = {
        (c.group, c.statement.split()[0] if not c.statement.startswith("SELECT") else "")
        for c in CELLS
    }
    for table, groups in GROUP_RULES.items():
        for group, rules in groups.items():
            for command in rules:
                if command != "SELECT":
                    assert (group, command) in tried, (table, group, command)
    for worker in ("labeler", "liveness", "quarantine", "recorder", "replay"):
        assert (f"bcw_{worker}", "INSERT") in tried


async def test_a_recorder_may_not_keep_a_younger_retention(db: asyncpg.Connection) -> None:
    """The setting says what the row rule enforces: no retention under a day."""
    from workers.runtime.base.runtime_settings import RetentionSettings

    assert RetentionSettings(node_events=timedelta(days=1)).node_events == timedelta(days=1)
    with pytest.raises(ValueError, match="a worker's login may not delete a younger row"):
        RetentionSettings(node_events=timedelta(hours=23))
