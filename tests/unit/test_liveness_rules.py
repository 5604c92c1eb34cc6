"""The liveness controller's pure rules: the outage grace of the sweep, connected events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from schemas.facts import Closed, newest_per_node
from tests.factories import hello, make_fact
from workers.liveness.decide import Rules, SweepState, connected, plan_sweep

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
RULES = Rules()
S = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("gap", "transitions"),
    [(5 * S, True), (19 * S, True), (20 * S, True), (21 * S, False), (3600 * S, False)],
    ids=["5s", "19s", "20s", "21s", "1h"],
)
def test_a_gap_over_20s_starts_the_grace(gap: timedelta, transitions: bool) -> None:
    plan = plan_sweep(SweepState(NOW - gap, None), NOW, RULES)
    assert plan.age_transitions is transitions
    assert plan.state.last_sweep_at == NOW
    assert plan.state.grace_until == (None if transitions else NOW + timedelta(minutes=5))


def test_the_first_sweep_ever_starts_the_grace() -> None:
    plan = plan_sweep(SweepState(None, None), NOW, RULES)
    assert not plan.age_transitions and plan.state.grace_until == NOW + timedelta(minutes=5)


def test_the_grace_holds_then_ends() -> None:
    state = plan_sweep(SweepState(NOW - 30 * S, None), NOW, RULES).state
    t = NOW
    seen = []
    while t < NOW + timedelta(minutes=6):
        t += 10 * S
        plan = plan_sweep(state, t, RULES)
        state = plan.state
        seen.append((t - NOW, plan.age_transitions))
    assert all(not ok for elapsed, ok in seen if elapsed < timedelta(minutes=5))
    assert all(ok for elapsed, ok in seen if elapsed >= timedelta(minutes=5))


def test_cutoffs() -> None:
    plan = plan_sweep(SweepState(NOW - S, None), NOW, RULES)
    assert plan.stale_before == NOW - 45 * S
    assert plan.gateway_expired_before == NOW - 120 * S


def test_connected_carries_the_flags_for_a_current_hello_only() -> None:
    h = hello(
        "n1", 4, boot_id="b2", journal_id="j1",
        previous={"epoch": 3, "gateway_id": "gw-0", "boot_id": "b1", "journal_id": "j0", "live": True},
    )  # fmt: skip
    event = connected(h, 4)
    assert event is not None
    assert (event.journal_changed, event.boot_changed, event.duplicate_identity) == (
        True,
        True,
        True,
    )
    assert (event.node_id, event.epoch, event.gateway_id, event.boot_id) == ("n1", 4, "gw-1", "b2")
    assert connected(h, 5) is None
    assert connected(h, None) is None


def test_newest_fact_per_node() -> None:
    old, new, other = (
        make_fact("closed", node_id=n, epoch=e) for n, e in [("n", 2), ("n", 3), ("m", 1)]
    )
    assert isinstance(old, Closed) and isinstance(new, Closed) and isinstance(other, Closed)
    assert newest_per_node([new, old, other]) == {"n": new, "m": other}
    assert newest_per_node([old, new]) == newest_per_node([new, old]) == {"n": new}
