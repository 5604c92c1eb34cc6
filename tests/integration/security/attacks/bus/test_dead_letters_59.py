"""Issue 59, finding 14: a worker's nkey evicted every dead letter by publishing under a new
subject per letter (600 letters of 50 kB letters removed all of another gateway's parked facts): the
one dead stream bounded letters per subject, and its bytes were one quota, oldest first.

Now each publisher of dead letters (each worker, the relay) has a stream of its own,
bounded in bytes. As the labeler's own nkey, 600 letters of 50 kB, each under a subject of
its own: the liveness worker's letter of gw-1's parked fact and the replay worker's of
gw-2's fact are still listed by the operator and re-driven, each as the facts stream holds
it; the labeler's stream holds at most its bound. In both layouts: **A** one facts stream,
**B** a facts stream per gateway (a letter then names the sourced copy's sequence)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from tests.integration.security.conftest import SUBJECTS, client_as, fresh_streams
from tests.integration.support import bcw, eventually, stream_messages
from workers.runtime.bus import deadletter

pytestmark = pytest.mark.slow

BOUND = 2 * 2**20  # each publisher's dead letters: 2 MiB
LETTERS, SIZE = 600, 50_000  # 30 MB of junk, fifteen times the bound
LAYOUTS = {
    "A-one-stream": {"dead_max_bytes": BOUND},
    "B-per-gateway": {"dead_max_bytes": BOUND, "facts_gateways": "gw-1,gw-2"},
}


async def _stored_fact(admin: NATS, gateway: str, body: bytes) -> tuple[int, dict[str, str]]:
    """Where the facts stream holds `gateway`'s fact `body` (sourced, in layout B)."""
    js = admin.jetstream()

    async def held() -> bool:
        return any(m.data == body for m in await stream_messages(js, SUBJECTS.facts_stream))

    await eventually(held, what=f"{gateway}'s fact in the facts stream")
    [stored] = [m for m in await stream_messages(js, SUBJECTS.facts_stream) if m.data == body]
    return stored.seq, dict(stored.headers or {})


async def _letter_of(keys: Path, secured: str, worker: str, gateway: str, cause: str) -> bytes:
    """`gateway` sends a fact, and `worker`, logged in as itself, dead-letters it."""
    body = f'{{"from": "{gateway}", "for": "{worker}"}}'.encode()
    subject = SUBJECTS.fact(gateway, "hello")
    async with client_as(keys, secured, f"gateway-{gateway}") as (gw, _):
        await gw.jetstream().publish(subject, body, headers={"Bc-Type": "hello"})
    async with client_as(keys, secured, "admin") as (admin, _):
        seq, headers = await _stored_fact(admin, gateway, body)
    async with client_as(keys, secured, f"worker-{worker}") as (nc, errors):
        await deadletter.dead_letter(
            nc.jetstream(),
            SUBJECTS,
            worker,
            subject=subject,
            stream=SUBJECTS.facts_stream,
            stream_seq=seq,
            data=body,
            headers=headers,
            reason="parked",
            cause=cause,
        )
        assert errors == []
    return body


async def _flood(keys: Path, secured: str) -> tuple[int, float]:
    """The labeler's nkey: LETTERS letters of SIZE bytes, each under a new subject of its
    own dead letters; (stored, seconds)."""
    junk, stored, started = b"j" * SIZE, 0, time.monotonic()
    async with client_as(keys, secured, "worker-labeler") as (attacker, errors):
        js = attacker.jetstream()
        for i in range(LETTERS):
            await js.publish(f"{SUBJECTS.dead('labeler')}.invented.s{i}", junk)
            stored += 1
        assert errors == []
    return stored, time.monotonic() - started


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
async def test_a_workers_flood_of_letters_evicts_only_its_own(
    layout: dict[str, object], keys: Path, secured: str
) -> None:
    async with fresh_streams(keys, secured, layout):
        pass  # the streams only
    parked = await _letter_of(keys, secured, "liveness", "gw-1", "unsupported-major")
    handled = await _letter_of(keys, secured, "replay", "gw-2", "handler")
    stored, seconds = await _flood(keys, secured)
    print(f"labeler: {stored} letters of {SIZE} bytes stored in {seconds:.2f} s")
    as_operator = {
        "BCW_NATS_URL": secured,
        "BCW_SUBJECT_ROOT": SUBJECTS.root,
        "BCW_NATS_NKEY_SEED_FILE": str(keys / "operator.nk"),
    }
    for worker in ("liveness", "replay"):
        code, out = await bcw("dead-letters", "list", "--worker", worker, **as_operator)
        assert code == 0 and "1 dead letter(s)" in out and "REFUSED" not in out, out
    code, out = await bcw(
        "dead-letters", "redrive", "--cause", "unsupported-major", "--yes", **as_operator
    )
    assert code == 0 and "1 re-driven" in out, out
    code, out = await bcw("dead-letters", "redrive", "--worker", "replay", "--yes", **as_operator)
    assert code == 0 and "1 re-driven" in out, out
    async with client_as(keys, secured, "admin") as (admin, _):
        js = admin.jetstream()

        async def both_back() -> bool:
            held = [m.data for m in await stream_messages(js, SUBJECTS.facts_stream)]
            return held.count(parked) == 2 and held.count(handled) == 2

        await eventually(both_back, what="both facts re-driven, as the facts stream held them")
        # the labeler's flood cost only its own stream, within its bound
        own = await js.stream_info(SUBJECTS.dead_stream_of("labeler"))
        assert own.config.max_bytes == BOUND and 0 < own.state.bytes <= BOUND
        assert own.state.messages <= BOUND // SIZE
        for other in ("liveness", "replay", "relay"):
            info = await js.stream_info(SUBJECTS.dead_stream_of(other))
            assert info.state.bytes < 10_000  # nothing of the labeler's
