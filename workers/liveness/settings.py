"""The liveness controller's settings (`BCW_LIVENESS_*`): its periods and thresholds.
Composed with the runtime's and the other workers' in `workers/settings.py`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal, Protocol

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


class Configured(Protocol):
    """What `build` reads of the composed settings (`workers.settings.Settings`)."""

    @property
    def liveness(self) -> LivenessSettings: ...
