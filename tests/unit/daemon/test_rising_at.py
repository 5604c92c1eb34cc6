"""The fake daemon's proof `at` rises (issue #59, item 3; migration 0059): a plain proof
holds only after the newest `at` the control plane took, so two Hellos never sign one
second — its `at` is its clock, or the last it signed + 1 if that is later."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from workers.sim.servertime import ServerTime


@given(st.lists(st.floats(min_value=0, max_value=2e9), min_size=1, max_size=50))
def test_each_at_is_later_than_the_last_and_never_before_the_clock(clocks: list[float]) -> None:
    server = ServerTime()
    signed = [server.sign_at(clock) for clock in clocks]
    assert all(b > a for a, b in pairwise(signed))
    assert all(at >= int(clock) for at, clock in zip(signed, clocks, strict=True))
    # never further ahead of the clock than the Hellos beyond one per second
    assert all(at - int(max(clocks[: i + 1])) <= i for i, at in enumerate(signed))


def test_two_hellos_in_one_second_sign_two_seconds_and_the_clock_catches_up() -> None:
    server = ServerTime()
    assert [server.sign_at(100.2), server.sign_at(100.7), server.sign_at(100.9)] == [100, 101, 102]
    assert server.sign_at(105.0) == 105  # its clock again, once it slowed down


def test_a_challenge_a_gateway_told_never_moves_it() -> None:
    """A refusal's challenge at a time a day ahead (a gateway may hand any `srv-…` nonce):
    signed once, and its next plain proof is at its own clock still — never at a time a
    gateway told it, with a nonce of its own."""
    server = ServerTime()
    assert server.sign_at(90.0) == 90
    server.refused("gw-1", 90.0 + 86400, "srv-" + "0" * 16 + "-" + "0" * 40, 90.0)
    assert server.take_challenge("gw-1", 90.5) is not None
    assert server.sign_at(90.5) == 91
