"""The quarantine enforcer's pure rules: counting alternations in a window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.quarantine.decide import (
    BREAKER,
    ONE_GATEWAY,
    Alternation,
    Breaker,
    Counter,
    Judged,
    Limits,
    count,
    hold_revocation,
    judge,
    proven_window,
    serials_to_revoke,
    to_act_on,
    window_of,
)

T0 = datetime(2026, 11, 30, tzinfo=UTC)
LIMITS = Limits(max_alternations=3, window=timedelta(minutes=10))


def run(offsets_seconds: list[float], limits: Limits = LIMITS) -> list[tuple[int, bool]]:
    counter = Counter()
    out = []
    for offset in offsets_seconds:
        verdict = count(counter, T0 + timedelta(seconds=offset), limits)
        counter = verdict.counter
        out.append((verdict.alternations, verdict.quarantined))
    return out


@pytest.mark.parametrize(
    ("offsets", "expected"),
    [
        pytest.param([0, 60, 120], [(1, False), (2, False), (3, False)], id="three-do-not"),
        pytest.param(
            [0, 60, 120, 180], [(1, False), (2, False), (3, False), (4, True)], id="fourth-does"
        ),
        pytest.param(
            [0, 220, 440, 660],
            [(1, False), (2, False), (3, False), (1, False)],
            id="four-over-11-min",
        ),
        pytest.param(
            [0, 1, 2, 599], [(1, False), (2, False), (3, False), (4, True)], id="fourth-at-9m59"
        ),
        pytest.param(
            [0, 1, 2, 601], [(1, False), (2, False), (3, False), (1, False)], id="fourth-at-10m01"
        ),
        pytest.param(
            [0, 1, 2, 3, 4, 5, 6, 7],
            [
                (1, False),
                (2, False),
                (3, False),
                (4, True),
                (1, False),
                (2, False),
                (3, False),
                (4, True),
            ],
            id="restarts-after-quarantine",
        ),
    ],
)
def test_counting(offsets: list[float], expected: list[tuple[int, bool]]) -> None:
    assert run(offsets) == expected


@given(st.lists(st.floats(0, 3600), max_size=30), st.integers(1, 6), st.integers(1, 1200))
def test_never_quarantines_at_or_under_the_limit_within_a_window(
    gaps: list[float], limit: int, window_s: int
) -> None:
    limits = Limits(limit, timedelta(seconds=window_s))
    offsets, t = [], 0.0
    for gap in gaps:
        t += gap
        offsets.append(t)
    for n, quarantined in run(offsets, limits):
        assert quarantined == (n > limit)
        assert 1 <= n <= limit + 1


@pytest.mark.parametrize(
    ("presented", "live", "expected"),
    [
        ("s2", {"s1", "s2"}, ["s2"]),
        (None, {"s1", "s2"}, ["s1", "s2"]),
        ("unknown", {"s1"}, ["s1"]),
        ("s1", set(), []),
    ],
)
def test_serials_to_revoke(presented: str | None, live: set[str], expected: list[str]) -> None:
    assert serials_to_revoke(presented, live) == expected


def test_a_serial_with_no_record_is_revoked_alone() -> None:
    assert serials_to_revoke("clone", {"s1"}, recorded=False) == ["clone"]
    assert serials_to_revoke(None, {"s1"}, recorded=False) == ["s1"]


# -- as of the Hello: alternations judged in epoch order at their issue times ----------------
GAPS = st.lists(st.integers(min_value=0, max_value=900), min_size=1, max_size=12)


def alternations(gaps: list[int]) -> list[Alternation]:
    """Epochs 1, 2, … issued `gaps` seconds apart (epoch order is issue order)."""
    out, at = [], T0
    for epoch, gap in enumerate(gaps, start=1):
        at += timedelta(seconds=gap)
        out.append(Alternation(epoch, at))
    return out


@given(gaps=GAPS, data=st.data())
def test_judging_ignores_the_order_and_repeats_of_application(
    gaps: list[int], data: st.DataObject
) -> None:
    alts = alternations(gaps)
    applied = data.draw(st.permutations(alts + data.draw(st.lists(st.sampled_from(alts)))))
    assert judge(applied, LIMITS) == judge(alts, LIMITS)


@given(gaps=GAPS)
def test_judging_is_counting_each_at_its_issue_time_in_epoch_order(gaps: list[int]) -> None:
    alts = alternations(gaps)
    judged, _ = judge(alts, LIMITS)
    assert [(judged[a.epoch].number, judged[a.epoch].quarantined) for a in alts] == run(
        [(a.at - T0).total_seconds() for a in alts]
    )


@given(gaps=GAPS)
def test_never_more_than_the_limit_within_a_window_never_quarantines(gaps: list[int]) -> None:
    alts = alternations(gaps)
    crowded = any(
        sum(1 for b in alts if a.at <= b.at <= a.at + LIMITS.window) > LIMITS.max_alternations
        for a in alts
    )
    judged, _ = judge(alts, LIMITS)
    if not crowded:
        assert not any(j.quarantined for j in judged.values())


def test_a_backlog_four_minutes_apart_is_no_burst() -> None:
    judged, counter = judge(alternations([0, 240, 240, 240, 240]), LIMITS)
    assert [(j.number, j.quarantined) for j in judged.values()] == [
        (1, False),
        (2, False),
        (3, False),
        (1, False),
        (2, False),
    ]
    assert counter == Counter(2, T0 + timedelta(minutes=12))


# -- which Hello of a batch acts on a quarantine --------------------------------------------
JUDGED = {
    e: Judged(e, n, q)
    for e, n, q in [(3, 1, False), (4, 2, False), (5, 3, False), (6, 4, True), (9, 4, True)]
}


def test_the_quarantined_epochs_own_hello_acts_on_it() -> None:
    assert to_act_on(JUDGED, acted_up_to=0, epochs=[5, 6, 9]) == (JUDGED[6], 6)


def test_a_late_hello_that_completes_the_count_acts_when_the_epochs_own_is_not_in_the_batch() -> (
    None
):
    assert to_act_on(JUDGED, acted_up_to=0, epochs=[4, 3]) == (JUDGED[6], 4)


def test_the_first_quarantine_not_acted_on_is_the_one() -> None:
    assert to_act_on(JUDGED, acted_up_to=6, epochs=[9]) == (JUDGED[9], 9)
    assert to_act_on(JUDGED, acted_up_to=5, epochs=[9]) == (JUDGED[6], 9)


def test_nothing_to_act_on_when_every_quarantine_was_acted_on_or_none_was_judged() -> None:
    assert to_act_on(JUDGED, acted_up_to=9, epochs=[9]) is None
    assert to_act_on({3: Judged(3, 1, False)}, acted_up_to=0, epochs=[3]) is None


# -- the revocation breaker ----------------------------------------------------------------
LIMITS_OF_BREAKER = Breaker(quarantines=3, window=timedelta(minutes=10), share=0.01)


@pytest.mark.parametrize(
    ("gateways", "recent", "fleet", "expected"),
    [
        pytest.param(["gw-1", "gw-2"], {}, 1000, None, id="two-gateways-first-revokes"),
        pytest.param(["gw-1"], {}, 1000, ONE_GATEWAY, id="one-gateway-alerts-only"),
        pytest.param([], {}, 1000, ONE_GATEWAY, id="no-gateway-known-alerts-only"),
        pytest.param(["gw-1", "gw-2"], {"gw-1": 2}, 1000, None, id="third-of-gateway-revokes"),
        pytest.param(["gw-1", "gw-2"], {"gw-1": 3}, 1000, BREAKER, id="fourth-of-gateway-held"),
        pytest.param(["gw-1", "gw-2"], {"gw-2": 3}, 1000, None, id="other-gateways-count-apart"),
        pytest.param(
            ["gw-1", "gw-2"], {"gw-2": 2, "gw-3": 1}, 100, BREAKER, id="fleet-floor-of-three"
        ),
        pytest.param(
            ["gw-1", "gw-2"], {f"gw-{i}": 2 for i in range(2, 7)}, 1100, None, id="fleet-share-room"
        ),
        pytest.param(
            ["gw-1", "gw-2"],
            {f"gw-{i}": 2 for i in range(2, 7)},
            999,
            BREAKER,
            id="fleet-share-full",
        ),
    ],
)
def test_hold_revocation(
    gateways: list[str], recent: dict[str, int], fleet: int, expected: str | None
) -> None:
    assert hold_revocation(gateways, "gw-1", recent, fleet, LIMITS_OF_BREAKER) == expected


@given(
    gateways=st.lists(st.sampled_from(["gw-1", "gw-2", "gw-3"]), min_size=1, max_size=5),
    recent=st.dictionaries(st.sampled_from(["gw-1", "gw-2", "gw-3"]), st.integers(0, 50)),
    fleet=st.integers(0, 100_000),
)
def test_a_gateway_never_revokes_past_the_breaker(
    gateways: list[str], recent: dict[str, int], fleet: int
) -> None:
    """Whatever the fleet: no revocation at once through one gateway's alternations alone,
    none past a gateway's quota, none past the fleet's."""
    held = hold_revocation(gateways, "gw-1", recent, fleet, LIMITS_OF_BREAKER)
    if held is None:
        assert len(set(gateways)) >= 2
        assert recent.get("gw-1", 0) < LIMITS_OF_BREAKER.quarantines
        limit = LIMITS_OF_BREAKER
        assert sum(recent.values()) < max(limit.quarantines, int(limit.share * fleet))


@pytest.mark.parametrize(
    ("gateways", "recent", "fleet", "expected"),
    [
        pytest.param(["gw-1"], {}, 1000, None, id="one-gateway-revokes"),
        pytest.param([], {}, 1000, None, id="no-gateway-known-revokes"),
        pytest.param(["gw-1"], {"gw-1": 2}, 1000, None, id="its-gateways-third-and-more"),
        pytest.param(["gw-1"], {"gw-1": 3}, 100_000, None, id="no-per-gateway-quota"),
        pytest.param(["gw-1"], {"gw-1": 3}, 100, BREAKER, id="fleet-floor-of-three-held"),
        pytest.param(
            ["gw-1", "gw-2"], {f"gw-{i}": 2 for i in range(2, 7)}, 999, BREAKER, id="fleet-share"
        ),
    ],
)
def test_proven_alternations_revoke_through_any_gateways_up_to_the_fleets_bound(
    gateways: list[str], recent: dict[str, int], fleet: int, expected: str | None
) -> None:
    """No gateway makes up a proven Hello of another boot: a window of proven alternations
    is held only by the fleet-wide bound, never for coming through one gateway or for its
    gateway's quota."""
    assert hold_revocation(gateways, "gw-1", recent, fleet, LIMITS_OF_BREAKER, True) == expected


