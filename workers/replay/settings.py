"""The replay dispatcher's settings (`BCW_REPLAY_*`): its credits, back-off and dispatch
loop, and the bound of a quarantine's hold, which its dispatch loop keeps. Composed with
the runtime's and the other workers' in `workers/settings.py`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from pydantic import Field
from pydantic_settings import BaseSettings

from workers.runtime.base.setting_types import Duration, Seconds, env_group

#: The hold bound's variable: the replay worker's setting under the name it has always had
#: (the hold is the quarantine's; its bound is kept by the replay's dispatch loop alone).
HOLD_MAX = "BCW_QUARANTINE_HOLD_MAX"


class ReplaySettings(BaseSettings):
    """The replay dispatcher's credits, back-off and dispatch loop."""

    model_config = env_group("BCW_REPLAY_")

    credits: int = Field(default=8, ge=1, description="commands in flight per node and lane")
    busy_base: Duration = Field(default=timedelta(seconds=1), description="first BUSY back-off")
    busy_cap: Duration = Field(default=timedelta(seconds=30), description="largest BUSY back-off")
    dispatch_interval: Seconds = Field(
        default=1.0, gt=0, description="between dispatch rounds when nothing wakes the loop"
    )
    nodes_per_round: int = Field(
        default=500, ge=1, description="nodes a dispatch round serves at most"
    )
    lease_ttl: Duration = Field(default=timedelta(seconds=10), description="the dispatch lease")
    hello_lost_after: Duration = Field(
        default=timedelta(seconds=60),
        description="a connected session whose Hello the replay worker has not applied this "
        "long after it connected, with nothing left to consume, is asked of its gateway again",
    )
    hello_check_interval: Seconds = Field(
        default=10.0, gt=0, description="between the dispatch loop's looks for lost Hellos"
    )
    hold_max: Duration = Field(
        default=timedelta(minutes=5),
        validation_alias=HOLD_MAX,
        description="a session held for the quarantine (its Hello was a duplicate identity) "
        "this long after it connected is released by the replay worker's dispatch loop, with "
        "a WARNING and a security.node.hold-expired event: a quarantine worker that is down "
        "never keeps a node from its commands for longer (one that is only behind its Hellos "
        "does: the session stays held until it counts this one); never a takeover attempt, "
        "nor a node a quarantine holds for an operator. The replay worker's setting, under "
        "the name it had as the quarantine's",
    )


class Configured(Protocol):
    """What `build` reads of the composed settings (`workers.settings.Settings`)."""

    @property
    def replay(self) -> ReplaySettings: ...
