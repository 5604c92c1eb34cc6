"""What the replay dispatcher's logins (`bcw_replay`) may do of the database, and what its
bus principal (`worker-replay`) publishes: its part of the one permission table the
registry composes (`workers.registry.ROLES`, `EMITS`; docs/kubernetes.md shows it whole).
"""

from __future__ import annotations

from schemas import events, notices
from workers.runtime.store.roles import LAST_SEEN, WAKE_DISPATCH, Grant, WorkerRole

ROLE = WorkerRole(
    purpose="the replay dispatcher",
    grants=(
        Grant("SELECT", "node_sessions"),
        # FOR SHARE only (`roles`); held_epoch: a hold over its bound is released (holds.py)
        Grant("UPDATE (node_id, held_epoch)", "node_sessions"),
        *LAST_SEEN,
        Grant("SELECT", "node_certs"),
        Grant("SELECT", "gateways"),  # no dispatch to a gateway whose lease expired
        Grant("SELECT, INSERT, UPDATE", "hello_seen"),  # the Hellos it applied, and asked for
        Grant("SELECT", "consumer_watermarks"),  # the hold bound: is the quarantine behind?
        Grant("SELECT", "quarantines"),  # one held for an operator holds every session of its node
        Grant("SELECT", "commands"),
        Grant(
            "UPDATE (state, session_epoch, delivery_attempt, busy_attempts, busy_epoch, "
            "not_before, result, failure_reason, trace_context, updated_at, delivered_epochs)",
            "commands",
        ),
    ),
    # the dispatch loop's wake-up (migration 0057): its credits and Hellos free what it waits for
    executes=(WAKE_DISPATCH,),
)

#: what its rules publish through its outbox: all its principal may publish besides its
#: dead letters (`OutboxBatch.add` refuses any other message from it)
EMITS = (
    events.CommandReplayed,
    events.CommandCancelled,
    events.CommandFailed,
    events.CommandCompleted,
    events.HoldExpired,
    notices.Dispatch,
    notices.HelloAgain,
)