@given(
    gateways=st.lists(st.sampled_from(["gw-1", "gw-2", "gw-3"]), max_size=5),
    recent=st.dictionaries(st.sampled_from(["gw-1", "gw-2", "gw-3"]), st.integers(0, 50)),
    fleet=st.integers(0, 100_000),
    proven=st.booleans(),
)
def test_the_breaker_holds_only_what_an_unproven_hello_could_make_up_and_the_fleets_bound(
    gateways: list[str], recent: dict[str, int], fleet: int, proven: bool
) -> None:
    held = hold_revocation(gateways, "gw-1", recent, fleet, LIMITS_OF_BREAKER, proven)
    limit = LIMITS_OF_BREAKER
    past_fleet = sum(recent.values()) >= max(limit.quarantines, int(limit.share * fleet))
    if proven:
        assert (held == BREAKER) is past_fleet and held != ONE_GATEWAY
    else:
        unproven = hold_revocation(gateways, "gw-1", recent, fleet, LIMITS_OF_BREAKER)
        assert held == unproven  # the default is unproven
        if held is None:  # what it lets through a proven window lets through too
            assert hold_revocation(gateways, "gw-1", recent, fleet, limit, True) is None


def test_a_window_is_proven_only_when_every_alternation_of_it_is() -> None:
    proven = [Alternation(e, T0, "gw-1", True) for e in (2, 3, 4, 5)]
    assert proven_window(proven)
    assert not proven_window([*proven[:3], Alternation(5, T0, "gw-1", False)])
    assert not proven_window([])


def test_window_of_a_quarantine_is_its_own_and_the_ones_before_it() -> None:
    alternations = [
        Alternation(e, T0 + timedelta(minutes=e), gw)
        for e, gw in [(2, "gw-a"), (3, "gw-b"), (5, "gw-a"), (7, "gw-c"), (9, "gw-b")]
    ]
    assert [a.epoch for a in window_of(alternations, Judged(7, 3, True))] == [3, 5, 7]
    assert [a.epoch for a in window_of(alternations, Judged(2, 1, False))] == [2]
