"""The liveness controller's pure rules: the outage grace of the sweep, connected events,
which gateways it can see, and the fleet breaker."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.facts import Closed, CloseReason, NodeLoad, newest_per_node
from tests.factories import hello, make_fact
from workers.gateway.facts import MAX_FLUSH_BYTES, MAX_FLUSH_ENTRIES, flush_chunks
from workers.liveness.apply import credits_json, node_load_json
from workers.liveness.decide import (
    BreakerDecision,
    BreakerView,
    GatewaySight,
    Rules,
    SightChange,
    SweepState,
    closes_its_row,
    connected,
    decide_breaker,
    plan_sweep,
    sees,
    sight_change,
)

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


# -- sight: a gateway whose flushes are not applied lately is blind ---------------------
@pytest.mark.parametrize(
    ("last_flush_ago", "seeing"),
    [
        (None, False),
        (0 * S, True),
        (29 * S, True),
        (30 * S, True),
        (31 * S, False),
        (3600 * S, False),
    ],
    ids=["never", "now", "29s", "30s", "31s", "1h"],
)
def test_a_gateway_is_seen_while_its_flushes_are_applied(
    last_flush_ago: timedelta | None, seeing: bool
) -> None:
    last = None if last_flush_ago is None else NOW - last_flush_ago
    assert sees(GatewaySight("gw-1", last, None), NOW, RULES) is seeing


@pytest.mark.parametrize(
    ("last_flush_ago", "blind_since", "change"),
    [
        (1 * S, None, None),  # seeing, and said so
        (31 * S, None, SightChange("gw-1", True, 31 * S)),  # goes blind: say it once
        (40 * S, NOW - 9 * S, None),  # still blind: nothing new
        (1 * S, NOW - 9 * S, SightChange("gw-1", False, 1 * S)),  # sees again
        (None, None, SightChange("gw-1", True, None)),  # never flushed: blind
        (None, NOW - 9 * S, None),
        # the clock stepped back past the last flush (the demo's offset reset): age 0
        (-137 * S, NOW - 9 * S, SightChange("gw-1", False, 0 * S)),
    ],
    ids=[
        "seeing",
        "goes-blind",
        "stays-blind",
        "sees-again",
        "never-flushed",
        "never-still",
        "clock-stepped-back",
    ],
)
def test_sight_changes_are_said_once_per_transition(
    last_flush_ago: timedelta | None, blind_since: datetime | None, change: SightChange | None
) -> None:
    last = None if last_flush_ago is None else NOW - last_flush_ago
    assert sight_change(GatewaySight("gw-1", last, blind_since), NOW, RULES) == change


@pytest.mark.parametrize(
    ("known_for", "said"),
    [(5 * S, False), (30 * S, False), (31 * S, True)],
    ids=["5s", "30s", "31s"],
)
def test_a_gateway_that_just_appeared_is_held_but_not_said_blind(
    known_for: timedelta, said: bool
) -> None:
    sight = GatewaySight("gw-new", None, None, known_since=NOW - known_for)
    assert not sees(sight, NOW, RULES)  # its sessions are held meanwhile
    assert (sight_change(sight, NOW, RULES) is not None) is said


def test_blindness_follows_the_configured_period() -> None:
    rules = Rules(blind_after=2 * S)
    assert sees(GatewaySight("gw-1", NOW - 2 * S, None), NOW, rules)
    assert not sees(GatewaySight("gw-1", NOW - 3 * S, None), NOW, rules)


# -- the fleet breaker -------------------------------------------------------------------
def _breaker(
    would: int, connected: int, *, open: bool = False, released: bool = False
) -> BreakerDecision:
    return decide_breaker(BreakerView("gw-1", would, connected, open, released), RULES)


@pytest.mark.parametrize(
    ("would", "connected", "open", "released", "decision"),
    [
        # (hold, open, opened, closed)
        (1, 40, False, False, (False, False, False, False)),  # one node gone: normal
        (19, 20, False, False, (False, False, False, False)),  # under the minimum
        (20, 20, False, False, (True, True, True, False)),  # exactly the minimum: trips
        (20, 39, False, False, (True, True, True, False)),  # the minimum, just over half
        (20, 40, False, False, (False, False, False, False)),  # half: not more than half
        (21, 40, False, False, (True, True, True, False)),  # more than half: opens
        (30, 40, False, False, (True, True, True, False)),  # the example
        (30, 40, True, False, (True, True, False, False)),  # stays open, said once
        (30, 40, True, True, (False, False, False, True)),  # released: they go, it closes
        (3, 40, True, False, (False, False, False, True)),  # share fell back: closes
        (0, 0, True, True, (False, False, False, True)),
    ],
    ids=["one", "under-minimum", "at-the-minimum", "minimum-over-half", "half", "over-half", "30-of-40", "stays-open", "released",
         "fell-back", "nothing-left"],
)  # fmt: skip
def test_the_breaker_holds_a_wholesale_disconnect(
    would: int, connected: int, open: bool, released: bool, decision: tuple[bool, ...]
) -> None:
    got = _breaker(would, connected, open=open, released=released)
    assert (got.hold, got.open, got.opened, got.closed) == decision


@given(
    would=st.integers(0, 10_000),
    extra=st.integers(0, 10_000),
    open=st.booleans(),
    released=st.booleans(),
    share=st.floats(0.05, 1.0),
    minimum=st.integers(1, 100),
)
def test_the_breaker_is_consistent(
    would: int, extra: int, open: bool, released: bool, share: float, minimum: int
) -> None:
    rules = Rules(breaker_share=share, breaker_minimum=minimum)
    connected = would + extra
    got = decide_breaker(BreakerView("gw", would, connected, open, released), rules)
    too_many = would >= minimum and would > share * connected
    assert got.hold == (too_many and not (open and released))  # holds exactly then
    assert got.open == got.hold  # open after the sweep exactly when it held
    assert got.opened == (got.hold and not open)  # said once, when it opens
    assert got.closed == (open and not got.hold)  # closes only what was open
    if not too_many:
        assert not got.hold  # never holds a sweep that disconnects few


@pytest.mark.parametrize("reason", get_args(CloseReason))
def test_a_close_writes_its_row_unless_a_newer_session_owns_it(reason: str) -> None:
    """`superseded` and `fenced` closes are of a session whose row a newer one owns: they
    write nothing; every other close writes the disconnect (fenced on its epoch)."""
    closed = make_fact("closed", node_id="n1", epoch=3, reason=reason)
    assert isinstance(closed, Closed)
    assert closes_its_row(closed) is (reason not in ("superseded", "fenced"))


@given(st.lists(st.integers(0, 3_000), max_size=400), st.integers(1, 20_000))
def test_a_flush_is_cut_in_facts_under_the_byte_budget_in_order(
    sizes: list[int], budget: int
) -> None:
    """The reference gateway's flush facts: every entry once, in order; each fact within
    the budget (an entry over it alone) and its entry count; cut no earlier than needed."""
    slices = flush_chunks(sizes, budget)
    assert [i for start, end in slices for i in range(start, end)] == list(range(len(sizes)))
    assert slices[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(slices))
    for start, end in slices:
        used = sum(size + 1 for size in sizes[start:end])
        assert used <= budget or end - start == 1
        assert end - start <= MAX_FLUSH_ENTRIES
        if end < len(sizes):  # the next entry did not fit
            assert used + sizes[end] + 1 > budget or end - start == MAX_FLUSH_ENTRIES
    if not sizes:
        assert slices == [(0, 0)]  # an empty flush is still the gateway's heartbeat


def test_a_gateway_at_its_stream_bound_flushes_under_what_nats_carries() -> None:
    """5,000 sessions (the maxStreams default) whose heartbeats carry credits and load:
    ~200 bytes an entry, more than 1 MiB in one fact; cut into facts NATS carries."""
    entry = len(b'{"node_id":"7c9e6679-7425-40de-944b-e07fc1f90ae7","epoch":1,"age_ms":9999}') + 150
    slices = flush_chunks([entry] * 5_000)
    assert entry * 5_000 > 2**20 and len(slices) == 5
    assert all(sum(entry + 1 for _ in range(s, e)) <= MAX_FLUSH_BYTES for s, e in slices)


@given(st.dictionaries(st.text(max_size=12), st.integers(0, 2**31 - 1), max_size=8))
def test_an_entrys_credits_are_written_as_json_of_the_same_value(credits: dict[str, int]) -> None:
    assert json.loads(credits_json(credits)) == credits


@given(
    st.builds(
        NodeLoad,
        load_average=st.floats(0, 1e9, allow_nan=False, allow_infinity=False),
        memory_available_bytes=st.integers(0, 2**63 - 1),
        running_commands=st.integers(0, 2**31 - 1),
        pending_events=st.integers(0, 2**31 - 1),
    )
)
def test_a_heartbeats_load_is_written_as_json_of_every_field(load: NodeLoad) -> None:
    """Every field of the type, with its value: a field added to `NodeLoad` and not to
    the hand-written encoder fails here instead of going missing from the row."""
    written = json.loads(node_load_json(load))
    assert written == load
    assert set(written) == NodeLoad.__required_keys__ | NodeLoad.__optional_keys__
