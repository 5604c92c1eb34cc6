"""The settings groups of the workers' rules: the liveness controller, the replay dispatcher
and the quarantine enforcer (`BCW_LIVENESS_*`, `BCW_REPLAY_*`, `BCW_QUARANTINE_*`).
Gathered by `settings.Settings`; the runtime only carries them to the workers.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from workers.runtime.base.setting_types import Duration, Seconds, env_group


class LivenessSettings(BaseSettings):
    """The liveness controller's periods and thresholds."""

    model_config = env_group("BCW_LIVENESS_")

    sweep_interval: Seconds = Field(default=5.0, gt=0, description="between sweeps")
    max_zombie_notices: int = Field(
        default=100,
        ge=1,
        description="zombie notices a gateway gets at most per batch of its flushes: a flood "
        "of unknown node ids costs no row per id (the rest are named again next flush)",
    )
    heartbeat_interval: Duration = Field(
        default=timedelta(seconds=10),
        description="the daemons' heartbeat; a session is stale after heartbeat x missed + "
        "flush period (10s x 3 + 15s = 45s)",
    )
    missed_heartbeats: int = Field(
        default=3, ge=1, description="heartbeats missed before a session is stale"
    )
    flush_period: Duration = Field(
        default=timedelta(seconds=15), description="gateway liveness flush period"
    )
    gateway_grace: Duration = Field(
        default=timedelta(seconds=120),
        description="after a gateway's lease expired, before its sessions go",
    )
    outage_threshold: Duration = Field(
        default=timedelta(seconds=20),
        description="a gap between sweeps longer than this is an outage",
    )
    outage_grace: Duration = Field(
        default=timedelta(minutes=5),
        description="age-based transitions wait this long after an outage",
    )
    lease_ttl: Duration = Field(
        default=timedelta(seconds=15), description="the sweep lease; a standby takes over after it"
    )
    blind_after: Duration | None = Field(
        default=None,
        description="a gateway none of whose flushes was applied for this long is blind "
        "(its sessions are held); default two flush periods",
    )
    breaker_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="a sweep that would disconnect more than this share of one gateway's "
        "connected sessions disconnects none of them (the fleet breaker)",
    )
    breaker_minimum: int = Field(
        default=20, ge=1, description="the breaker holds only this many stale sessions or more"
    )
    range_sight: bool | Literal["auto"] = Field(
        default="auto",
        description="a flush fact that names a range of node hashes writes only the session "
        "rows that change (a session first named, one no longer named, new credits): its "
        "range row is the sight of the others. `auto`: on, unless this release upgraded "
        "the schema from before 0.4 (a liveness worker of that release may still run, and "
        "its sweep reads only the session rows); the liveness worker logs which and why",
    )

    @property
    def stale_after(self) -> timedelta:
        """3 heartbeat intervals plus one flush period: 45 s by default."""
        return self.heartbeat_interval * self.missed_heartbeats + self.flush_period

    @property
    def blind_after_or_default(self) -> timedelta:
        """`blind_after`, or two flush periods (30 s by default)."""
        return self.blind_after or 2 * self.flush_period


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


class QuarantineSettings(BaseSettings):
    """The quarantine enforcer's limits."""

    model_config = env_group("BCW_QUARANTINE_")

    max_alternations: int = Field(
        default=3, ge=1, description="alternations allowed in the window; one more quarantines"
    )
    window: Duration = Field(default=timedelta(minutes=10), description="the counting window")
    breaker_quarantines: int = Field(
        default=3,
        ge=0,
        description="revocations charged to one gateway (the one each quarantine's first "
        "duplicate came through) in the breaker's window with an unproven alternation among "
        "them; further ones wait for `bcw quarantine release` (security.quarantine.breaker-open)",
    )
    breaker_window: Duration = Field(
        default=timedelta(minutes=10), description="the breaker's window"
    )
    breaker_share: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="the fleet's share of nodes that may be revoked in the breaker's window "
        "(at least BCW_QUARANTINE_BREAKER_QUARANTINES)",
    )
    hold_max: Duration = Field(
        default=timedelta(minutes=5),
        description="a session held for the quarantine (its Hello was a duplicate identity) "
        "this long after it connected is released by the replay worker's dispatch loop, with "
        "a WARNING and a security.node.hold-expired event: a quarantine worker that is down "
        "never keeps a node from its commands for longer (one that is only behind its Hellos "
        "does: the session stays held until it counts this one); never a takeover attempt, "
        "nor a node a quarantine holds for an operator",
    )
