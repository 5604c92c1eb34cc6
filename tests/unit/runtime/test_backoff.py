"""One back-off, tenacity's: `Patience` (every wait for a server, a loop's outage) waits
as it always did — at the n-th failure in a row uniformly in [c/2, c], c = min(cap,
base·2ⁿ) — computed by tenacity's strategies, as the consumer's batch retries are."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tenacity.wait import wait_base

from workers.runtime.base.waiting import Patience, backoff, waited

log = logging.getLogger(__name__)


def test_patience_backs_off_by_a_tenacity_strategy() -> None:
    patience = Patience("x", log, base=0.5, cap=5.0)
    assert isinstance(patience.backoff, wait_base)


@given(
    base=st.floats(0.01, 2.0),
    cap=st.floats(0.5, 60.0),
    failures=st.integers(1, 200),
)
def test_the_nth_wait_is_between_half_its_ceiling_and_it(
    base: float, cap: float, failures: int
) -> None:
    ceiling = min(cap, base * 2.0**failures)
    wait = waited(backoff(base, cap), failures)
    assert ceiling / 2 - 1e-9 <= wait <= ceiling + 1e-9


@pytest.mark.parametrize("failures", [1, 3, 8])
def test_the_waits_are_jittered_over_the_whole_half(failures: int) -> None:
    strategy = backoff(0.2, 5.0)
    ceiling = min(5.0, 0.2 * 2**failures)
    draws = [waited(strategy, failures) for _ in range(2000)]
    assert min(draws) < ceiling * 0.55 and max(draws) > ceiling * 0.95  # not one value


def test_patience_counts_and_waits_and_starts_over_after_a_success() -> None:
    patience = Patience("x", log, base=0.2, cap=5.0)
    waits = [patience.failed(TimeoutError(), quiet=True) for _ in range(8)]
    for n, wait in enumerate(waits, start=1):
        ceiling = min(5.0, 0.2 * 2**n)
        assert ceiling / 2 <= wait <= ceiling
    assert patience.failures == 8
    patience.succeeded()
    assert 0.2 <= patience.failed(TimeoutError(), quiet=True) <= 0.4  # from the start again
