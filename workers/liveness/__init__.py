"""Liveness controller (`bcw run liveness`): connectivity.

Announces `node.connected` for current Hellos, moves `last_seen` forward from the
gateways' flushes (and tells a gateway to drop sessions that are not current: zombie
notices), writes the disconnects gateways report, and — in the replica holding the
`liveness` lease — sweeps the transitions nobody reports: lost gateways and stale
sessions, with an outage grace. Disconnected is not dead: nothing is released.
"""

from __future__ import annotations

from workers.liveness.apply import make_handler, wants
from workers.liveness.metrics import SweepMetrics
from workers.liveness.settings import Configured
from workers.liveness.sweep import sweep_loop
from workers.runtime.effects.worker import Worker


def build(settings: Configured) -> Worker:
    return Worker(
        name="liveness",
        fact_types=("hello", "liveness", "closed"),
        handle=make_handler(settings.liveness.max_zombie_notices, settings.liveness.range_sight),
        wants=wants,
        loops=(sweep_loop(settings.liveness),),
        metrics=(SweepMetrics,),
    )
