"""What the quarantine enforcer's logins (`bcw_quarantine`) may do of the database, and
what its bus principal (`worker-quarantine`) publishes: its part of the one permission
table the registry composes (`workers.registry.ROLES`, `EMITS`; docs/kubernetes.md shows
it whole). An operator's release and dismissal (`operator.py`) run as `bcw_operator`.
"""

from __future__ import annotations

from schemas import events
from workers.runtime.store.roles import LAST_SEEN, WAKE_DISPATCH, Grant, Lent, WorkerRole

ROLE = WorkerRole(
    purpose="the quarantine enforcer",
    grants=(
        Grant("SELECT", "node_sessions"),
        Grant(
            "UPDATE (duplicate_hellos, duplicate_since, held_epoch, alternations_judged_epoch)",
            "node_sessions",
        ),
        *LAST_SEEN,
        Grant("SELECT, INSERT, DELETE", "node_alternations"),
        Grant("SELECT, INSERT", "quarantines"),  # the breaker's record
        Grant("UPDATE (revoked_at)", "quarantines"),
        Grant("SELECT", "nodes"),
        Grant("SELECT, INSERT", "node_certs"),  # an unrecorded serial is recorded revoked
        Grant("UPDATE (revoked_at, revocation_reason)", "node_certs"),
        Grant("SELECT, INSERT, DELETE", "node_conditions"),  # DuplicateIdentity, its own
        Grant("UPDATE (epoch, reason)", "node_conditions"),  # set again by a later quarantine
        # as of when it applied its Hellos (the replay's hold bound reads it): its own row
        Grant("SELECT, INSERT, UPDATE", "consumer_watermarks"),
        Grant("SELECT", "fleet_policy"),  # said loudly when Hellos need no proof
        # the breaker's lock (FOR UPDATE: `roles`); no other group's, not PUBLIC's
        Grant("SELECT, UPDATE (locked_at)", "quarantine_breaker"),
    ),
    # the dispatch loop's wake-up (migration 0057): a quarantine lifted frees what it waits for
    executes=(WAKE_DISPATCH,),
    rules={
        # a certificate is recorded or marked revoked, never recorded live nor un-revoked
        "node_certs": {
            "SELECT": ("true", None),
            "INSERT": (None, "revoked_at IS NOT NULL"),
            "UPDATE": ("true", "revoked_at IS NOT NULL"),
        },
        # alternations are pruned after a day (none older can still arrive), never before
        "node_alternations": {
            "SELECT": ("true", None),
            "INSERT": (None, "true"),
            "DELETE": ("issued_at < compute_now() - interval '1 day'", None),
        },
        # it says as of when it applied its Hellos, and never for another (the replay
        # worker's hold bound trusts its row)
        "consumer_watermarks": {
            "SELECT": ("true", None),
            "INSERT": (None, "consumer = 'quarantine'"),
            "UPDATE": ("consumer = 'quarantine'", "consumer = 'quarantine'"),
        },
    },
    tables=("quarantines", "quarantine_breaker"),
    # an operator releases a quarantine (bcw quarantine release), or dismisses it (judged
    # no clone)
    lends={
        "bcw_operator": Lent(
            grants=(
                Grant(
                    "UPDATE (released_at, released_by, dismissed_at, dismissed_by)",
                    "quarantines",
                ),
            ),
        ),
    },
)

#: what its rules publish through its outbox: all its principal may publish besides its
#: dead letters (`OutboxBatch.add` refuses any other message from it)
EMITS = (
    events.DuplicateSession,
    events.UnprovenHello,
    events.Quarantined,
    events.QuarantineHeld,
    events.QuarantineBreakerOpen,
    events.Revocations,
)
