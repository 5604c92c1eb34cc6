"""The fake daemon's reconnect rules, against a scripted gateway (no servers needed: what
is under test is the daemon's arithmetic, not the gateway)."""

from __future__ import annotations

import random
from typing import Any

from workers.gateway import Code, HelloRequest, Refused, Welcome
from workers.sim.daemon import MAX_PUSHBACK, FakeDaemon


class Scripted:
    """A gateway that answers each Hello with the next of its answers."""

    def __init__(self, *answers: Refused | Welcome) -> None:
        self.answers = list(answers)
        self.alive = True
        self.hellos: list[HelloRequest] = []

    async def hello(self, request: HelloRequest, stream: Any) -> Welcome:
        self.hellos.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Refused):
            raise answer
        return answer


def daemon(now: list[float]) -> FakeDaemon:
    return FakeDaemon("n1", "s1", lambda: now[0], random.Random(7))


async def test_pushback_is_honoured_up_to_15_minutes() -> None:
    now = [1000.0]
    fake = daemon(now)
    gateway = Scripted(
        Refused(Code.RESOURCE_EXHAUSTED, "busy", retry_after=30.0),
        Refused(Code.RESOURCE_EXHAUSTED, "busy", retry_after=86_400.0),
    )
    await fake.tick([gateway])  # type: ignore[list-item]
    assert fake.next_try == now[0] + 30.0
    now[0] = fake.next_try
    await fake.tick([gateway])  # type: ignore[list-item]
    assert fake.next_try == now[0] + MAX_PUSHBACK == now[0] + 900.0
    assert fake.refusals == {"RESOURCE_EXHAUSTED": 2}


async def test_the_back_off_grows_with_failures_and_a_welcome_resets_it() -> None:
    now = [1000.0]
    fake = daemon(now)
    refusal = Refused(Code.UNAVAILABLE, "gone")
    gateway = Scripted(refusal, refusal, refusal, Welcome(1, "s", False, server_time=now[0]))
    for failures in (1, 2, 3):
        await fake.tick([gateway])  # type: ignore[list-item]
        assert fake.failures == failures
        assert now[0] <= fake.next_try <= now[0] + min(60.0, 2.0**failures)  # full jitter
        now[0] = fake.next_try
    await fake.tick([gateway])  # type: ignore[list-item]
    assert fake.gateway is gateway and fake.epoch == 1  # type: ignore[comparison-overlap]
    assert fake.failures == 0  # the next loss starts from 1 s again
