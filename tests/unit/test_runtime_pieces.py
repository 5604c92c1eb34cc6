"""Pure pieces of the runtime: settings from the environment, the outcome vocabulary,
the Prometheus text, the error classification, lane choice."""

from __future__ import annotations

import asyncpg
import pytest

from workers.runtime import outcome
from workers.runtime.errors import PermanentError, is_transient
from workers.runtime.metrics import Counter, Histogram, Metrics
from workers.runtime.settings import Settings


def test_settings_come_from_bcw_variables_and_hide_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BCW_DATABASE_URL", "postgresql://bcw:hunter2@db/bcw")
    monkeypatch.setenv("BCW_NATS_URL", "nats://a:4222, nats://b:4222")
    monkeypatch.setenv("BCW_SUBJECT_ROOT", "t1")
    monkeypatch.setenv("BCW_CONSUMER_BATCH_SIZE", "128")
    monkeypatch.setenv("BCW_OUTBOX_RELAY", "false")
    settings = Settings()
    assert settings.subject_root == "t1"
    assert settings.nats.servers == ["nats://a:4222", "nats://b:4222"]
    assert settings.consumer.batch_size == 128
    assert settings.outbox.relay is False
    assert settings.database.url.get_secret_value() == "postgresql://bcw:hunter2@db/bcw"
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings)


@pytest.mark.parametrize(
    ("name", "value"),
    [("BCW_SUBJECT_ROOT", "a.b"), ("BCW_CONSUMER_BATCH_SIZE", "0"), ("BCW_HEALTH_PORT", "70000")],
)
def test_bad_settings_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError):
        Settings()


@pytest.mark.parametrize(
    ("result", "acks", "keeps_inbox_row"),
    [
        (outcome.APPLIED, True, True),
        (outcome.STALE, True, True),
        (outcome.IGNORED, True, False),
        (outcome.DUPLICATE, True, False),
        (outcome.retry_after(2), False, False),
        (outcome.dead("bad"), False, False),
    ],
    ids=lambda v: v.kind.value if isinstance(v, outcome.Outcome) else str(v),
)
def test_outcomes(result: outcome.Outcome, acks: bool, keeps_inbox_row: bool) -> None:
    assert (result.acks, result.keeps_inbox_row) == (acks, keeps_inbox_row)


def test_retry_after_never_negative() -> None:
    assert outcome.retry_after(-3).delay == 0


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (asyncpg.DeadlockDetectedError("x"), True),
        (asyncpg.SerializationError("x"), True),
        (asyncpg.AdminShutdownError("x"), True),
        (ConnectionRefusedError(), True),
        (TimeoutError(), True),
        (asyncpg.UniqueViolationError("x"), False),
        (PermanentError("no"), False),
        (KeyError("bug"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_error_classification(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


def test_prometheus_text() -> None:
    counter = Counter("c_total", "help", ("worker",))
    counter.inc("a")
    counter.inc("a", by=2)
    histogram = Histogram("h_seconds", "help", ("worker",), buckets=(0.1, 1.0))
    histogram.observe(0.05, "a")
    histogram.observe(0.5, "a")
    histogram.observe(5, "a")
    assert counter.samples() == ['c_total{worker="a"} 3']
    assert histogram.samples() == [
        'h_seconds_bucket{worker="a",le="0.1"} 1',
        'h_seconds_bucket{worker="a",le="1"} 2',
        'h_seconds_bucket{worker="a",le="+Inf"} 3',
        'h_seconds_sum{worker="a"} 5.55',
        'h_seconds_count{worker="a"} 3',
    ]
    text = Metrics().render()
    assert "# TYPE bcw_facts_total counter" in text and "# TYPE bcw_batch_seconds histogram" in text
