"""Who a quarantine is blamed on, and its breaker charged to (issue #59, item 12): the
gateway its window's first recorded duplicate came through, not the one whose Hello
completed the count; and what the quarantine reads its count from (the record)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from schemas.facts import Hello
from tests.factories import hello
from workers.quarantine import apply, record
from workers.quarantine.decide import Alternation, Limits, blamed, judge, to_act_on, window_of

T0 = datetime(2026, 12, 5, tzinfo=UTC)


def _alternations(gateways: list[str | None]) -> list[Alternation]:
    return [
        Alternation(epoch, T0 + timedelta(seconds=epoch), gateway)
        for epoch, gateway in enumerate(gateways, start=2)
    ]


def test_a_clones_count_completed_by_the_honest_reconnect_is_the_clones_gateways() -> None:
    """n1 lives at gw-h; its clone dials gw-a (a duplicate), n1's daemon dials gw-h again (a
    duplicate, the clone live), and so on: the fourth, gw-h's, completes the count. The
    quarantine is the clone's gateway's, whichever order the batch gave them in."""
    alternations = _alternations(["gw-a", "gw-h", "gw-a", "gw-h"])
    judged, _ = judge(reversed(alternations), Limits())
    act = to_act_on(judged, 0, [5])
    assert act is not None and act[0].epoch == 5
    window = window_of(alternations, act[0])
    assert blamed(list(reversed(window)), "gw-h") == "gw-a"


def test_a_window_without_a_recorded_gateway_is_the_completing_ones() -> None:
    assert blamed(_alternations([None, "gw-h"]), "gw-h") == "gw-h"
    assert blamed([], "gw-x") == "gw-x"


@given(st.lists(st.sampled_from(["gw-1", "gw-2", "gw-3"]), min_size=1, max_size=8))
def test_the_blamed_gateway_is_one_the_window_came_through_its_first(
    gateways: list[str],
) -> None:
    window = _alternations(list(gateways))
    assert blamed(window, "gw-completing") == gateways[0]
    assert blamed(window[::-1], "gw-completing") == gateways[0]  # in any order


def _hello(duplicate: bool | None, proven: bool | None = None, live: bool = False) -> Hello:
    return hello(
        "n1",
        3,
        duplicate=duplicate,
        proven=proven,
        previous={"epoch": 2, "boot_id": "other", "live": live},
    )


def test_the_quarantine_reads_every_hello_and_counts_what_the_record_says() -> None:
    """At decode, every Hello is the quarantine's (its record decides, `record.recorded`):
    one saying "no duplicate" is not ignored for it. Once read as its transaction recorded
    it, a duplicate or a takeover attempt counts, and nothing else."""
    for fact in (_hello(False), _hello(None), _hello(True), _hello(False, proven=True)):
        assert apply.wants(fact)
    assert apply.counts(_hello(True)) and apply.counts(_hello(False, proven=False))
    assert not apply.counts(_hello(False)) and not apply.counts(_hello(False, proven=True))
    # what a fact says of itself, let through only where its epoch has no judgement recorded
    assert record.says(_hello(None, live=True)) and record.says(_hello(False, proven=False))
    assert not record.says(_hello(False, live=True))
