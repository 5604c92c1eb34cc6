"""One clock for sight (docs/workers.md): as of when the flushes the liveness controller
applied cover each gateway, on the bus's clock; why a gateway is blind; what a re-cut of
a gateway's ranges keeps."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.facts import HASH_SPACE
from workers.liveness.decide import Rules, remainders
from workers.liveness.seeing import (
    GatewaySight,
    SightChange,
    behind,
    blind_reason,
    covered_at,
    gone,
    restarting,
    seen_at,
    sees,
    sight_change,
    stale_before,
)

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
RULES = Rules()
S = timedelta(seconds=1)


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
        (31 * S, None, SightChange("gw-1", True, 31 * S, "no-flush")),  # goes blind: once
        (40 * S, NOW - 9 * S, None),  # still blind: nothing new
        (1 * S, NOW - 9 * S, SightChange("gw-1", False, 1 * S)),  # sees again
        (None, None, SightChange("gw-1", True, None, "no-flush")),  # never flushed: blind
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


def test_a_gateway_gone_blind_while_the_controller_is_behind_is_blind_for_lag() -> None:
    sight = GatewaySight("gw-1", NOW - 31 * S, None)
    assert sight_change(sight, NOW, RULES, lag=40.0) == SightChange("gw-1", True, 31 * S, "lag")
    seeing_again = GatewaySight("gw-1", NOW - 1 * S, NOW - 9 * S)
    assert sight_change(seeing_again, NOW, RULES, lag=40.0) == SightChange("gw-1", False, 1 * S)


QUARTER = HASH_SPACE // 4


def _ranges(*ages: int) -> tuple[tuple[int, int, datetime], ...]:
    return tuple((i * QUARTER, (i + 1) * QUARTER, NOW - age * S) for i, age in enumerate(ages))


@pytest.mark.parametrize(
    ("sight", "lag", "reason"),
    [
        # caught up: nothing of it reaches the controller
        (GatewaySight("gw-1", NOW - 40 * S, None), 0.2, "no-flush"),
        # its own consumer cannot be read: behind whatever it cannot read
        (GatewaySight("gw-1", NOW - 40 * S, None), None, "lag"),
        # 50 s behind, the gateway's newest applied flush at about that point: it waits
        (GatewaySight("gw-1", NOW - 55 * S, None), 50.0, "lag"),
        # 50 s behind, but nothing of it for two flush periods before that: silent
        (GatewaySight("gw-1", NOW - 90 * S, None), 50.0, "no-flush"),
        # one range applied a minute behind the others: the controller holds it back,
        # however caught up its consumer looks
        (GatewaySight("gw-1", NOW - 1 * S, None, ranges=_ranges(1, 1, 60, 1)), 0.0, "lag"),
        # every range stopped at one flush: silent
        (GatewaySight("gw-1", NOW - 40 * S, None, ranges=_ranges(40, 40, 40, 40)), 0.0, "no-flush"),
    ],
    ids=["caught-up", "not-known", "behind-it-waits", "behind-it-is-silent", "uneven", "stopped"],
)
def test_why_a_gateway_is_blind(sight: GatewaySight, lag: float | None, reason: str) -> None:
    assert not sees(sight, NOW, RULES)
    assert blind_reason(sight, NOW, RULES, lag) == reason


@pytest.mark.parametrize(
    ("lag", "lagging"),
    [(0.0, False), (5.0, False), (15.0, False), (15.5, True), (600.0, True), (None, True)],
    ids=["caught-up", "seconds", "a-flush-period", "past-it", "ten-minutes", "not-known"],
)
def test_the_controller_is_behind_past_half_the_blind_threshold(
    lag: float | None, lagging: bool
) -> None:
    assert behind(lag, RULES) is lagging


# -- one clock for sight: what the applied flushes cover ----------------------------------
def _brute_covered(ranges: list[tuple[int, int, datetime]], space: int) -> datetime | None:
    """`covered_at` by looking at every hash of a small space."""
    oldest = None
    for h in range(space):
        newest = max((at for s, e, at in ranges if s <= h < e), default=None)
        if newest is None:
            return None
        oldest = newest if oldest is None else min(oldest, newest)
    return oldest


@given(
    st.lists(
        st.tuples(st.integers(0, 15), st.integers(1, 16), st.integers(0, 100)).filter(
            lambda r: r[0] < r[1]
        ),
        max_size=8,
    )
)
def test_a_gateways_ranges_see_each_hash_as_of_its_newest_row_and_all_as_of_the_oldest(
    rows: list[tuple[int, int, int]],
) -> None:
    ranges = [(s, e, NOW - at * S) for s, e, at in rows]
    assert covered_at(ranges, space=16) == _brute_covered(ranges, 16)


def test_one_range_applied_late_does_not_stand_for_another() -> None:
    """The failure of the busy day: a gateway's flush cut in four ranges, three applied
    now and one waiting in the stream for a minute — the gateway is seen as of a minute
    ago, not now."""
    quarter = HASH_SPACE // 4
    rows = [(i * quarter, (i + 1) * quarter, NOW - (60 if i == 2 else 1) * S) for i in range(4)]
    sight = GatewaySight("gw-1", NOW - 1 * S, None, ranges=tuple(rows))
    assert seen_at(sight) == NOW - 60 * S
    assert not sees(sight, NOW, RULES)


def test_a_hash_no_range_row_covers_is_not_seen_unless_a_whole_flush_covers_it() -> None:
    half = HASH_SPACE // 2
    gap = GatewaySight("gw-1", NOW - 1 * S, None, ranges=((0, half, NOW - 1 * S),))
    assert seen_at(gap) is None and not sees(gap, NOW, RULES)
    whole = GatewaySight(
        "gw-1", NOW - 1 * S, None, ranges=((0, half, NOW - 1 * S),), whole_flush_at=NOW - 2 * S
    )
    assert seen_at(whole) == NOW - 2 * S  # a whole flush names every session
    # a gateway rolled back to whole flushes: its old range rows no longer say anything
    rolled_back = GatewaySight(
        "gw-1",
        NOW - 1 * S,
        None,
        ranges=((0, HASH_SPACE, NOW - 3600 * S),),
        whole_flush_at=NOW - 1 * S,
    )
    assert sees(rolled_back, NOW, RULES)


def test_a_gateway_whose_first_flush_is_half_applied_is_held_but_not_said_blind() -> None:
    half = HASH_SPACE // 2
    sight = GatewaySight(
        "gw-new", NOW - 1 * S, None, known_since=NOW - 5 * S, ranges=((0, half, NOW - 1 * S),)
    )
    assert not sees(sight, NOW, RULES)
    assert sight_change(sight, NOW, RULES) is None


@given(
    st.lists(
        st.tuples(st.integers(0, 31), st.integers(1, 32)).filter(lambda r: r[0] < r[1]), max_size=4
    ),
    st.lists(
        st.tuples(st.integers(0, 31), st.integers(1, 32)).filter(lambda r: r[0] < r[1]), max_size=4
    ),
)
def test_a_recut_keeps_exactly_what_its_new_ranges_do_not_name(
    replaced: list[tuple[int, int]], written: list[tuple[int, int]]
) -> None:
    kept = remainders(replaced, written)
    in_replaced = {h for s, e in replaced for h in range(s, e)}
    in_written = {h for s, e in written for h in range(s, e)}
    in_kept = [h for s, e in kept for h in range(s, e)]
    assert sorted(set(in_kept)) == sorted(in_replaced - in_written)
    assert all(s < e for s, e in kept)
    # no hash kept twice, unless two replaced rows overlapped there
    if all(a[1] <= b[0] for a, b in itertools.pairwise(sorted(replaced))):
        assert len(in_kept) == len(set(in_kept))


@pytest.mark.parametrize(
    ("covered_ago", "sight_ago", "stale"),
    [
        # the busy day's margin: 12 s behind (under a flush period: not "behind"), its
        # range stored 27 s ago, a session that missed a heartbeat (age 19 s) — alive
        (27, 27 + 19, False),
        (27, 27 + 31, True),  # its gateway heard nothing of it for 31 s: gone
        (0, 44, False),  # the seed's 45 s, caught up
        (0, 46, True),
        (29, 29 + 29, False),  # at the blind threshold, 29 s of silence: not yet
    ],
    ids=["missed-a-heartbeat-behind", "silent-31s-behind", "44s", "46s", "29s-silent-at-blind"],
)
def test_a_session_is_stale_by_its_gateways_silence_in_what_was_applied(
    covered_ago: int, sight_ago: int, stale: bool
) -> None:
    """A session is stale only when it was last seen 45 s ago and 30 s before what the
    applied flushes of its gateway cover: a controller behind them never takes a session
    that missed a heartbeat or two for one its gateway no longer hears."""
    before = stale_before(NOW - covered_ago * S, NOW, RULES)
    assert (NOW - sight_ago * S < before) is stale


@given(st.integers(0, 30), st.integers(0, 10))
def test_a_healthy_session_of_a_seen_gateway_is_never_stale(covered_ago: int, age: int) -> None:
    """Seen (its flushes applied up to `blind_after` ago) with an age under a heartbeat:
    whatever the lag and wherever in the flush period, never stale."""
    sight = NOW - (covered_ago + age) * S
    assert sees(GatewaySight("gw-1", NOW - covered_ago * S, None), NOW, RULES)
    assert not sight < stale_before(NOW - covered_ago * S, NOW, RULES)


# -- a gateway that stopped: gone, not blind --------------------------------------------
@given(blind=st.booleans(), sessions=st.integers(0, 3), drained=st.booleans())
def test_only_a_drained_gateway_without_session_is_gone_rather_than_blind(
    blind: bool, sessions: int, drained: bool
) -> None:
    """A drained gateway holds nothing once its sessions are closed, and takes no Hello:
    not called blind while it stops (its lease still held) or is away. One that holds a
    session, or was not drained, is blind as ever, and a gateway seen again is always
    said."""
    change = SightChange("gw-1", blind, 40 * S, "no-flush" if blind else None)
    assert gone(change, sessions, drained) == (blind and drained and sessions == 0)


# -- a gateway that restarted after a drain: its new lease is a start ------------------
@given(
    lease_ago=st.one_of(st.none(), st.integers(0, 120)),
    after_drain=st.booleans(),
    earlier=st.booleans(),
    last_flush_ago=st.one_of(st.none(), st.integers(0, 600)),
    known_for=st.integers(0, 3600),
)
def test_a_restart_after_a_drain_holding_nothing_from_before_is_not_news_for_blind_after(
    lease_ago: int | None,
    after_drain: bool,
    earlier: bool,
    last_flush_ago: int | None,
    known_for: int,
) -> None:
    """The sight of a gateway's last life (`last_flush_ago`, known for `known_for`) under
    a lease begun `lease_ago` s ago: blindness is said as ever, except within `blind_after`
    (30 s) of a lease taken after a drained life holding no session from before it — or
    of a gateway's first appearance, none of its flushes applied yet."""
    since = None if lease_ago is None else NOW - lease_ago * S
    last = None if last_flush_ago is None else NOW - last_flush_ago * S
    sight = GatewaySight("gw-1", last, None, known_since=NOW - known_for * S)
    blind = last_flush_ago is None or last_flush_ago > 30
    restart = lease_ago is not None and after_drain and not earlier and lease_ago <= 30
    appearing = last is None and known_for <= 30
    change = sight_change(sight, NOW, RULES)
    quiet = change is not None and restarting(change, since, after_drain, earlier, NOW, RULES)
    assert sees(sight, NOW, RULES) is not blind  # held whether said or not
    assert (change is not None and not quiet) is (blind and not restart and not appearing)


