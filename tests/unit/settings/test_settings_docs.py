"""The docs' settings tables are the settings: every group documented once, every table
as `settings.py` says (regenerate with `make docs`), and one duration syntax."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from workers.runtime.base.runtime_settings import ConsumerSettings, RetentionSettings
from workers.runtime.base.setting_types import format_duration, parse_duration
from workers.runtime.base.settings_docs import documented, render, table
from workers.settings import GROUPS

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", ROOT / "docs" / "runtime.md", ROOT / "docs" / "workers.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_each_table_is_what_the_settings_say(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    assert render(text, GROUPS) == text, f"{doc.name}: settings tables out of date: run `make docs`"


def test_every_group_is_documented_once() -> None:
    names = documented(path.read_text(encoding="utf-8") for path in DOCS)
    assert sorted(names) == sorted(GROUPS)


def test_a_table_lists_every_variable_with_its_default() -> None:
    text = table([RetentionSettings])
    assert "| `BCW_RETENTION_PROCESSED_FACTS` | `25h` |" in text
    assert "| `BCW_RETENTION_INTERVAL` | `1m` |" in text


def test_a_stale_table_is_found() -> None:
    text = "<!-- settings: OutboxSettings -->\n| old |\n<!-- /settings -->\n"
    assert render(text, GROUPS) != text
    with pytest.raises(KeyError):
        render("<!-- settings: NoSuchSettings -->\n<!-- /settings -->\n", GROUPS)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45", 45),
        ("0.5", 0.5),
        ("500ms", 0.5),
        ("45s", 45),
        ("5m", 300),
        ("2h", 7200),
        ("7d", 604800),
        ("1w", 604800),
        (" 1.5h ", 5400),
        ("0", 0),
        ("-5s", -5),
    ],
)
def test_one_duration_syntax(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "m", "--5s", "5x", "PT45S", "5 minutes", "1h30m", "nan"])
def test_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@given(st.integers(min_value=1, max_value=10**9))
def test_a_shown_duration_reads_back(milliseconds: int) -> None:
    value = timedelta(milliseconds=milliseconds)
    assert parse_duration(format_duration(value)) == value


def test_settings_read_the_same_syntax() -> None:
    consumer = ConsumerSettings(ack_wait="2m", fetch_timeout="250ms", nak_delay=3)  # type: ignore[arg-type]
    assert (consumer.ack_wait, consumer.fetch_timeout, consumer.nak_delay) == (120, 0.25, 3)
    retention = RetentionSettings(session_history="3d")  # type: ignore[arg-type]
    assert retention.session_history == timedelta(days=3)
    with pytest.raises(ValidationError, match="not a duration"):
        ConsumerSettings(ack_wait="PT45S")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="positive"):
        RetentionSettings(session_history="0s")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="at least 1d"):
        RetentionSettings(session_history="23h")  # type: ignore[arg-type]
