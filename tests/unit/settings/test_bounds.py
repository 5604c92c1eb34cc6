"""Settings bounded by what the code does: the quarantine's counting window fits in the day
its alternations are kept, and the lock waits that do not follow BCW_DATABASE_LOCK_TIMEOUT
are the ones its description names."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from workers.liveness.apply import SKIPPED_WAIT
from workers.quarantine.apply import PRUNE_ALTERNATIONS
from workers.quarantine.record import WITHHELD
from workers.quarantine.settings import ALTERNATIONS_KEPT, QuarantineSettings
from workers.runtime.base.runtime_settings import DatabaseSettings
from workers.runtime.store.db import TABLE_LOCK_WAIT
from workers.runtime.store.migrate import SCHEMA_LOCK_WAIT
from workers.settings import Settings, describe

MIGRATIONS = Path(__file__).resolve().parents[3] / "migrations" / "core"


def test_the_quarantine_window_may_be_as_long_as_alternations_are_kept() -> None:
    assert QuarantineSettings(window=ALTERNATIONS_KEPT).window == ALTERNATIONS_KEPT


@pytest.mark.parametrize("given", ["25h", "2d", "1w", str(ALTERNATIONS_KEPT.total_seconds() + 1)])
def test_a_quarantine_window_past_the_pruning_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    monkeypatch.setenv("BCW_QUARANTINE_WINDOW", given)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert describe(refused.value, {"BCW_QUARANTINE_WINDOW": given}) == [
        "BCW_QUARANTINE_WINDOW: must be at most 1d: alternations older than that are pruned, "
        f"never counted (got '{given}')"
    ]


def test_the_pruning_is_the_one_constant() -> None:
    assert timedelta(days=ALTERNATIONS_KEPT.days) == ALTERNATIONS_KEPT  # said in days in SQL
    kept = f"compute_now() - interval '{ALTERNATIONS_KEPT.days} day'"
    assert kept in PRUNE_ALTERNATIONS and kept in WITHHELD


def _hello_lock_timeout() -> str:
    """The lock timeout of `gateway_hello`'s current body (the last migration that makes it)."""
    made = [
        p for p in sorted(MIGRATIONS.glob("*.sql")) if "FUNCTION gateway_hello(" in p.read_text()
    ]
    body = made[-1].read_text().split("FUNCTION gateway_hello(", 1)[1]
    found = re.search(r"SET lock_timeout = '(\w+)'", body)
    assert found, made[-1].name
    return found.group(1)


def test_each_lock_wait_of_its_own_is_named_by_the_setting() -> None:
    said = DatabaseSettings.model_fields["lock_timeout"].description or ""
    assert f"a gateway's Hello waits {_hello_lock_timeout()} (its SQL function)" in said
    assert f"a flush {SKIPPED_WAIT} for the session rows it skipped" in said
    assert f"`bcw migrate` {SCHEMA_LOCK_WAIT} at a time for its schema lock" in said
    assert f"and {TABLE_LOCK_WAIT} at a time for a table's" in said
