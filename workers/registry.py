"""The one map of worker kinds: name → `build(settings) -> Worker`. Read by `bcw run`,
`bcw provision` and the chart's documentation.

Explicit on purpose: no registration by import side effect.
"""

from __future__ import annotations

from collections.abc import Callable

from workers import labeler, liveness, quarantine, recorder, replay
from workers.runtime.effects.worker import Worker
from workers.settings import Settings

WORKERS: dict[str, Callable[[Settings], Worker]] = {
    "labeler": labeler.build,
    "liveness": liveness.build,
    "quarantine": quarantine.build,
    "recorder": recorder.build,
    "replay": replay.build,
}
