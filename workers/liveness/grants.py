"""What the liveness worker's logins (`bcw_liveness`) may do of the database, and what its
bus principal (`worker-liveness`) publishes: its part of the one permission table the
registry composes (`workers.registry.ROLES`, `EMITS`; docs/kubernetes.md shows it whole).
"""

from __future__ import annotations

from schemas import events, notices
from workers.runtime.store.roles import Grant, Lent, WorkerRole

ROLE = WorkerRole(
    purpose="the liveness worker",
    grants=(
        Grant("SELECT", "node_sessions"),
        Grant(
            # never `gateway_id`: it disconnects through `liveness_disconnect` (executes)
            "UPDATE (last_seen, lane_credits, load, node_load, disconnected_at, disconnect_reason, "
            "ranged_epoch)",
            "node_sessions",
        ),
        Grant("SELECT", "gateways"),
        Grant("SELECT, INSERT, UPDATE, DELETE", "liveness_gateways"),  # a gone gateway forgotten
        Grant("SELECT, UPDATE", "liveness_sweeps"),
        Grant("SELECT, INSERT, UPDATE, DELETE", "liveness_ranges"),  # its flushes' ranges
        Grant("SELECT", "node_last_seen"),
        # as of when it applied its flushes (the Hello transaction's live window reads it)
        Grant("SELECT, INSERT, UPDATE", "consumer_watermarks"),
    ),
    # clears the gateway of sessions at the epoch and gateway it read: never sets one
    executes=("liveness_disconnect(text[],bigint[],text[],text[],timestamp with time zone)",),
    rules={
        # it says as of when it applied its facts, and never for another (the Hello
        # transaction trusts its row)
        "consumer_watermarks": {
            "SELECT": ("true", None),
            "INSERT": (None, "consumer = 'liveness'"),
            "UPDATE": ("consumer = 'liveness'", "consumer = 'liveness'"),
        },
    },
    tables=("liveness_gateways", "liveness_ranges", "liveness_sweeps"),
    # a session's last sight (docs/contract.md's entry point) reads its flushes' ranges:
    # every group that reads the view reads them
    behind_views={"node_last_seen": ("liveness_ranges",)},
    # an operator releases an open breaker
    lends={
        "bcw_operator": Lent(
            grants=(
                Grant("UPDATE (breaker_released_at, breaker_released_by)", "liveness_gateways"),
            ),
            commands=("bcw liveness release",),
        ),
    },
)

#: what its rules publish through its outbox: all its principal may publish besides its
#: dead letters (`OutboxBatch.add` refuses any other message from it)
EMITS = (
    events.NodeConnected,
    events.NodeDisconnected,
    events.GatewayBlind,
    events.GatewaySeeing,
    events.BreakerOpen,
    notices.Zombie,
)