@pytest.mark.parametrize(
    ("lease_ago", "after_drain", "earlier", "said"),
    [
        (1, True, False, False),  # back from a drain, its first flush not applied: a start
        (30, True, False, False),
        (31, True, False, True),  # no flush applied a whole `blind_after` into it: news
        (1, True, True, True),  # its closes not written: sessions unseen, held, news
        (1, False, False, True),  # a crash (loop), a takeover: no start, blind as ever
        (None, True, False, True),  # no restart known (a lease before migration 0064)
    ],
    ids=[
        "after-drain",
        "after-drain-30s",
        "after-drain-31s",
        "kept-a-session",
        "after-a-crash",
        "lease-not-known",
    ],
)
def test_a_restart_after_a_slow_drain_is_said_blind_only_past_its_grace(
    lease_ago: int | None, after_drain: bool, earlier: bool, said: bool
) -> None:
    """The sight of its last life is 45 s old (a drain of thousands of sessions)."""
    since = None if lease_ago is None else NOW - lease_ago * S
    sight = GatewaySight("gw-1", NOW - 45 * S, None, known_since=NOW - 3600 * S)
    change = sight_change(sight, NOW, RULES)
    assert change == SightChange("gw-1", True, 45 * S, "no-flush")
    assert restarting(change, since, after_drain, earlier, NOW, RULES) is not said
    seeing_again = SightChange("gw-1", False, 1 * S)
    assert not restarting(seeing_again, since, after_drain, earlier, NOW, RULES)
