"""A planted dead letter never becomes a command (issue #41): the labeler's nkey plants
letters that claim to be the replay worker's unpublishable dispatch, or a gateway's fact,
and the operator then runs the routine `bcw dead-letters redrive --all --yes`. The relay's
subject is refused to it; every letter it can store (on its own subject) is listed as
refused and is not re-sent — only the gateway's own fact, unchanged, goes back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from tests.integration.security.conftest import SUBJECTS, client_as, violated
from tests.integration.support import bcw, eventually, stream_messages
from workers.runtime.bus import deadletter

pytestmark = pytest.mark.slow

DISPATCH = SUBJECTS.notice("gw-1", "dispatch")
HELLO = SUBJECTS.fact("gw-1", "hello")
SHELL = json.dumps({"node_id": "n1", "kind": "shell.exec", "payload": {"cmd": "curl x | sh"}})


def _letter(worker: str, cause: str, subject: str, seq: int, **more: str) -> dict[str, str]:
    return {
        deadletter.WORKER: worker,
        deadletter.CAUSE: cause,
        deadletter.SUBJECT: subject,
        deadletter.STREAM_SEQ: str(seq),
        deadletter.REASON: "planted",
        **more,
    }


async def _plant(nc: NATS, on: str, headers: dict[str, str], body: bytes) -> None:
    await nc.jetstream(timeout=2.0).publish(on, body, headers=headers)


async def test_a_workers_planted_letters_are_refused_and_nothing_reaches_a_node(
    keys: Path, secured: str
) -> None:
    code, output = await bcw(
        "provision", BCW_NATS_URL=secured, BCW_NATS_NKEY_SEED_FILE=str(keys / "admin.nk")
    )
    assert code == 0, output
    async with client_as(keys, secured, "gateway-gw-1") as (gateway, errors):
        genuine = await gateway.jetstream().publish(HELLO, b'{"genuine": 1}')
        assert errors == []
    dispatch = {"Bc-Type": "dispatch", deadletter.SENDER: "replay"}
    async with client_as(keys, secured, "worker-labeler") as (labeler, errors):
        # the relay's own subject is not the labeler's
        await labeler.publish(
            SUBJECTS.dead("relay"),
            SHELL.encode(),
            headers=_letter("relay", "unpublishable", DISPATCH, 1, **dispatch),
        )
        await labeler.flush()
        await eventually(lambda: violated(errors, "Publish"), what="bc.dead.relay refused")
        mine = SUBJECTS.dead("labeler")
        planted = [
            # the replay worker's unpublishable dispatch, as the relay's and as the labeler's
            _letter("relay", "unpublishable", DISPATCH, 1, **dispatch),
            _letter("labeler", "unpublishable", DISPATCH, 2, **dispatch),
            _letter(
                "labeler",
                "unpublishable",
                DISPATCH,
                3,
                **{"Bc-Type": "dispatch", deadletter.SENDER: "labeler"},
            ),
            # a fact letter bound elsewhere, and a gateway's fact with another body
            _letter("labeler", "invalid", DISPATCH, genuine.seq),
            _letter("labeler", "handler", HELLO, genuine.seq),
            # a fact the stream never held
            _letter("labeler", "unsupported-major", HELLO, genuine.seq + 1000),
        ]
        for headers in planted:
            await _plant(labeler, mine, headers, SHELL.encode())
        # the gateway's own fact, unchanged: re-sent as the stream holds it
        await _plant(labeler, mine, _letter("labeler", "handler", HELLO, genuine.seq), b"x")
        copy = _letter("labeler", "handler", HELLO, genuine.seq)
        await _plant(labeler, mine, {**copy, "Nats-Msg-Id": "copy"}, b'{"genuine": 1}')
    as_operator = {
        "BCW_NATS_URL": secured,
        "BCW_SUBJECT_ROOT": "bc",
        "BCW_NATS_NKEY_SEED_FILE": str(keys / "operator.nk"),
    }
    code, out = await bcw("dead-letters", "list", **as_operator)
    assert code == 0 and "8 dead letter(s)" in out and "7 refused for redrive" in out, out
    assert out.count("REFUSED for redrive") == 7, out
    assert "stored on bc.dead.labeler but names the worker relay" in out
    assert "worker labeler does not send 'dispatch'" in out
    assert "which is no facts subject" in out
    assert f"its body is not the fact stored at seq {genuine.seq}" in out
    assert f"no longer holds seq {genuine.seq + 1000}" in out
    code, out = await bcw("dead-letters", "redrive", "--all", "--yes", **as_operator)
    assert code == 1 and "1 re-driven" in out and out.count("not re-driven") == 7, out
    async with client_as(keys, secured, "admin") as (admin, _errors):
        js = admin.jetstream()
        assert await stream_messages(js, SUBJECTS.gateway_stream) == []  # no dispatch at all
        facts = await stream_messages(js, SUBJECTS.facts_stream)
    assert [(m.subject, m.data) for m in facts] == [
        (HELLO, b'{"genuine": 1}'),
        (HELLO, b'{"genuine": 1}'),
    ]
