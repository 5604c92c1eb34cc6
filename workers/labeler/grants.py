"""What the capability labeler's logins (`bcw_labeler`) may do of the database, and what
its bus principal (`worker-labeler`) publishes: its part of the one permission table the
registry composes (`workers.registry.ROLES`, `EMITS`; docs/kubernetes.md shows it whole).
"""

from __future__ import annotations

from schemas import events
from workers.runtime.store.roles import LAST_SEEN, Grant, WorkerRole

ROLE = WorkerRole(
    purpose="the capability labeler",
    grants=(
        Grant("SELECT", "node_sessions"),
        Grant("UPDATE (capabilities)", "node_sessions"),
        *LAST_SEEN,
        Grant("SELECT, INSERT, DELETE", "node_labels"),
        Grant("UPDATE (value)", "node_labels"),
    ),
)

#: what its rules publish through its outbox: all its principal may publish besides its
#: dead letters (`OutboxBatch.add` refuses any other message from it)
EMITS = (events.CapabilitiesChanged,)
