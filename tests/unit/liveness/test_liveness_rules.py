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

from schemas.facts import (
    HASH_SPACE,
    Closed,
    CloseReason,
    Liveness,
    LivenessEntry,
    NodeLoad,
    newest_per_node,
    node_hash,
)
from tests.factories import hello, make_fact
from workers.gateway.facts import (
    MAX_FLUSH_BYTES,
    MAX_FLUSH_ENTRIES,
    RANGE_SESSIONS,
    range_bits,
    range_cut,
)
from workers.liveness.apply import credits_json, node_load_json
from workers.liveness.decide import (
    BreakerDecision,
    BreakerView,
    Rules,
    SweepState,
    closes_its_row,
    connected,
    decide_breaker,
    newest_ranges,
    plan_sweep,
)
from workers.liveness.ranges import sightings

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
        "n1",
        4,
        boot_id="b2",
        journal_id="j1",
        previous={
            "epoch": 3,
            "gateway_id": "gw-0",
            "boot_id": "b1",
            "journal_id": "j0",
            "live": True,
        },
    )
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
    ids=[
        "one",
        "under-minimum",
        "at-the-minimum",
        "minimum-over-half",
        "half",
        "over-half",
        "30-of-40",
        "stays-open",
        "released",
        "fell-back",
        "nothing-left",
    ],
)
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


