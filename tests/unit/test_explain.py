"""`bcw explain`'s pure parts: durations, one line per history entry, the state line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from workers.runtime.base.setting_types import parse_since
from workers.tools.explain import describe, state_line


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("30m", 1800),
        ("1h", 3600),
        ("2d", 172800),
        ("1w", 604800),
        (" 1.5h ", 5400),
    ],
)
def test_parse_since(text: str, seconds: int) -> None:
    assert parse_since(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "h", "0", "-1h", "5x", "1h30m"])
def test_parse_since_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_since(text)


@pytest.mark.parametrize(
    ("what", "detail", "line"),
    [
        (
            "node.connected",
            {"bootId": "b2", "journalChanged": True, "bootChanged": True},
            "boot b2 (journal changed, reboot)",
        ),
        ("node.connected", {"bootId": "b1"}, "boot b1"),
        ("node.disconnected", {"reason": "gateway-lost"}, "gateway-lost"),
        ("node.capabilities-changed", {"added": ["gpu"], "removed": ["fpga"]}, "+gpu -fpga"),
        (
            "security.node.duplicate-session",
            {
                "alternations": 4,
                "windowSeconds": 600,
                "quarantined": True,
                "previousBootId": "a",
                "bootId": "b",
            },
            "alternation 4 in 600 s (quarantined): boot a → b",
        ),
        (
            "security.node.quarantined",
            {"reason": "duplicate-identity", "revokedSerials": ["s1"]},
            "duplicate-identity: revoked s1",
        ),
        (
            "command.failed",
            {"kind": "exec", "seq": 3, "attempt": 1, "reason": "journal-lost"},
            "exec #3 attempt 1: journal-lost",
        ),
        ("dispatch", {"kind": "noop", "seq": 1, "attempt": 2}, "noop #1 attempt 2"),
    ],
)
def test_describe(what: str, detail: dict[str, Any], line: str) -> None:
    assert describe(what, detail) == line


NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
ROW = {
    "session_epoch": 4,
    "gateway_id": "gw-1",
    "connected_at": NOW,
    "last_seen": NOW - timedelta(seconds=9),
    "disconnected_at": None,
    "disconnect_reason": None,
    "held_epoch": None,
    "duplicate_hellos": 0,
    "cert_serial": "s1",
    "revoked": False,
    "now": NOW,
}


def test_state_line() -> None:
    assert state_line(None).startswith("no such node")
    assert state_line(ROW) == "connected via gw-1 at epoch 4, last seen 9s ago"
    assert "held for the quarantine" in state_line({**ROW, "held_epoch": 4})
    gone = {
        **ROW,
        "gateway_id": None,
        "disconnected_at": NOW - timedelta(minutes=5),
        "disconnect_reason": "revoked",
        "revoked": True,
    }
    assert state_line(gone) == (
        "disconnected (revoked) 5m ago, last epoch 4; certificate s1 revoked"
    )
    assert state_line({**ROW, "gateway_id": None}) == "never connected"


HOSTILE = "[link=http://evil]x[/link] \x1b[2J\x1b]0;owned\x07 [red]"


def test_operator_output_shows_node_data_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    """What nodes and gateways said never reaches the terminal as markup or a control."""
    from workers.tools.display import plain, printable
    from workers.tools.explain import Step, render

    assert printable("a\x1bb\nc\x9b") == "a\\x1bb\\nc\\x9b"
    assert plain("[bold]x") == "\\[bold]x"
    step = Step(
        at=datetime(2026, 12, 1, tzinfo=UTC),
        what="node.connected",
        epoch=1,
        gateway_id="gw-1",
        worker="liveness",
        summary=HOSTILE,
        fact_id=None,
        trace_id=None,
    )
    render("n[b]1\x1b", {**ROW, "gateway_id": "gw-[x]"}, [step], "24h")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "[link=http://evil]" in out and "[red]" in out and "n[b]1\\x1b" in out


def test_bcw_events_shows_node_data_without_controls() -> None:
    from workers.tools.tail import render

    body = {"nodeId": "n\x1b[31m1", "epoch": 1, "reason": HOSTILE}
    line = render(
        "bc.events.node.disconnected",
        {"Bc-Type": "node.disconnected"},
        datetime(2026, 12, 1, tzinfo=UTC),
        body,
        as_json=False,
    )
    assert "\x1b" not in line and "\x07" not in line and "n\\x1b[31m1" in line


def test_explain_json_gives_the_state_as_fields() -> None:
    import json

    from workers.tools.explain import as_json

    held = {**ROW, "held_epoch": 4, "revoked": True}
    out = json.loads(as_json("n1", held, []))
    assert out["state"] == {
        **out["state"],
        "connected": True,
        "epoch": 4,
        "gateway_id": "gw-1",
        "held_for_quarantine": True,
        "cert_revoked": True,
        "disconnect_reason": None,
    }
    assert out["summary"].startswith("connected via gw-1") and out["timeline"] == []
    assert json.loads(as_json("ghost", None, []))["state"] is None


def test_explain_says_a_takeover_attempt_and_a_hold_for_an_operator() -> None:
    import json

    from workers.tools.explain import as_json, state_line

    taken = {**ROW, "held_epoch": 4, "proven": False}
    assert "a takeover attempt, held" in state_line(taken)
    assert "held for the quarantine" not in state_line(taken)
    held = {**ROW, "held_for_operator": True}
    assert "held for an operator" in state_line(held)
    out = json.loads(as_json("n1", held, []))
    assert (out["state"]["held_for_operator"], out["state"]["proven"]) == (True, None)
