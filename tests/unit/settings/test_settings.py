"""Settings from the environment: `BCW_*` variables, secrets hidden, every bad value
refused with one line naming its variable."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.settings import Settings, describe


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
    ("environment", "line"),
    [
        (
            {"BCW_LIVENESS_HEARTBEAT_INTERVAL": "-10"},
            "BCW_LIVENESS_HEARTBEAT_INTERVAL: must be a positive duration (45s, 5m, 2h, 7d) (got '-10')",
        ),
        (
            {"BCW_RETENTION_NODE_EVENTS": "0"},
            "BCW_RETENTION_NODE_EVENTS: must be a positive duration (45s, 5m, 2h, 7d) (got '0')",
        ),
        (
            {"BCW_LOG_LEVEL": "LOUD"},
            "BCW_LOG_LEVEL: Input should be 'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL' (got 'LOUD')",
        ),
        (
            {"BCW_NATS_FACTS_GATEWAYS": "gw-1, gw.2"},
            "BCW_NATS_FACTS_GATEWAYS: 'gw.2' is not a gateway id (^[A-Za-z0-9_-]{1,64}$) "
            "(got 'gw-1, gw.2')",
        ),
        (
            {"BCW_NATS_FACTS_GATEWAYS": "gw-1,gw-2,gw-1"},
            "BCW_NATS_FACTS_GATEWAYS: 'gw-1' is given twice (got 'gw-1,gw-2,gw-1')",
        ),
        (
            {"BCW_NATS_STREAM_MAX_MSGS": "1000000"},
            "BCW_NATS_FACTS_MSGS_PER_GATEWAY (5000000) must be at most a tenth of "
            "BCW_NATS_STREAM_MAX_MSGS (1000000): one gateway must not fill the facts stream for "
            "the others",
        ),
        (
            {"BCW_DATABASE_URL": "mysql://u:hunter2@h/d"},
            "BCW_DATABASE_URL: must be a postgresql:// URL",
        ),
        (
            {"BCW_DATABASE_POOL_MIN": "5", "BCW_DATABASE_POOL_MAX": "2"},
            "BCW_DATABASE_POOL_MIN (5) is above BCW_DATABASE_POOL_MAX (2)",
        ),
        (
            {"BCW_CONSUMER_ACK_WAIT": "10"},
            "BCW_DATABASE_COMMAND_TIMEOUT (20s) must be below BCW_CONSUMER_ACK_WAIT (10s): a slow statement would outlive the fact's delivery",
        ),
        (
            {"BCW_NATS_URL": "nats://a:4222,http://b"},
            "BCW_NATS_URL: 'http://b' is not a nats://host:port URL",
        ),
        (
            {"BCW_NATS_TLS_KEY_FILE": "/etc/hostname"},
            "BCW_NATS_TLS_CERT_FILE and BCW_NATS_TLS_KEY_FILE go together",
        ),
        (
            {
                "BCW_NATS_NOTICES_MAX_CONSUMERS": "8",
                "BCW_NATS_GATEWAYS": ",".join(f"gw-{i}" for i in range(9)),
            },
            "BCW_NATS_NOTICES_MAX_CONSUMERS (8) is below the 9 gateways listed: each needs a "
            "notices consumer",
        ),
        (
            {"BCW_NATS_FACTS_MAX_AGE": "2d"},
            "BCW_RETENTION_PROCESSED_FACTS (25h) must be above BCW_NATS_FACTS_MAX_AGE (2d)",
        ),
        (
            {"BCW_NATS_EVENTS_MAX_AGE": "30s"},
            "BCW_NATS_EVENTS_MAX_AGE: must be at least 2m (got 30.0)",
        ),
        (
            {"BCW_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT": "3"},
            "BCW_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT (3s) must be above BCW_OUTBOX_PUBLISH_TIMEOUT (5s)",
        ),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_bad_settings_name_their_variable(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], line: str
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    [described] = describe(refused.value)
    assert described.startswith(line)
    assert "hunter2" not in described


def test_our_sessions_end_when_idle_in_a_transaction_and_wait_for_no_lock_for_long() -> None:
    from workers.runtime.base.runtime_settings import DatabaseSettings
    from workers.runtime.store.db import server_settings

    assert server_settings(DatabaseSettings()) == {
        "idle_in_transaction_session_timeout": "30000",
        "lock_timeout": "15000",
    }
    assert server_settings(DatabaseSettings(lock_timeout=0.5)) == {
        "idle_in_transaction_session_timeout": "30000",
        "lock_timeout": "500",
    }
    assert server_settings(DatabaseSettings(idle_in_transaction_timeout=0, lock_timeout=0)) == {}


def test_a_log_level_is_taken_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BCW_LOG_LEVEL", "debug")
    assert Settings().log_level == "DEBUG"
