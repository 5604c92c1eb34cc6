"""The fake daemon's reconnect rules, against a scripted gateway (no servers needed: what
is under test is the daemon's arithmetic, not the gateway)."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.facts import NodeLoad, sanitize
from schemas.notices import Dispatch
from workers.gateway import Code, HeartbeatAck, HelloRequest, Refused, Welcome
from workers.sim.daemon import HEARTBEAT, JOURNAL_MAX, MAX_BACK_OFF, FakeDaemon, _Running
from workers.sim.hello import MAX_PUSHBACK
from workers.sim.profiles import (
    BCD,
    BCD_CAPABILITIES,
    BCD_VERSION,
    SKEW_PROFILES,
    STAND_INS,
    Profile,
    pick,
)


class Scripted:
    """A gateway that answers each Hello with the next of its answers."""

    def __init__(self, *answers: Refused | Welcome, gateway_id: str = "gw-s") -> None:
        self.answers = list(answers)
        self.gateway_id = gateway_id
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


async def test_the_back_off_never_exceeds_its_60_second_cap() -> None:
    now = [1000.0]
    fake = daemon(now)
    waits = []
    gateway = Scripted(*[Refused(Code.UNAVAILABLE, "gone")] * 40)
    for _ in range(40):
        await fake.tick([gateway])  # type: ignore[list-item]
        waits.append(fake.next_try - now[0])
        now[0] = fake.next_try
    assert fake.failures == 40
    assert all(0 <= wait <= MAX_BACK_OFF == 60.0 for wait in waits)
    assert max(waits[10:]) > 30  # the cap, not the doubling, bounds it


@pytest.mark.parametrize("pushback", [-5.0, float("nan"), float("inf"), float("-inf")])
async def test_a_negative_or_malformed_pushback_is_ignored(pushback: float) -> None:
    now = [1000.0]
    fake = daemon(now)
    await fake.tick([Scripted(Refused(Code.RESOURCE_EXHAUSTED, "?", retry_after=pushback))])  # type: ignore[list-item]
    assert fake.failures == 1  # its own back-off instead
    assert now[0] <= fake.next_try <= now[0] + 2.0


async def test_its_doubling_restarts_after_a_pushback() -> None:
    now = [1000.0]
    fake = daemon(now)
    refusal = Refused(Code.UNAVAILABLE, "gone")
    gateway = Scripted(
        refusal, refusal, Refused(Code.RESOURCE_EXHAUSTED, "busy", retry_after=5.0), refusal
    )
    for _ in range(3):
        await fake.tick([gateway])  # type: ignore[list-item]
        now[0] = fake.next_try
    assert fake.failures == 0  # after the pushback
    await fake.tick([gateway])  # type: ignore[list-item]
    assert fake.failures == 1 and fake.next_try <= now[0] + 2.0


async def test_its_working_clock_never_moves_back() -> None:
    now = [1000.0]
    fake = daemon(now)
    assert fake.now() == 1000.0
    now[0] = 400.0  # the host's clock stepped back
    assert fake.now() == 1000.0
    now[0] = 1001.0
    assert fake.now() == 1001.0


async def test_a_new_process_holds_no_command_and_a_full_journal_answers_busy() -> None:
    now = [1000.0]
    fake = daemon(now)
    busy: list[object] = []

    class Recording(Scripted):
        async def busy(self, node_id: str, epoch: int, command_id: object) -> None:
            busy.append(command_id)

        async def progress(self, *args: object) -> None:
            return None

    gateway = Recording(Welcome(1, "s", False, server_time=now[0]))
    await fake.tick([gateway])  # type: ignore[list-item]
    first = dispatch()
    await fake.deliver(first)
    assert list(fake.running) == [first.command_id]
    fake.crash()  # a new process: what the old one ran is not its own
    assert fake.running == {} and fake.gateway is None
    fake.gateway, fake.epoch = gateway, 1  # type: ignore[assignment]
    fake.journal = [{"seq": i} for i in range(JOURNAL_MAX)]
    second = dispatch()
    await fake.deliver(second)
    assert busy == [second.command_id] and second.command_id not in fake.running


def dispatch() -> Dispatch:
    return Dispatch(
        node_id="n1",
        epoch=1,
        command_id=uuid.uuid4(),
        seq=1,
        kind="exec",
        lane="default",
        attempt=1,
        payload={},
    )


async def test_heartbeats_move_its_server_time_mark_and_report_its_node_load() -> None:
    now = [1000.0]
    fake = daemon(now)
    beats: list[dict[str, Any]] = []

    class Beating(Scripted):
        def heartbeat(self, node_id: str, epoch: int, credits: object, **kw: Any) -> HeartbeatAck:
            beats.append(kw)
            return HeartbeatAck(server_time=5_000.0)

    gateway = Beating(Welcome(1, "s", False, server_time=1_000.0))
    await fake.tick([gateway])  # type: ignore[list-item]
    assert fake.server_time_mark == 1_000.0
    now[0] += 10
    await fake.tick([gateway])  # type: ignore[list-item]
    assert fake.server_time_mark == 5_000.0  # the mark moves at heartbeats too
    [beat] = beats
    assert beat["load"] == NodeLoad(
        load_average=0.0,
        memory_available_bytes=fake.memory_available_bytes,
        running_commands=0,
        pending_events=0,
    )


def _connected(now: list[float]) -> FakeDaemon:
    """A daemon with a live session, heartbeat just sent, nothing to report."""
    fake = daemon(now)
    fake.gateway, fake.epoch = Scripted(), 1  # type: ignore[assignment]
    fake.last_heartbeat = now[0]
    return fake


def _finished(fake: FakeDaemon) -> None:
    fake.running[uuid.uuid4()] = _Running(dispatch(), finish_at=fake.now())


def _result(fake: FakeDaemon) -> None:
    fake.results[uuid.uuid4()] = {}


def _event(fake: FakeDaemon) -> None:
    fake.journal.append({"seq": fake.sent_seq + 1})


def _heartbeat_due(fake: FakeDaemon) -> None:
    fake.last_heartbeat -= HEARTBEAT


def _gateway_gone(fake: FakeDaemon) -> None:
    fake.gateway.alive = False  # type: ignore[union-attr]


def _disconnected_retry_due(fake: FakeDaemon) -> None:
    fake.gateway, fake.next_try = None, fake.now()


@pytest.mark.parametrize(
    "change",
    [_finished, _result, _event, _heartbeat_due, _gateway_gone, _disconnected_retry_due],
)
def test_a_daemon_is_idle_only_while_a_tick_has_nothing_to_do(change: Any) -> None:
    """The simulator ticks only daemons that are not idle: each kind of due work ends
    idleness (a result its Hello carried, an event already sent and a retry not yet due
    do not)."""
    now = [1000.0]
    fake = _connected(now)
    carried = uuid.uuid4()
    fake.results[carried], fake.in_hello = {}, {carried}
    fake.journal, fake.sent_seq = [{"seq": 3}], 3
    fake.running[uuid.uuid4()] = _Running(dispatch(), finish_at=now[0] + 1)
    assert fake.idle(now[0])
    change(fake)
    assert not fake.idle(now[0])


def test_a_disconnected_daemon_waits_idle_for_its_retry_or_while_partitioned() -> None:
    now = [1000.0]
    fake = daemon(now)
    fake.next_try = now[0] + 5
    assert fake.idle(now[0])
    assert not fake.idle(now[0] + 5)
    fake.partitioned = True
    assert fake.idle(now[0] + 5)


async def test_its_hello_says_what_bcd_advertises_unless_a_skew_profile_differs() -> None:
    """The seed's names: a GPU node's cdi, devices.limits, binding.kubernetes, nvml and the
    driver nvidia; the instance runtimes libvirt-kvm and cloud-hypervisor as drivers, with
    tunnel.instance-dial; the enforcement caps the seed does not list only as stand-ins."""
    now = [1000.0]
    gateway = Scripted(Welcome(1, "s", False, server_time=now[0]))
    await daemon(now).tick([gateway])  # type: ignore[list-item]
    hello = gateway.hellos[0]
    assert tuple(hello.capabilities) == BCD_CAPABILITIES and hello.daemon_version == BCD_VERSION
    seeds = {
        "cdi",
        "devices.limits",
        "binding.kubernetes",
        "nvml",
        "driver.nvidia",
        "driver.libvirt-kvm",
        "driver.cloud-hypervisor",
        "tunnel.instance-dial",
    }
    assert set(hello.capabilities) == seeds | set(STAND_INS)
    assert all(c.startswith("stand-in.") for c in STAND_INS)  # never passed off as bcd's
    assert sum(".vps-" in c for c in STAND_INS) == 4 and sum(".gpu-" in c for c in STAND_INS) == 2
    older = next(p for p in SKEW_PROFILES if p.name == "bcd-0.9")
    skewed = FakeDaemon(
        "n2", "s2", lambda: now[0], random.Random(7), list(older.capabilities), older.version
    )
    gateway = Scripted(Welcome(1, "s", False, server_time=now[0]))
    await skewed.tick([gateway])  # type: ignore[list-item]
    assert gateway.hellos[0].daemon_version == "0.9.0"
    assert "tunnel.instance-dial" not in gateway.hellos[0].capabilities
    assert not set(STAND_INS) & set(gateway.hellos[0].capabilities)  # no enforcement fields
    cpu = next(p for p in SKEW_PROFILES if p.name == "bcd-cpu")  # no GPU: none of its names
    vps_enforcement = {c for c in STAND_INS if ".vps-" in c}
    assert set(cpu.capabilities) == {
        "driver.libvirt-kvm",
        "driver.cloud-hypervisor",
        "tunnel.instance-dial",
        *vps_enforcement,
    }


@pytest.mark.parametrize("profile", [BCD, *SKEW_PROFILES], ids=lambda p: p.name)
def test_every_profile_advertises_only_names_the_labeler_keeps(profile: Profile) -> None:
    assert sanitize(profile.capabilities) == tuple(sorted(profile.capabilities))
    assert len(set(profile.capabilities)) == len(profile.capabilities)


@given(st.integers(0, 2**32), st.floats(0.0, 1.0))
def test_a_skew_share_of_daemons_runs_a_skew_profile(seed: int, share: float) -> None:
    rng = random.Random(seed)
    picked = [pick(rng, share) for _ in range(400)]
    skewed = sum(p is not BCD for p in picked)
    assert all(p is BCD or p in SKEW_PROFILES for p in picked)
    if share == 0.0:
        assert skewed == 0
    elif share == 1.0:
        assert skewed == 400
    else:  # binomial(400, share): five standard deviations either side
        assert abs(skewed - 400 * share) <= 5 * (400 * share * (1 - share)) ** 0.5 + 1
