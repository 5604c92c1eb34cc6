"""The quarantine enforcer's settings (`BCW_QUARANTINE_*`): its limits. Composed with the
runtime's and the other workers' in `workers/settings.py`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from workers.runtime.base.setting_types import Duration, env_group, format_duration

#: How long a node's counted alternations are kept (`apply.PRUNE_ALTERNATIONS`), and its
#: recorded duplicates counted from the record (`record.WITHHELD`): older than any fact
#: that can still arrive (a day on the bus). The counting window fits in it. Whole days:
#: the SQL says it in days, as the database's calendar counts them.
ALTERNATIONS_KEPT = timedelta(days=1)


class QuarantineSettings(BaseSettings):
    """The quarantine enforcer's limits."""

    model_config = env_group("BCW_QUARANTINE_")

    max_alternations: int = Field(
        default=3, ge=1, description="alternations allowed in the window; one more quarantines"
    )
    window: Duration = Field(
        default=timedelta(minutes=10),
        description=f"the counting window; {format_duration(ALTERNATIONS_KEPT)} at most (older "
        "alternations are pruned)",
    )
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

    @field_validator("window")
    @classmethod
    def _window_within_what_is_kept(cls, value: timedelta) -> timedelta:
        if value > ALTERNATIONS_KEPT:
            raise ValueError(
                f"must be at most {format_duration(ALTERNATIONS_KEPT)}: alternations older "
                "than that are pruned, never counted"
            )
        return value


class Configured(Protocol):
    """What `build` reads of the composed settings (`workers.settings.Settings`)."""

    @property
    def quarantine(self) -> QuarantineSettings: ...
