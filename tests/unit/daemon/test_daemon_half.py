"""The fake daemon's own half of the seed's rules, against a scripted gateway (the
daemon's arithmetic, no servers): its journal of finished commands (a duplicate delivery
answered from it, never run again; a result owed until acked; kept within its bound; kept
by a crash, forgotten by a lost journal) and its server time (a mark and an offset that
never move its working clock back; the refusal's challenge signed once, at its time, at
its gateway; a time a gateway told never signed with a nonce of its own)."""

from __future__ import annotations

import random
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from schemas.notices import Dispatch
from schemas.proof import CHALLENGE_RE, HelloProof
from workers.gateway import Code, HelloRequest, Refused, Welcome
from workers.sim.daemon import FakeDaemon
from workers.sim.journal import Finished
from workers.sim.servertime import MAX_CLOCK_BACK, ServerTime

CHALLENGE = "srv-0123456789abcdef-" + "a" * 40


class Gateway:
    """A gateway that answers each Hello with the next of its answers (a Welcome by
    default) and records what the daemon tells it."""

    def __init__(self, *answers: Refused | Welcome, gateway_id: str = "gw-1") -> None:
        self.answers = list(answers)
        self.gateway_id = gateway_id
        self.alive = True
        self.hellos: list[HelloRequest] = []
        self.results: list[uuid.UUID] = []
        self.refuse_results = False

    async def hello(self, request: HelloRequest, stream: Any) -> Welcome:
        self.hellos.append(request)
        answer = self.answers.pop(0) if self.answers else Welcome(len(self.hellos), "s", False)
        if isinstance(answer, Refused):
            raise answer
        return answer

    async def progress(self, *args: object) -> None:
        return None

    async def result(self, node: str, epoch: int, command_id: uuid.UUID, *rest: object) -> None:
        if self.refuse_results:
            raise Refused(Code.INVALID_ARGUMENT, "no session")
        self.results.append(command_id)

    async def events(self, *args: object) -> None:
        return None

    @property
    def proofs(self) -> list[HelloProof | None]:
        return [h.proof for h in self.hellos]


def _daemon(now: list[float], key: bytes | None = None) -> FakeDaemon:
    return FakeDaemon(
        "n1", "s1", lambda: now[0], random.Random(7), work_seconds=(1, 1), hello_key=key
    )


def _dispatch(command_id: uuid.UUID) -> Dispatch:
    return Dispatch(
        node_id="n1",
        epoch=1,
        command_id=command_id,
        seq=1,
        kind="exec",
        lane="default",
        attempt=1,
        payload={},
    )


async def _connected(now: list[float]) -> tuple[FakeDaemon, Gateway]:
    fake, gateway = _daemon(now), Gateway()
    await fake.tick([gateway])  # type: ignore[list-item]
    assert fake.gateway is gateway  # type: ignore[comparison-overlap]
    return fake, gateway


async def _finish(fake: FakeDaemon, gateway: Gateway, now: list[float]) -> None:
    now[0] += 2  # its work takes 1 s
    await fake.tick([gateway])  # type: ignore[list-item]


# -- its journal of finished commands ------------------------------------------------------


async def test_a_duplicate_delivery_of_a_finished_command_is_answered_from_its_journal() -> None:
    now = [1000.0]
    fake, gateway = await _connected(now)
    command = uuid.uuid4()
    await fake.deliver(_dispatch(command))
    await _finish(fake, gateway, now)
    assert gateway.results == [command] and fake.results == {}  # sent, acked
    await fake.deliver(_dispatch(command))  # the same Dispatch again
    assert command not in fake.running  # not run again: its result sent again instead
    assert gateway.results == [command, command] and fake.answered == 1
    assert fake.runs[command] == 1


