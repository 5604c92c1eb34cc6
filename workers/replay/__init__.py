"""Replay dispatcher (`bcw run replay`): command delivery.

Replays a node's commands in flight when it says Hello (resume rules first: a lost
journal fails them, a process-ending command is completed by the Hello's proof), moves
commands forward on progress and results, backs off on BUSY, and — in the replica
holding the `replay-dispatch` lease — dispatches pending commands in seq order within
the credits of each node and lane.
"""

from __future__ import annotations

from workers.replay.apply import make_handler
from workers.replay.dispatch import dispatch_loop
from workers.replay.holds import HoldMetrics
from workers.replay.settings import Configured
from workers.runtime.effects.worker import Worker


def build(settings: Configured) -> Worker:
    return Worker(
        name="replay",
        fact_types=("hello", "progress", "result", "rejected"),
        handle=make_handler(settings.replay),
        loops=(dispatch_loop(settings.replay),),
        metrics=(HoldMetrics,),
    )
