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
from workers.liveness.decide import (
    GatewaySight,
    Rules,
    SightChange,
    behind,
    covered_at,
    remainders,
    seen_at,
    sees,
    sight_change,
)

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
RULES = Rules()
S = timedelta(seconds=1)


def test_a_gateway_gone_blind_while_the_controller_is_behind_is_blind_for_lag() -> None:
    sight = GatewaySight("gw-1", NOW - 31 * S, None)
    assert sight_change(sight, NOW, RULES, lagging=True) == SightChange("gw-1", True, 31 * S, "lag")
    seeing_again = GatewaySight("gw-1", NOW - 1 * S, NOW - 9 * S)
    assert sight_change(seeing_again, NOW, RULES, lagging=True) == SightChange("gw-1", False, 1 * S)


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
        "gw-1", NOW - 1 * S, None, ranges=((0, HASH_SPACE, NOW - 3600 * S),),
        whole_flush_at=NOW - 1 * S,
    )  # fmt: skip
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