async def test_a_replayed_command_whose_result_was_not_stored_runs_once() -> None:
    """It finished while its result could not be stored (the session ended: still owed),
    reconnected — its Hello carries the result — and the replay re-sends the command before
    the Ack: answered from the journal, not run again."""
    now = [1000.0]
    fake, gateway = await _connected(now)
    command = uuid.uuid4()
    await fake.deliver(_dispatch(command))
    gateway.refuse_results = True
    await _finish(fake, gateway, now)
    assert list(fake.results) == [command] and fake.gateway is None  # owed, the session gone
    gateway.refuse_results = False
    fake.next_try = 0.0
    await fake.tick([gateway])  # type: ignore[list-item]
    assert [r["command_id"] for r in gateway.hellos[-1].results] == [str(command)]
    await fake.deliver(_dispatch(command))  # the replay
    assert fake.runs[command] == 1 and command not in fake.running and fake.answered == 1
    assert gateway.results == [command] and fake.results == {}  # stored by the answer
    await fake.ack_results([command])  # the Ack after the Welcome: nothing owed any more
    assert fake.results == {} and fake.finished.answer(command) is not None


async def test_a_crash_keeps_its_journal_and_a_lost_journal_forgets_it() -> None:
    now = [1000.0]
    fake, gateway = await _connected(now)
    done, cut = uuid.uuid4(), uuid.uuid4()
    await fake.deliver(_dispatch(done))
    await _finish(fake, gateway, now)
    await fake.deliver(_dispatch(cut))
    fake.crash()  # a new process: `cut` was running, `done` is in the journal
    assert fake.cut_off[cut] == 1 and fake.cut_off[done] == 0
    await fake.tick([gateway])  # type: ignore[list-item]
    await fake.deliver(_dispatch(done))
    await fake.deliver(_dispatch(cut))  # the seed's crash rules: re-sent, it runs again
    assert (fake.runs[done], fake.runs[cut]) == (1, 2) and fake.answered == 1
    journal = fake.journal_id
    fake.lose_journal()
    assert fake.journal_id != journal and fake.finished.answer(done) is None
    assert fake.runs[done] == 1  # what it ran is counted beside the journal: never forgotten


async def test_a_result_is_owed_until_acked() -> None:
    now = [1000.0]
    fake, gateway = await _connected(now)
    command = uuid.uuid4()
    await fake.deliver(_dispatch(command))
    gateway.refuse_results = True
    await _finish(fake, gateway, now)
    for _ in range(3):  # refused answers are no ack: owed, carried by every Hello
        fake.next_try = 0.0
        await fake.tick([gateway])  # type: ignore[list-item]
        assert [r["command_id"] for r in gateway.hellos[-1].results] == [str(command)]
        fake.drop("test")
    await fake.ack_results([command])
    assert fake.results == {}


operations = st.lists(
    st.tuples(st.sampled_from(["finish", "ack"]), st.integers(0, 30), st.floats(0, 50_000)),
    max_size=120,
)


@given(operations)
def test_its_journal_forgets_an_acked_result_only_beyond_its_bound_and_never_an_owed_one(
    steps: list[tuple[str, int, float]],
) -> None:
    journal = Finished(kept=5, keep_seconds=3_600.0)
    ids = [uuid.UUID(int=i) for i in range(31)]
    now = 0.0
    for what, i, later in steps:
        now += later
        if what == "ack":
            journal.ack([ids[i]], now)
        elif ids[i] not in journal.results:
            journal.finish(ids[i], "done", {}, None, now)
        else:  # a finished command is never finished again (it is answered): time passes
            journal.prune(now)
        assert all(c in journal.results for c in journal.unacked)  # owed: always answered
        assert len(journal.acked) <= 5
        assert all(
            now - at < 3_600.0 or c not in journal.results for c, at in journal.acked.items()
        )
        assert set(journal.results) == set(journal.unacked) | set(journal.acked)


# -- its server time, and the proof's freshness ---------------------------------------------


async def test_a_refusals_challenge_is_signed_once_at_its_time_at_its_gateway() -> None:
    """Its own clock 10 minutes behind: its Hello is refused with the database's time and a
    challenge; its next Hello goes to that gateway, at that time with that nonce; once."""
    now = [1000.0]
    fake = _daemon(now, key=b"k" * 32)
    told = Refused(Code.UNAUTHENTICATED, "unproven", server_time=1600.0, challenge=CHALLENGE)
    again = Refused(Code.UNAUTHENTICATED, "unproven", server_time=1600.0)
    other, issuer = Gateway(gateway_id="gw-0"), Gateway(told, again, gateway_id="gw-1")
    fake.home = 1
    await fake.tick([other, issuer])  # type: ignore[list-item]
    first = issuer.proofs[0]
    assert first is not None and first.at == 1000 and not CHALLENGE_RE.match(first.nonce)
    assert fake.server.offset == 600.0  # its working clock in server time follows it
    fake.home, fake.next_try = 0, 0.0  # its own gateway is gw-0 now: the challenge's wins
    await fake.tick([other, issuer])  # type: ignore[list-item]
    second = issuer.proofs[1]
    assert second is not None and (second.at, second.nonce) == (1600, CHALLENGE)
    fake.next_try = 0.0
    await fake.tick([other, issuer])  # refused again, no challenge: its own clock again
    [third] = other.proofs
    # its own clock, but after the last plain `at` it signed (1000): its `at` rises
    assert third is not None and third.at == 1001 and third.nonce != CHALLENGE


