"""Each worker's settings are its own (`workers/<name>/settings.py`), the runtime's are the
runtime's, and `workers/settings.py` composes them; the hold bound, read by the replay
worker alone, is the replay's setting under the name it had as the quarantine's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from workers.quarantine.settings import QuarantineSettings
from workers.replay.settings import ReplaySettings
from workers.runtime.base.settings import RuntimeSettings, nested_groups
from workers.settings import GROUPS, Settings, describe, effective, unknown_variables

WORKERS = ("liveness", "replay", "quarantine")


@pytest.mark.parametrize("worker", WORKERS)
def test_a_workers_settings_are_read_from_its_folder(worker: str) -> None:
    group = Settings.model_fields[worker].default_factory
    assert isinstance(group, type)
    assert group.__module__ == f"workers.{worker}.settings"
    assert GROUPS[group.__name__] is group
    assert getattr(Settings(), worker).__class__ is group


def test_the_runtime_keeps_its_own_groups_only() -> None:
    assert not set(WORKERS) & set(RuntimeSettings.model_fields)
    assert {group.__module__ for group in nested_groups(RuntimeSettings)} == {
        "workers.runtime.base.runtime_settings"
    }
    # every group is the runtime's or a worker's own, and each worker's is composed once
    owners = sorted(group.__module__ for group in GROUPS.values())
    assert [o for o in owners if not o.startswith("workers.runtime.")] == [
        "workers.liveness.settings",
        "workers.quarantine.settings",
        "workers.replay.settings",
        "workers.settings",  # `Settings`: the process's own settings, inherited
    ]


def test_the_hold_bound_is_the_replays_and_keeps_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BCW_QUARANTINE_HOLD_MAX", "90s")
    settings = Settings()
    assert settings.replay.hold_max == timedelta(seconds=90)
    assert "hold_max" not in QuarantineSettings.model_fields  # one owner
    assert unknown_variables({"BCW_QUARANTINE_HOLD_MAX": "90s"}) == []
    assert (
        effective(settings, {"BCW_QUARANTINE_HOLD_MAX": "90s"})["BCW_QUARANTINE_HOLD_MAX"] == "90s"
    )
    assert "BCW_REPLAY_HOLD_MAX" not in effective(settings)  # no second name
    # code gives it by its field's name
    assert ReplaySettings(hold_max=timedelta(seconds=3)).hold_max == timedelta(seconds=3)


def test_a_bad_hold_bound_is_refused_by_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BCW_QUARANTINE_HOLD_MAX", "-1")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert describe(refused.value, {"BCW_QUARANTINE_HOLD_MAX": "-1"}) == [
        "BCW_QUARANTINE_HOLD_MAX: must be a positive duration (45s, 5m, 2h, 7d) (got '-1')"
    ]
