"""An honest daemon on a link that drops every session at once never meets the bound on
Hellos per node and minute (`store.HELLOS_PER_NODE_MINUTE`, issue #59): its full-jitter
redial (0 to 2 s after a Welcome) makes 60 Hellos a minute on average, 120 read from attempt
0 (0 to 1 s)."""

from __future__ import annotations

import random
from collections import deque

from workers.gateway import Welcome
from workers.gateway.store import HELLOS_PER_NODE_MINUTE
from workers.sim.daemon import FakeDaemon


class Flapping:
    """A gateway that welcomes every Hello; the link then drops the session at once."""

    gateway_id = "gw-1"
    alive = True

    def __init__(self, now: list[float]) -> None:
        self.now = now
        self.hellos = 0

    async def hello(self, request: object, stream: object) -> Welcome:
        self.hellos += 1
        return Welcome(self.hellos, "s", False, server_time=self.now[0])


async def test_a_flapping_link_stays_under_the_hello_bound() -> None:
    busiest = 0
    for seed in range(20):
        now = [1_000_000.0]
        gateway = Flapping(now)
        fake = FakeDaemon("n1", "s1", lambda now=now: now[0], random.Random(seed))
        window: deque[float] = deque()
        while now[0] < 1_000_000.0 + 1200:  # 20 minutes of it
            await fake.tick([gateway])  # type: ignore[list-item]
            if fake.gateway is not None:  # welcomed: the link drops the session at once
                window.append(now[0])
                while window[0] <= now[0] - 60:
                    window.popleft()
                busiest = max(busiest, len(window))
                fake.drop("the link went")
            now[0] = max(now[0], fake.next_try)
    assert 40 < busiest < HELLOS_PER_NODE_MINUTE, busiest
    print(f"\nthe busiest minute of 20 flapping links: {busiest} Hellos")


def test_a_flapping_link_whose_attempts_count_from_zero_stays_under_the_bound_too() -> None:
    """The seed's "attempt n waits 0 to min(60 s, 1 s x 2^n)" read from n = 0 after a
    Welcome: a redial every 0 to 1 s, 120 a minute on average — under the bound (240)."""
    busiest = 0
    for seed in range(20):
        rng, at, window = random.Random(seed), 0.0, deque[float]()
        while at < 1200:
            at += rng.uniform(0.0, 1.0)
            window.append(at)
            while window[0] <= at - 60:
                window.popleft()
            busiest = max(busiest, len(window))
    assert 100 < busiest < HELLOS_PER_NODE_MINUTE, busiest
