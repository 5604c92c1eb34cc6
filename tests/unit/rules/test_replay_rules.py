"""The replay dispatcher's pure rules, case by case."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.factories import hello
from workers.replay.decide import (
    REBOOT,
    RESTART,
    UPGRADE,
    Command,
    Session,
    busy_count,
    busy_delay,
    hello_lost,
    lane_limits,
    plan_dispatch,
    plan_replay,
    progress_to,
)

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


def cmd(
    seq: int, kind: str = "exec", lane: str = "default", state: str = "dispatched", **kw: Any
) -> Command:
    return Command(
        command_id=uuid.UUID(int=seq),
        node_id="n1",
        seq=seq,
        kind=kind,
        lane=lane,
        state=state,
        session_epoch=kw.pop("epoch", 1 if state != "pending" else None),
        **kw,
    )


def hello_at(epoch: int = 2, **kw: Any) -> Any:
    kw.setdefault(
        "previous",
        {"epoch": epoch - 1, "boot_id": "boot-1", "journal_id": "journal-1", "live": False},
    )
    kw.setdefault("boot_id", "boot-1")
    kw.setdefault("journal_id", "journal-1")
    kw.setdefault("cert", {"serial": "s", "allowed_kinds": None})
    return hello("n1", epoch, **kw)


def test_a_lost_journal_fails_everything_in_flight() -> None:
    commands = [cmd(1), cmd(2, state="acked"), cmd(3, state="running")]
    plan = plan_replay(hello_at(journal_id="journal-2"), commands)
    assert [c.seq for c in plan.failed] == [1, 2, 3]
    assert not (plan.resent or plan.kept or plan.completed)


@pytest.mark.parametrize(
    ("command", "hello_fields", "proof"),
    [
        pytest.param(
            cmd(1, REBOOT, state="running"), {"boot_id": "boot-2"}, "rebooted", id="reboot-new-boot"
        ),
        pytest.param(cmd(1, REBOOT, state="running"), {}, None, id="reboot-same-boot"),
        pytest.param(
            cmd(1, RESTART, state="dispatched", updated_at=NOW),
            {"running_command_ids": []},
            None,
            id="restart-absent-proves-nothing",
        ),
        pytest.param(
            cmd(1, RESTART, state="running", updated_at=NOW),
            {"running_command_ids": [], "process_started_at": NOW + timedelta(seconds=1)},
            "restarted",
            id="restart-new-process",
        ),
        pytest.param(
            cmd(1, RESTART, state="dispatched", updated_at=NOW),
            {"running_command_ids": [], "process_started_at": NOW - timedelta(hours=1)},
            None,
            id="restart-lost-before-delivery",
        ),
        pytest.param(
            cmd(1, RESTART, state="running"),
            {"running_command_ids": [str(uuid.UUID(int=1))]},
            None,
            id="restart-still-running",
        ),
        pytest.param(
            cmd(1, UPGRADE, payload={"target_version": "2.0.0"}),
            {"daemon_version": "2.0.0"},
            "upgraded",
            id="upgrade-reached",
        ),
        pytest.param(
            cmd(1, UPGRADE, payload={"target_version": "2.0.0"}),
            {"daemon_version": "1.9.0"},
            None,
            id="upgrade-not-yet",
        ),
    ],
)
def test_process_ending_commands_complete_by_proof(
    command: Command, hello_fields: dict[str, Any], proof: str | None
) -> None:
    plan = plan_replay(hello_at(**hello_fields), [command])
    if proof is None:
        assert plan.completed == ()
    else:
        assert plan.completed == ((command, proof),)


def test_what_this_session_was_already_sent_is_neither_replayed_nor_lost() -> None:
    sent_here = cmd(3, epoch=2)  # dispatched to epoch 2 before its Hello fact was applied
    plan = plan_replay(hello_at(2), [cmd(1), sent_here])
    assert [c.seq for c in plan.resent] == [1]
    lost = plan_replay(hello_at(2, journal_id="journal-2"), [cmd(1), sent_here])
    assert [c.seq for c in lost.failed] == [1]


def test_remaining_commands_are_kept_resent_cancelled_or_parked() -> None:
    running = cmd(2, state="running")
    commands = [cmd(5), running, cmd(3, kind="forbidden"), cmd(4, state="acked")]
    plan = plan_replay(
        hello_at(
            running_command_ids=[str(running.command_id)],
            cert={"serial": "s", "allowed_kinds": ["exec"]},
        ),
        commands,
    )
    assert [c.seq for c in plan.kept] == [2]
    assert [c.seq for c in plan.cancelled] == [3]
    assert [c.seq for c in plan.resent] == [4, 5]  # seq order


def test_an_upgrade_only_session_gets_only_the_upgrade() -> None:
    plan = plan_replay(
        hello_at(upgrade_required=True), [cmd(1), cmd(2, UPGRADE, payload={"target_version": "9"})]
    )
    assert [c.seq for c in plan.parked] == [1]
    assert [c.seq for c in plan.resent] == [2]


def test_a_websocket_session_gets_no_unsigned_command() -> None:
    plan = plan_replay(hello_at(transport="websocket"), [cmd(1), cmd(2, signature="sig")])
    assert [c.seq for c in plan.parked] == [1]
    assert [c.seq for c in plan.resent] == [2]


SESSION = Session("n1", 3, "gw-1")


def test_dispatch_in_seq_order_within_credits_per_lane() -> None:
    pending = [cmd(s, state="pending", lane="a" if s % 2 else "b") for s in range(10, 0, -1)]
    plan = plan_dispatch(SESSION, pending, {"a": 1, "b": 3}, credits=4, now=NOW)
    assert [(c.lane, c.seq) for c in plan.dispatch] == [("a", 1), ("b", 2), ("a", 3), ("a", 5)]


def test_a_backed_off_command_holds_its_lane() -> None:
    pending = [
        cmd(1, state="pending", not_before=NOW + timedelta(seconds=3)),
        cmd(2, state="pending"),
        cmd(3, state="pending", lane="other"),
    ]
    assert [c.seq for c in plan_dispatch(SESSION, pending, {}, 8, NOW).dispatch] == [3]
    assert [
        c.seq for c in plan_dispatch(SESSION, pending, {}, 8, NOW + timedelta(seconds=3)).dispatch
    ] == [1, 2, 3]


def test_dispatch_cancels_kinds_the_certificate_excludes_and_passes_over_what_must_wait() -> None:
    session = Session("n1", 3, "gw-1", transport="websocket", allowed_kinds=frozenset({"exec"}))
    pending = [
        cmd(1, "reboot-now", state="pending"),
        cmd(2, state="pending"),
        cmd(3, state="pending", signature="s"),
    ]
    plan = plan_dispatch(session, pending, {}, 8, NOW)
    assert [c.seq for c in plan.cancel] == [1]
    assert [c.seq for c in plan.dispatch] == [3]  # 2 is unsigned: it waits for a grpc session


def test_a_lane_awaiting_its_replay_gets_nothing_new_the_others_go_on() -> None:
    pending = [cmd(5, state="pending"), cmd(6, state="pending", lane="other")]
    plan = plan_dispatch(SESSION, pending, {"default": 1}, 8, NOW, awaiting_replay={"default"})
    assert [c.seq for c in plan.dispatch] == [6]
    after = plan_dispatch(SESSION, pending, {"default": 1}, 8, NOW, awaiting_replay=set())
    assert [c.seq for c in after.dispatch] == [5, 6]


@pytest.mark.parametrize(
    ("reported", "on_daemon", "expected"),
    [
        (None, {"default": 3}, {}),  # never reported: BCW_REPLAY_CREDITS everywhere
        ({}, {}, {}),
        ({"default": 4}, {}, {"default": 4}),
        ({"default": 1}, {"default": 3}, {"default": 4}),  # free 1 + held 3
        ({"default": 0}, {}, {"default": 0}),  # full: nothing until it frees one
        ({"default": 20}, {"default": 5}, {"default": 8}),  # never above the setting
        ({"a": 2, "b": 0}, {"b": 1}, {"a": 2, "b": 1}),
    ],
)
def test_lane_limits_from_heartbeat_credits(
    reported: dict[str, int] | None, on_daemon: dict[str, int], expected: dict[str, int]
) -> None:
    assert lane_limits(reported, on_daemon, credits=8) == expected


def test_dispatch_takes_each_lanes_limit_and_the_setting_elsewhere() -> None:
    pending = [cmd(s, state="pending", lane="a" if s <= 4 else "b") for s in range(1, 9)]
    plan = plan_dispatch(SESSION, pending, {}, 3, NOW, limits={"a": 1})
    assert [(c.lane, c.seq) for c in plan.dispatch] == [("a", 1), ("b", 5), ("b", 6), ("b", 7)]


def test_the_busy_back_off_sequence_and_its_restart_in_a_new_session() -> None:
    delays, attempts, epoch_seen = [], 0, None
    for epoch in [5, 5, 5, 5, 5, 5, 5, 6, 6]:
        attempts = busy_count(attempts, epoch_seen, epoch)
        epoch_seen = epoch
        delays.append(
            busy_delay(attempts, timedelta(seconds=1), timedelta(seconds=30)).total_seconds()
        )
    assert delays == [1, 2, 4, 8, 16, 30, 30, 1, 2]


@pytest.mark.parametrize(
    ("state", "reported", "expected"),
    [
        ("dispatched", "acked", "acked"),
        ("dispatched", "running", "running"),
        ("acked", "running", "running"),
        ("running", "acked", None),
        ("acked", "acked", None),
        ("pending", "acked", None),
        ("done", "running", None),
    ],
)
def test_progress_moves_forward_only(state: str, reported: str, expected: str | None) -> None:
    assert progress_to(state, reported) == expected


_T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
_LOST_AFTER = timedelta(seconds=60)


@pytest.mark.parametrize(
    ("seen", "connected_ago", "asked_epoch", "asked_ago", "ask"),
    [
        pytest.param(5, 600, None, None, False, id="its-hello-applied"),
        pytest.param(6, 600, None, None, False, id="a-newer-hello-applied"),
        pytest.param(4, 59, None, None, False, id="connected-under-the-bound"),
        pytest.param(4, 60, None, None, True, id="connected-for-the-bound"),
        pytest.param(None, 600, None, None, True, id="never-any-hello"),
        pytest.param(4, 600, 5, 299, False, id="asked-lately"),
        pytest.param(4, 600, 5, 300, True, id="asked-five-bounds-ago"),
        pytest.param(4, 600, 4, 1, True, id="asked-for-an-older-epoch"),
    ],
)
def test_a_session_is_asked_for_its_hello_once_it_is_lost(
    seen: int | None, connected_ago: int, asked_epoch: int | None, asked_ago: int | None, ask: bool
) -> None:
    asked_at = None if asked_ago is None else _T0 - timedelta(seconds=asked_ago)
    connected_at = _T0 - timedelta(seconds=connected_ago)
    assert hello_lost(5, seen, connected_at, asked_epoch, asked_at, _T0, _LOST_AFTER) is ask
