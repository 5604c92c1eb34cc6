"""The one map of worker kinds: name → `build(settings) -> Worker`, and the one table of
their permissions, composed of each worker's `grants.py`. Read by `bcw run`, `bcw migrate`,
`bcw auth nats`, `bcw provision` and the docs' generated tables (`make docs`: `python -m
workers.registry DOC…`); the runtime is handed what it applies, never imports this.

Explicit on purpose: no registration by import side effect — but one hand-over: importing
this module hands the runtime what each worker publishes (`principals.install(EMITS)`),
which its relays, outboxes, streams and dead letters' re-drives judge by: every `bcw`
command that runs one of them imports it first.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from schemas.subjects import Subjects
from workers import labeler, liveness, quarantine, recorder, replay
from workers.labeler import grants as labeler_grants
from workers.liveness import grants as liveness_grants
from workers.quarantine import grants as quarantine_grants
from workers.recorder import grants as recorder_grants
from workers.replay import grants as replay_grants
from workers.runtime.bus import principals
from workers.runtime.effects.worker import Worker
from workers.runtime.store import policies, roles_doc
from workers.runtime.store.roles import Roles
from workers.settings import Settings

WORKERS: dict[str, Callable[[Settings], Worker]] = {
    "labeler": labeler.build,
    "liveness": liveness.build,
    "quarantine": quarantine.build,
    "recorder": recorder.build,
    "replay": replay.build,
}

#: the worker kinds, as their bus principals are listed (`worker-<name>`)
WORKER_NAMES = tuple(WORKERS)

#: the database's permission table: each worker's group (`bcw_<worker>`, in the order
#: `bcw migrate` grants them) and the runtime's own groups
ROLES = Roles.of(
    {
        "liveness": liveness_grants.ROLE,
        "labeler": labeler_grants.ROLE,
        "quarantine": quarantine_grants.ROLE,
        "replay": replay_grants.ROLE,
        "recorder": recorder_grants.ROLE,
    }
)
#: table → group → command → rule: the row rules of the tables others trust (`policies`)
GROUP_RULES = policies.group_rules(ROLES)
#: the groups whose logins run `bcw migrate --wait` before they start
LEDGER_READERS = policies.ledger_readers(ROLES)

#: what each worker's rules publish through its outbox: all its bus principal may publish
#: besides its dead letters
EMITS = {
    "labeler": labeler_grants.EMITS,
    "liveness": liveness_grants.EMITS,
    "quarantine": quarantine_grants.EMITS,
    "recorder": recorder_grants.EMITS,
    "replay": replay_grants.EMITS,
}
principals.install(EMITS)
#: who publishes dead letters, each under `<root>.dead.<its name>` to a stream of its own
DEAD_PUBLISHERS = principals.dead_publishers()


def rewrite_docs(paths: list[Path]) -> None:
    """Put the generated permission tables (the bus principals', the database roles') between
    the docs' markers (`make docs`; a unit test keeps them equal)."""
    for path in paths:
        principals.rewrite_doc(path, Subjects("bc"))
        roles_doc.rewrite_doc(path, ROLES)


if __name__ == "__main__":  # `make docs`
    rewrite_docs([Path(name) for name in sys.argv[1:]])
