"""Which rule binds each fact type to its gateway, the once-a-minute foreign log, and how
long a confirmed binding is remembered."""

from __future__ import annotations

import logging

import pytest

from schemas.facts import Fact
from tests.factories import WIRE_SAMPLES, hello, make_fact
from workers.runtime.effects.provenance import (
    FENCES,
    Binding,
    ForeignLog,
    KnownBindings,
    as_recorded,
    binding,
)

EXPECTED = {
    "hello": Binding.HELLO,
    "closed": Binding.EPOCH,
    "progress": Binding.EPOCH,
    "rejected": Binding.EPOCH,
    "result": Binding.EPOCH,  # and, in its write, the command's epoch
    "status": Binding.EPOCH,  # and, in its write, the session of now
    "events": Binding.JOURNAL,
    "liveness": None,  # each entry is fenced on node, epoch and gateway in SQL
}


@pytest.mark.parametrize("bc_type", sorted(t for t in WIRE_SAMPLES if t in EXPECTED))
def test_each_fact_type_has_its_rule(bc_type: str) -> None:
    assert binding(make_fact(bc_type)) is EXPECTED[bc_type]


def test_every_fact_type_is_covered() -> None:
    facts = {name for name, sample in WIRE_SAMPLES.items() if "fact_id" in sample}
    assert facts == set(EXPECTED)
    assert {kind.BC_TYPE for kind in FENCES} == facts  # the one table names each of them


def _fact(gateway: str) -> Fact:
    return make_fact("hello", gateway_id=gateway)


