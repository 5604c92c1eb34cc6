"""The quarantine enforcer's settings (`BCW_QUARANTINE_*`): its limits. Composed with the
runtime's and the other workers' in `workers/settings.py`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from pydantic import Field
from pydantic_settings import BaseSettings

from workers.runtime.base.setting_types import Duration, env_group


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


class Configured(Protocol):
    """What `build` reads of the composed settings (`workers.settings.Settings`)."""

    @property
    def quarantine(self) -> QuarantineSettings: ...
