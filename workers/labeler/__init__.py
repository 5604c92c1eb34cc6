"""Capability labeler (`bcw run labeler`): Hello → capabilities and system labels.

Keeps the system labels `bc.dev/cap.<name>=1` in step with the valid names a daemon
advertises (operator labels are never touched) and publishes `node.capabilities-changed`
when that set changed from the labels. The Hello transaction stores the session's
capabilities; the labeler writes them again, fenced on the Hello's epoch, which marks the
session labeled (`labeled_epoch`: placement offers it from then on).

Without an inbox: every effect is idempotent by construction. The writes are fenced on
the Hello's epoch and set values (capabilities, labels); the event is published only
when the labels changed; rows are locked before they are read. So a Hello delivered again
— at once, after a newer Hello, or to another replica at the same moment — finds
nothing to do.
"""

from __future__ import annotations

from workers.labeler.apply import handle
from workers.runtime.base.settings import RuntimeSettings
from workers.runtime.effects.worker import Worker


def build(settings: RuntimeSettings) -> Worker:
    return Worker(name="labeler", fact_types=("hello",), handle=handle, inbox=False)
