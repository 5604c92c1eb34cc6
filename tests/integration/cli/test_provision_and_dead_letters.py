"""`bcw provision` and `bcw dead-letters` as an operator runs them: provisioning that says
what differs and changes nothing under `--check`; dead letters listed, paged and re-driven,
by worker, by sequence or all, with a dry run; a redrive without a choice refused.

What is real: the `bcw` command in a subprocess, the session's nats-server.
"""

from __future__ import annotations

from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import bcw, stream_messages
from workers.runtime.bus import streams


async def _bcw(servers: Servers, subjects: Subjects, *args: str) -> tuple[int, str]:
    return await bcw(*args, BCW_NATS_URL=servers.nats_url, BCW_SUBJECT_ROOT=subjects.root)


async def test_cli_provision_and_dead_letters(
    servers: Servers, nc: NATS, subjects: Subjects
) -> None:
    code, out = await _bcw(servers, subjects, "provision")
    assert code == 0, out
    assert f"stream   {subjects.facts_stream}" in out
    js = nc.jetstream()
    from workers.runtime.bus.deadletter import dead_letter

    stored = await js.publish(subjects.fact("gw-1", "hello"), b"{}", headers={"Bc-Type": "hello"})
    await dead_letter(
        js,
        subjects,
        "liveness",
        subject=subjects.fact("gw-1", "hello"),
        stream=subjects.facts_stream,
        stream_seq=stored.seq,
        data=b"{}",
        headers={"Bc-Type": "hello", "Nats-Msg-Id": "m-1"},
        reason="invalid hello: field 'boot_id': Field required",
        cause="invalid",
    )
    code, out = await _bcw(servers, subjects, "dead-letters", "list")
    assert code == 0 and "field 'boot_id'" in out and "1 dead letter(s)" in out
    code, out = await _bcw(servers, subjects, "dead-letters", "redrive", "--worker", "liveness")
    assert code == 0 and "1 re-driven" in out
    redriven = await stream_messages(js, subjects.facts_stream)
    assert [m.subject for m in redriven] == [subjects.fact("gw-1", "hello")] * 2
    assert "Bc-Dead-Reason" not in redriven[1].headers
    code, out = await _bcw(servers, subjects, "dead-letters", "list")
    assert "0 dead letter(s)" in out


async def test_provision_check_changes_nothing_and_says_what_differs(
    servers: Servers, nc: NATS, subjects: Subjects
) -> None:
    code, out = await _bcw(servers, subjects, "provision", "--check")
    assert code == 1 and f"stream   {subjects.facts_stream:<24} missing" in out
    code, out = await _bcw(servers, subjects, "provision")
    assert code == 0, out
    js = nc.jetstream()
    info = await js.stream_info(subjects.events_stream)
    info.config.max_age = 3 * 24 * 3600.0  # an operator keeps events 3 days, not 7
    await js.update_stream(info.config)
    code, out = await _bcw(servers, subjects, "provision", "--check")
    assert code == 0 and f"stream   {subjects.facts_stream:<24} ok" in out
    assert f"stream   {subjects.events_stream:<24} differs: max_age 259200" in out
    assert (await js.stream_info(subjects.events_stream)).config.max_age == 3 * 24 * 3600.0


async def test_redrive_needs_a_choice_dry_runs_and_finds_a_sequence_beyond_a_page(
    servers: Servers, nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    from workers.runtime.bus.deadletter import dead_letter

    for seq in range(1, 6):  # the facts they hold, stored at 1 … 5
        await js.publish(subjects.fact("gw-1", "result"), b"{}", headers={"Bc-Type": "result"})
        await dead_letter(
            js,
            subjects,
            "replay",
            subject=subjects.fact("gw-1", "result"),
            stream=subjects.facts_stream,
            stream_seq=seq,
            data=b"{}",
            headers={"Bc-Type": "result"},
            reason=f"r{seq}",
            cause="handler",
        )
    # no filter: refused before any connection, nothing touched
    code, out = await bcw("dead-letters", "redrive", BCW_NATS_URL="nats://10.255.255.1:4222")
    assert code == 2 and "say which: --worker, --cause, --seq, or --all" in out
    code, out = await _bcw(servers, subjects, "dead-letters", "redrive", "--all", "--dry-run")
    assert code == 0 and "5 would be re-driven (--dry-run: nothing was)" in out
    # paging: two at a time, and the way to the next page
    code, out = await _bcw(servers, subjects, "dead-letters", "list", "--limit", "2")
    dead = subjects.dead_stream_of("replay")
    assert "2 dead letter(s)" in out and f"more may follow: --after {dead}:2" in out
    code, out = await _bcw(servers, subjects, "dead-letters", "list", "--after", f"{dead}:4")
    assert "1 dead letter(s)" in out and "r5" in out
    code, out = await _bcw(servers, subjects, "dead-letters", "list", "--json", "--limit", "2")
    import json

    listed = [json.loads(line) for line in out.splitlines()]
    assert [(x["stream"], x["seq"], x["worker"], x["cause"], x["reason"]) for x in listed] == [
        (dead, 1, "replay", "handler", "r1"),
        (dead, 2, "replay", "handler", "r2"),
    ]
    # --seq beyond the first page is looked up directly; one that holds none is said
    code, out = await _bcw(
        servers,
        subjects,
        "dead-letters",
        "redrive",
        "--seq",
        f"{dead}:5",
        "--seq",
        f"{dead}:99",
        "--seq",
        f"{subjects.facts_stream}:1",
        "--limit",
        "1",
    )
    assert code == 1 and f"re-drove {dead}:5" in out and f"no dead letter at {dead}:99" in out
    assert f"no dead letter at {subjects.facts_stream}:1" in out  # a fact is no letter
    code, out = await _bcw(servers, subjects, "dead-letters", "redrive", "--seq", "5")
    assert code == 2 and "STREAM:SEQ" in out  # a bare sequence names no stream
    code, out = await _bcw(servers, subjects, "dead-letters", "list")
    assert "4 dead letter(s)" in out and "r5" not in out
