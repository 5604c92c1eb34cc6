"""What the fact recorder's logins (`bcw_recorder`) may do of the database, and what its
bus principal (`worker-recorder`) publishes: its part of the one permission table the
registry composes (`workers.registry.ROLES`, `EMITS`; docs/kubernetes.md shows it whole).
"""

from __future__ import annotations

from schemas import notices
from workers.runtime.store.policies import OLDER_THAN_THE_FLOOR
from workers.runtime.store.roles import LAST_SEEN, Grant, WorkerRole

ROLE = WorkerRole(
    purpose="the fact recorder",
    grants=(
        Grant("SELECT", "nodes"),
        Grant("SELECT", "node_sessions"),
        Grant(
            "UPDATE (acked_event_seq, observed_generation, trust_version, approver_set_epoch, "
            "approver_set_sha256)",
            "node_sessions",
        ),
        *LAST_SEEN,
        Grant("SELECT, INSERT, DELETE", "node_events"),
        Grant("UPDATE (recorded_at)", "node_events"),  # pruning locks the rows it deletes
    ),
    rules={
        # node events are deleted by retention only (at least `HISTORY_FLOOR` old)
        "node_events": {
            "SELECT": ("true", None),
            "INSERT": (None, "true"),
            "DELETE": (f"recorded_at < {OLDER_THAN_THE_FLOOR}", None),
            "UPDATE": (f"recorded_at < {OLDER_THAN_THE_FLOOR}", "false"),  # a lock only
        },
    },
)

#: what its rules publish through its outbox: all its principal may publish besides its
#: dead letters (`OutboxBatch.add` refuses any other message from it)
EMITS = (notices.EventAck,)
