"""The liveness worker's lock order as a rule (`workers/liveness/lastsight/locks.py`):
which locks break it, and which statements wait. Pure; the statements themselves are
watched in tests/integration/workers/liveness/test_lock_order.py."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.liveness import apply, ranges, sight, sweep
from workers.liveness.lastsight import rows
from workers.liveness.lastsight.locks import (
    LOCK_ORDER,
    RANGES,
    SESSIONS,
    SIGHTS,
    SWEEP_STATE,
    out_of_order,
    waits,
)


@pytest.mark.parametrize(
    ("taken", "wrong"),
    [
        ([], []),
        ([(RANGES, True), (SESSIONS, True), (SESSIONS, True), (SIGHTS, True)], []),  # a flush
        ([(SWEEP_STATE, True), (SIGHTS, True), (SESSIONS, False), (RANGES, False)], []),  # a sweep
        ([(SIGHTS, True), (RANGES, True)], [1]),  # a flush's sight rows first: a cycle
        ([(SIGHTS, True), (SESSIONS, True), (RANGES, False), (SESSIONS, True)], [1, 3]),
        ([(SESSIONS, True), (SWEEP_STATE, True)], [1]),
    ],
)
def test_a_lock_waited_for_behind_a_later_table_breaks_the_order(
    taken: list[tuple[str, bool]], wrong: list[int]
) -> None:
    assert out_of_order(taken) == wrong


@given(st.lists(st.tuples(st.sampled_from(LOCK_ORDER), st.booleans())))
def test_locks_taken_in_the_order_or_without_waiting_keep_it(
    taken: list[tuple[str, bool]],
) -> None:
    assert out_of_order(sorted(taken, key=lambda lock: LOCK_ORDER.index(lock[0]))) == []
    assert out_of_order([(table, False) for table, _ in taken]) == []
    places = [LOCK_ORDER.index(table) for table, _ in taken]
    if any(a > b for a, b in itertools.pairwise(places)):
        assert out_of_order([(table, True) for table, _ in taken]) != []


def test_the_statements_that_lock_behind_a_later_table_do_not_wait() -> None:
    """The sweep's reads of range rows and session rows skip what a flush holds; the
    flush's first pass skips too, and its redo waits, in node order."""
    for statement in (ranges.STALE_RANGED, sweep.GATEWAY_LOST, sweep.STALE, rows.FLUSH_SKIPPING):
        assert not waits(statement)
    for statement in (rows.FLUSH_WAITING, apply.CLOSING, sight.OVERLAPPED, sight.WRITE_SESSIONS):
        assert waits(statement)