@st.composite
def _flush_sessions(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Sessions' hashes (sorted; clustered sometimes, equal sometimes) and entry sizes."""
    spread = draw(st.sampled_from([HASH_SPACE, 2**20, 16]))
    base = draw(st.integers(0, HASH_SPACE - spread))
    hashes = sorted(draw(st.lists(st.integers(base, base + spread - 1), max_size=300)))
    sizes = draw(st.lists(st.integers(0, 3_000), min_size=len(hashes), max_size=len(hashes)))
    return hashes, sizes


@given(_flush_sessions(), st.integers(1, 20_000), st.integers(0, 6))
def test_a_flush_is_cut_by_ranges_of_node_hashes_each_under_the_byte_budget(
    sessions: tuple[list[int], list[int]], budget: int, bits: int
) -> None:
    """The reference gateway's flush facts: ranges that tile the hash space in order,
    every one of the 2**bits equal ranges a fact or halves of one (empty ones too); every
    session once, in the range of its hash; each fact within the budget and its entry
    count unless its range is one hash wide; a range halved only when it did not fit."""
    hashes, sizes = sessions
    cut = range_cut(hashes, sizes, bits, budget)
    assert cut[0][0] == 0 and cut[-1][1] == HASH_SPACE
    assert all(a[1] == b[0] and a[3] == b[2] for a, b in itertools.pairwise(cut))
    assert cut[0][2] == 0 and cut[-1][3] == len(hashes)
    width = HASH_SPACE >> bits
    for start, end, lo, hi in cut:
        assert all(start <= h < end for h in hashes[lo:hi])
        # within one of the equal ranges, a power-of-two part of it
        assert start // width == (end - 1) // width and width % (end - start) == 0
        used = sum(size + 1 for size in sizes[lo:hi])
        assert (used <= budget and hi - lo <= MAX_FLUSH_ENTRIES) or end - start == 1
        if end - start < width:  # halved: the range it was half of did not fit
            parent = end - start
            whole = (start // (2 * parent)) * 2 * parent
            inside = [i for i, h in enumerate(hashes) if whole <= h < whole + 2 * parent]
            assert sum(sizes[i] + 1 for i in inside) > budget or len(inside) > MAX_FLUSH_ENTRIES
    assert len(cut) >= 2**bits


@given(st.integers(0, 200_000), st.integers(0, 12))
def test_the_ranges_grow_at_once_and_shrink_late(sessions: int, previous: int) -> None:
    """As many ranges as keep `RANGE_SESSIONS` a range, at once; fewer only once the
    sessions fall to a quarter of what the ranges hold — and the answer is its own next."""
    bits = range_bits(sessions, previous)
    assert sessions <= RANGE_SESSIONS << bits  # they fit
    if bits > previous:  # grown: no fewer would do
        assert sessions > RANGE_SESSIONS << (bits - 1)
    elif bits < previous:  # shrunk: a quarter or less of what one more bit would hold
        assert sessions <= (RANGE_SESSIONS << (bits + 1)) // 4
        assert bits == 0 or sessions > (RANGE_SESSIONS << bits) // 4
    assert range_bits(sessions, bits) == bits


@st.composite
def _range_facts(draw: st.DrawFn) -> list[tuple[Liveness, int]]:
    """Range facts of two gateways, cut at several widths, at distinct stream sequences."""
    facts = []
    seqs = draw(st.lists(st.integers(1, 10**6), min_size=0, max_size=12, unique=True))
    for seq in seqs:
        bits = draw(st.integers(0, 3))
        width = HASH_SPACE >> bits
        start = draw(st.integers(0, 2**bits - 1)) * width
        fact = make_fact(
            "liveness",
            gateway_id=draw(st.sampled_from(["gw-1", "gw-2"])),
            entries=[],
            range_start=start,
            range_end=start + width,
        )
        assert isinstance(fact, Liveness)
        facts.append((fact, seq))
    return facts


def _overlap(a: Liveness, b: Liveness) -> bool:
    return a.gateway_id == b.gateway_id and bool(
        a.range_start < b.range_end and b.range_start < a.range_end  # type: ignore[operator]
    )


@given(_range_facts())
def test_of_a_batchs_range_facts_the_newest_cut_wins_where_ranges_overlap(
    facts: list[tuple[Liveness, int]],
) -> None:
    """No two kept facts of a gateway overlap; a fact is dropped only for a kept fact of
    its gateway, published later, that overlaps it; kept in gateway and range order."""
    kept = newest_ranges(facts)
    assert all(not _overlap(a, b) for (a, _), (b, _) in itertools.combinations(kept, 2))
    assert [(f.gateway_id, f.range_start) for f, _ in kept] == sorted(
        (f.gateway_id, f.range_start)
        for f, _ in kept  # type: ignore[misc]
    )
    for fact, seq in facts:
        if (fact, seq) not in kept:
            assert any(_overlap(fact, k) and later > seq for k, later in kept)
    # a fact without a range is not a range fact
    plain = make_fact("liveness", entries=[])
    assert isinstance(plain, Liveness) and newest_ranges([(plain, 1)]) == []


def test_a_gateway_at_its_stream_bound_flushes_under_what_nats_carries() -> None:
    """5,000 sessions (the maxStreams default) whose heartbeats carry credits and load:
    ~200 bytes an entry, more than 1 MiB in one fact; 8 ranges, none halved."""
    entry = len(b'{"node_id":"7c9e6679-7425-40de-944b-e07fc1f90ae7","epoch":1,"age_ms":9999}') + 150
    hashes = sorted(node_hash(f"node-{i}") for i in range(5_000))
    cut = range_cut(hashes, [entry] * 5_000, range_bits(5_000, 0))
    assert entry * 5_000 > 2**20 and len(cut) == 8
    assert all((hi - lo) * (entry + 1) <= MAX_FLUSH_BYTES for _, _, lo, hi in cut)


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


@given(
    st.lists(
        st.tuples(
            st.text(max_size=20),
            st.integers(1, 2**63 - 1),
            st.integers(0, 10**12),
            st.none() | st.dictionaries(st.text(max_size=8), st.integers(0, 2**31 - 1)),
        ),
        max_size=20,
    )
)
def test_a_range_rows_sightings_are_the_json_of_each_entrys_node_epoch_age_and_credits(
    entries: list[tuple[str, int, int, dict[str, int] | None]],
) -> None:
    """`[node_id, epoch, age_ms]`, and the credits after them when the entry has some
    (an entry without, or with `credits: None`, has none)."""
    given: list[LivenessEntry] = [
        {"node_id": n, "epoch": e, "age_ms": a, "credits": c, "load": 0.5} for n, e, a, c in entries
    ]
    assert json.loads(sightings(given)) == [
        [n, e, a] if c is None else [n, e, a, c] for n, e, a, c in entries
    ]