def test_the_foreign_log_speaks_once_per_gateway_and_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said = ForeignLog(logging.getLogger("t"), "labeler", every=60.0)
    with caplog.at_level(logging.WARNING, logger="t"):
        assert said.saw(_fact("gw-b"), now=0.0)
        assert not said.saw(_fact("gw-b"), now=30.0)
        assert not said.saw(_fact("gw-b"), now=59.0)
        assert said.saw(_fact("gw-x"), now=59.5)  # another gateway has its own minute
        assert said.saw(_fact("gw-b"), now=60.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "ignored 1 fact(s) from gateway gw-b" in lines[0]
    assert "ignored 3 fact(s) from gateway gw-b" in lines[2]  # the two held back, and this one


def test_known_bindings_hold_for_their_time_and_start_afresh_when_full() -> None:
    known = KnownBindings(ttl=10.0, size=3)
    a, b, c = ((0, n, "gw-1", 1, None) for n in ("n1", "n2", "n3"))
    known.confirmed([a, b], now=100.0)
    assert known.holds(a, 109.9) and known.holds(b, 100.0)
    assert not known.holds(a, 110.0) and not known.holds(c, 100.0)
    known.confirmed([c], now=101.0)  # three: still room
    assert known.holds(a, 101.0) and known.holds(c, 101.0)
    known.confirmed([(1, "n1", "gw-1", 1, None)], now=102.0)  # a fourth: afresh
    assert not known.holds(a, 102.0) and known.holds((1, "n1", "gw-1", 1, None), 102.0)


def test_known_bindings_past_their_time_are_dropped_once_a_ttl() -> None:
    """Epochs come and go (each Hello raises one): a binding of an old one is dropped with
    the next confirmation a ttl after the last drop, not kept until the whole is full."""
    known = KnownBindings(ttl=10.0, size=1000)
    known.confirmed([(0, f"n{i}", "gw-1", 1, None) for i in range(100)], now=0.0)
    known.confirmed([(0, f"n{i}", "gw-1", 2, None) for i in range(50)], now=5.0)
    assert len(known) == 150  # within a ttl of the last drop: nothing dropped
    known.confirmed([(0, "n0", "gw-1", 3, None)], now=12.0)  # epoch 1's expired at 10
    assert len(known) == 51 and not known.holds((0, "n1", "gw-1", 1, None), 12.0)
    assert known.holds((0, "n1", "gw-1", 2, None), 12.0)  # until 15
    known.confirmed([(0, "n0", "gw-1", 4, None)], now=21.9)  # a ttl since 12: not yet
    assert len(known) == 52
    known.confirmed([(0, "n0", "gw-1", 5, None)], now=22.0)
    assert len(known) == 2  # epochs 4 and 5 of n0, confirmed in the last ttl


def test_a_gateway_is_shed_only_for_the_type_it_floods_and_only_for_a_window() -> None:
    from workers.runtime.effects.shedding import Shedder

    shedder = Shedder("liveness", threshold=3, window=10.0)
    closed = make_fact("closed", gateway_id="gw-1")
    for _ in range(3):
        shedder.saw(closed, now=100.0)
    assert not shedder.shedding  # at the threshold: not yet
    shedder.saw(closed, now=101.0)
    assert shedder.sheds(("gw-1", "closed"), now=101.0)
    assert not shedder.sheds(("gw-1", "liveness"), now=101.0)  # its flushes still go through
    assert not shedder.sheds(("gw-2", "closed"), now=101.0)  # nor another gateway's
    assert shedder.sheds(("gw-1", "closed"), now=110.9)
    assert not shedder.sheds(("gw-1", "closed"), now=111.0)  # the window is over
    assert not shedder.shedding
    # a new window counts afresh: a few foreign facts a window shed nothing
    for t in (120.0, 125.0, 131.0, 135.0):
        shedder.saw(closed, now=t)
    assert not shedder.shedding


def test_a_gateways_stale_facts_are_shed_past_their_own_threshold_but_never_its_hellos() -> None:
    """Facts for epochs a gateway no longer holds (issue 59) count against a threshold of
    their own, apart from its foreign ones; a stale Hello (superseded by its node's next
    one) never counts."""
    from workers.runtime.effects.shedding import Shedder

    shedder = Shedder("liveness", threshold=3, window=10.0, stale_threshold=5)
    closed = make_fact("closed", gateway_id="gw-1")
    for _ in range(3):
        shedder.saw(closed, now=100.0)  # three foreign: at their threshold
    for _ in range(5):
        shedder.saw(closed, now=100.0, stale=True)  # five stale: at theirs
    assert not shedder.shedding  # each kind counted apart
    hello = make_fact("hello", gateway_id="gw-1")
    for _ in range(100):
        shedder.saw(hello, now=100.0, stale=True)
    assert not shedder.sheds(("gw-1", "hello"), now=100.0)
    shedder.saw(closed, now=101.0, stale=True)
    assert shedder.sheds(("gw-1", "closed"), now=101.0)
    assert not shedder.sheds(("gw-2", "closed"), now=101.0)
    assert not shedder.sheds(("gw-1", "liveness"), now=101.0)


def _recorded(**row: object) -> dict[str, object]:
    base = {
        "previous_epoch": 1,
        "previous_gateway_id": "gw-1",
        "previous_boot_id": "boot-a",
        "previous_journal_id": "journal-1",
        "previous_live": True,
        "proven": None,
        "duplicate": None,
    }
    return {**base, **row}


def test_a_hello_is_as_its_transaction_judged_it_never_as_its_gateway_says() -> None:
    """From migration 0049 the Hello transaction records its judgement of a duplicate
    identity: a keyed node's live session from another boot is no duplicate unless both
    were proven, whatever the boot ids say; a fact saying otherwise changes nothing."""
    said = hello("n1", 2, boot_id="boot-b", duplicate=True, proven=True)
    taken = as_recorded(said, _recorded(proven=False, duplicate=False))
    assert (taken.duplicate_identity, taken.proven) == (False, False)
    taken = as_recorded(hello("n1", 2, boot_id="boot-b"), _recorded(proven=True, duplicate=True))
    assert (taken.duplicate_identity, taken.proven) == (True, True)


@pytest.mark.parametrize(("recorded", "read"), [(True, True), (False, None), (None, None)])
def test_an_epoch_before_0049_is_judged_by_its_boots_and_its_false_read_as_unchecked(
    recorded: bool | None, read: bool | None
) -> None:
    """Before 0049 `proven` false said only "no proof given" (any node, at warn): it is
    read as NULL, never as a takeover attempt."""
    taken = as_recorded(hello("n1", 2, boot_id="boot-b"), _recorded(proven=recorded))
    assert taken.duplicate_identity is True  # a live session from another boot
    assert taken.proven is read
