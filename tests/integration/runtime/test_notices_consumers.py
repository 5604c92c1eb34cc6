"""The gateways' notices stream holds a durable consumer a gateway (`bcw provision`): it
is bounded by `BCW_NATS_NOTICES_MAX_CONSUMERS` (4,096), not by the other streams'
`BCW_NATS_STREAM_MAX_CONSUMERS` (64), which stopped a fleet at about 60 gateways — the
rollout of 250 gateways failed at its 65th (`maximum consumers limit reached`). A stream
made with fewer keeps them (the server cannot change it in place): `bcw provision` says
so, and a gateway past the bound is refused in one line naming the setting."""

from __future__ import annotations

import logging

import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from workers.gateway import notices
from workers.runtime.bus import streams


async def test_more_gateways_than_a_streams_consumers_each_get_a_notices_consumer(
    nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    assert (await js.stream_info(subjects.gateway_stream)).config.max_consumers == 4096
    assert (await js.stream_info(subjects.events_stream)).config.max_consumers == 64
    for g in range(70):
        await notices.provision(js, subjects, f"gw-{g}")
    assert (await js.stream_info(subjects.gateway_stream)).state.consumer_count == 70


async def test_a_notices_stream_made_smaller_keeps_its_bound_said_and_refuses_in_one_line(
    nc: NATS, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects, limits=streams.StreamLimits(notices_consumers=8))
    for g in range(8):
        await notices.provision(js, subjects, f"gw-{g}")
    with pytest.raises(streams.ProvisionError) as refused:
        await notices.provision(js, subjects, "gw-8")
    assert "BCW_NATS_NOTICES_MAX_CONSUMERS" in str(refused.value)
    assert "gw-8" in str(refused.value) and "\n" not in str(refused.value)
    await notices.provision(js, subjects, "gw-3")  # one it has: corrected, not refused
    with caplog.at_level(logging.WARNING):
        states = await streams.provision_streams(js, subjects)  # 4,096 wanted now
    assert states[subjects.gateway_stream] == "unchanged"
    said = [r.getMessage() for r in caplog.records if subjects.gateway_stream in r.getMessage()]
    assert said == [
        f"stream {subjects.gateway_stream}: at most 8 consumers, 4096 wanted; the server "
        "cannot change it in place — recreate the stream, then bcw provision, to raise it"
    ]
    assert (await js.stream_info(subjects.gateway_stream)).config.max_consumers == 8
