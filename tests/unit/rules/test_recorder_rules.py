"""The recorder's pure rules: status reports never move anything backwards, never pair an
approver set with a newer trust version than its own, and never claim a generation the
node was not given; a former holder's events take no seq the journal has not reached;
event acks count the contiguous run."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import Status
from tests.factories import make_fact
from workers.recorder.decide import (
    StoredStatus,
    apply_reports,
    counted_status,
    event_bound,
    events_within,
    highest_contiguous,
    unique_events,
)

EMPTY = StoredStatus(0, 0, None, None)


def digest(version: int) -> str:
    return f"{version:064x}"


def report(
    generation: int = 0,
    trust: int = 0,
    approver: str | object | None = ...,
    epoch: int | None = None,
) -> Status:
    fields: dict[str, Any] = {"observed_generation": generation, "trust_version": trust}
    if approver is ...:  # the set that goes with this trust version
        fields.update(
            approver_set_epoch=trust, approver_set_sha256=digest(trust) if trust else None
        )
    else:
        fields.update(approver_set_epoch=epoch, approver_set_sha256=approver)
    fact = make_fact("status", **fields)
    assert isinstance(fact, Status)
    return fact


reports = st.lists(
    st.builds(report, st.integers(0, 50), st.integers(0, 12)), min_size=1, max_size=8
)


@given(reports, st.randoms())
def test_order_never_matters_for_the_outcome(batch: list[Status], rnd: Any) -> None:
    shuffled = list(batch)
    rnd.shuffle(shuffled)
    assert apply_reports(EMPTY, batch) == apply_reports(EMPTY, shuffled)


@given(reports)
def test_nothing_moves_backwards_and_sets_pair_with_their_own_version(batch: list[Status]) -> None:
    stored = EMPTY
    for one in batch:
        after = apply_reports(stored, [one])
        assert after.observed_generation >= stored.observed_generation
        assert after.trust_version >= stored.trust_version
        stored = after
    top = max(r.trust_version for r in batch)
    assert stored.observed_generation == max(r.observed_generation for r in batch)
    assert stored.trust_version == top
    if top:
        assert (stored.approver_set_epoch, stored.approver_set_sha256) == (top, digest(top))


def test_a_late_older_report_does_not_pair_its_set_with_the_newer_version() -> None:
    newer, older = report(5, 7), report(4, 6)
    after = apply_reports(EMPTY, [newer, older])
    assert after == StoredStatus(5, 7, 7, digest(7))


def test_a_report_with_version_zero_changes_neither_version_nor_set() -> None:
    stored = StoredStatus(3, 7, 7, digest(7))
    after = apply_reports(stored, [report(9, 0, approver=digest(1), epoch=1)])
    assert after == StoredStatus(9, 7, 7, digest(7))


def test_an_empty_digest_clears_both_columns() -> None:
    stored = StoredStatus(3, 7, 7, digest(7))
    assert apply_reports(stored, [report(3, 7, approver="", epoch=9)]) == StoredStatus(
        3, 7, None, None
    )


def test_no_digest_leaves_the_set() -> None:
    stored = StoredStatus(3, 7, 7, digest(7))
    assert apply_reports(stored, [report(3, 8, approver=None)]) == StoredStatus(3, 8, 7, digest(7))


@pytest.mark.parametrize(
    ("base", "stored", "expected"),
    [
        (0, [], 0),
        (0, [1, 2, 3], 3),
        (0, [1, 2, 4, 5], 2),
        (0, [2, 3], 0),
        (5, [6, 7, 9], 7),
        (5, [3, 4, 6], 6),
    ],
)
def test_highest_contiguous(base: int, stored: list[int], expected: int) -> None:
    assert highest_contiguous(base, stored) == expected


@given(st.integers(0, 20), st.sets(st.integers(1, 40)))
def test_highest_contiguous_is_a_gapless_run(base: int, stored: set[int]) -> None:
    n = highest_contiguous(base, stored)
    assert all(s in stored for s in range(base + 1, n + 1)) and n + 1 not in stored


def test_unique_events_keeps_the_first_copy_of_each_seq() -> None:
    def events(seqs: list[int], kind: str) -> Any:
        return make_fact(
            "events",
            events=[
                {"seq": s, "kind": kind, "body": {}, "at": "2026-11-30T00:00:00Z"} for s in seqs
            ],
        )

    out = unique_events([events([1, 2], "a"), events([2, 3], "b")])
    assert {seq: e.kind for seq, e in out[("node-1", "journal-1")].items()} == {
        1: "a",
        2: "a",
        3: "b",
    }
    assert list(itertools.chain(out)) == [("node-1", "journal-1")]


@pytest.mark.parametrize(
    ("session", "fact", "acked", "highest", "bound"),
    [
        (("gw-1", "j1"), ("gw-1", "j1"), 5, None, None),  # the holder of now: any seq
        (("gw-2", "j1"), ("gw-1", "j1"), 5, None, 5),  # a former holder of the journal of now
        ((None, "j1"), ("gw-1", "j1"), 5, None, 5),  # the session closed: nobody holds it now
        (("gw-2", "j2"), ("gw-1", "j1"), 0, 9, 9),  # an older journal: up to its end
        (("gw-2", "j2"), ("gw-1", "j1"), 0, None, 0),  # nothing stored on it: nothing
        (("gw-1", "j2"), ("gw-1", "j1"), 3, 4, 4),  # its gateway of now, another journal
    ],
)
def test_a_former_holders_events_stop_where_the_journal_stood_without_it(
    session: tuple[str | None, str],
    fact: tuple[str, str],
    acked: int,
    highest: int | None,
    bound: int | None,
) -> None:
    assert event_bound(*session, acked, *fact, highest) == bound


@given(
    st.one_of(st.none(), st.integers(0, 30)), st.lists(st.integers(1, 40), min_size=1, max_size=8)
)
def test_events_within_a_bound_are_exactly_those_at_or_below_it(
    bound: int | None, seqs: list[int]
) -> None:
    fact = make_fact(
        "events",
        events=[{"seq": s, "kind": "k", "body": {}, "at": "2026-11-30T00:00:00Z"} for s in seqs],
    )
    kept = [e.seq for e in events_within(fact, bound)]
    assert kept == [s for s in seqs if bound is None or s <= bound]


@given(
    generation=st.integers(0, 20),
    spec=st.integers(0, 20),
    current=st.booleans(),
    trust=st.integers(0, 9),
    stored=st.builds(StoredStatus, st.integers(0, 20), st.integers(0, 9), st.none(), st.none()),
)
def test_a_status_never_claims_a_generation_above_the_spec_and_only_now_moves_trust(
    generation: int, spec: int, current: bool, trust: int, stored: StoredStatus
) -> None:
    counted = counted_status(report(generation, trust), current, spec)
    if generation > spec or not current:
        assert counted is None  # a generation never given; an earlier session's word
        return
    assert counted is not None
    after = apply_reports(stored, [counted])
    assert after.observed_generation == max(stored.observed_generation, generation)
    assert after.trust_version == max(stored.trust_version, trust)