async def test_a_refusals_challenge_is_signed_when_its_clock_is_right_too() -> None:
    """Its clock agrees with the database's, yet its proof was refused (older than the
    newest the control plane took: its clock went back before it restarted): it signs the
    refusal's challenge all the same, at the refusal's time."""
    now = [1000.0]
    fake = _daemon(now, key=b"k" * 32)
    told = Refused(Code.UNAUTHENTICATED, "unproven", server_time=1000.0, challenge=CHALLENGE)
    issuer = Gateway(told, gateway_id="gw-1")
    await fake.tick([issuer])  # type: ignore[list-item]
    fake.next_try = 0.0
    await fake.tick([issuer])  # type: ignore[list-item]
    assert [(p.at, p.nonce == CHALLENGE) for p in issuer.proofs if p is not None] == [
        (1000, False),
        (1000, True),
    ]


async def test_it_never_signs_a_time_a_gateway_told_with_a_nonce_of_its_own() -> None:
    """A hostile gateway tells a time a day ahead and no challenge of the server's form:
    the daemon's next proof is at its own clock (or its last `at` + 1), never at the told
    time."""
    now = [1000.0]
    fake = _daemon(now, key=b"k" * 32)
    for forged in (None, "0123456789abcdef0123456789abcdef", "srv-nothex"):
        told = Refused(Code.UNAUTHENTICATED, "?", server_time=87_400.0, challenge=forged)
        gateway = Gateway(told, told)
        await fake.tick([gateway])  # type: ignore[list-item]
        fake.next_try = 0.0
        await fake.tick([gateway])  # type: ignore[list-item]
        fake.next_try = 0.0
        # its own clock, rising by one a Hello within its second (migration 0059)
        ats = [p.at for p in gateway.proofs if p is not None]
        assert len(ats) == 2 and ats[1] == ats[0] + 1 and 1000 <= ats[0] <= 1004


async def test_a_refusals_time_far_behind_its_mark_is_not_believed_nor_signed() -> None:
    now = [1000.0]
    fake = _daemon(now, key=b"k" * 32)
    await fake.tick([Gateway(Welcome(1, "s", False, server_time=10_000.0))])  # type: ignore[list-item]
    fake.drop("test")
    behind = 10_000.0 - MAX_CLOCK_BACK - 1
    told = Refused(Code.UNAUTHENTICATED, "?", server_time=behind, challenge=CHALLENGE)
    gateway = Gateway(told, gateway_id="gw-behind")
    fake.next_try = 0.0
    await fake.tick([gateway])  # type: ignore[list-item]
    assert fake.behind_welcomes == 1 and fake.distrusted is gateway  # type: ignore[comparison-overlap]
    assert fake.server.challenge is None and fake.server.offset == 9_000.0  # the Welcome's


told_times = st.lists(
    st.tuples(st.floats(0, 600), st.floats(-3_600, 3_600), st.booleans()), max_size=60
)


@given(told_times)
def test_its_working_clock_in_server_time_never_moves_back(
    steps: list[tuple[float, float, bool]],
) -> None:
    """Whatever server times it is told (ahead, behind, by Welcomes or refusals), its
    working clock in server time never moves back and never falls behind its mark."""
    clock, own, before = ServerTime(), 1_000.0, float("-inf")
    for elapsed, skew, welcome in steps:
        own += elapsed
        clock.told(own + skew, own, mark=welcome)
        now = clock.now(own)
        assert now >= before and now >= clock.mark
        before = now
