"""The quarantine enforcer's pure rules: counting alternations in a window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.quarantine.decide import Counter, Limits, count, serials_to_revoke

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
