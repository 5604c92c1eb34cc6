"""The gateways' notices stream holds a durable consumer a gateway (`bcw provision`): it
is bounded by `BCW_NATS_NOTICES_MAX_CONSUMERS` (4,096), not by the other streams'
`BCW_NATS_STREAM_MAX_CONSUMERS` (64), which stopped a fleet at about 60 gateways — the
rollout of 250 gateways failed at its 65th (`maximum consumers limit reached`). A gateway
past the bound is refused in one line naming the setting; a stream made with a smaller
bound (a 0.3 install's 64) is shown differing by the check and raised in place by
`bcw provision` (nats-server 2.12 and later)."""

from __future__ import annotations

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


async def test_a_notices_stream_made_smaller_refuses_in_one_line_until_provisioned_again(
    nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects, limits=streams.StreamLimits(notices_consumers=8))
    for g in range(8):
        await notices.provision(js, subjects, f"gw-{g}")
    try:
        await notices.provision(js, subjects, "gw-8")
        raise AssertionError("a ninth consumer on a stream of eight")
    except streams.ProvisionError as refused:
        said = str(refused)
    assert "gw-8" in said and "BCW_NATS_NOTICES_MAX_CONSUMERS" in said and "\n" not in said
    await notices.provision(js, subjects, "gw-3")  # one it has: corrected, not refused
    checked = await streams.check_streams(js, subjects)
    assert checked[subjects.gateway_stream] == "differs: max_consumers 8 (settings: 4096)"
    states = await streams.provision_streams(js, subjects)  # 4,096 wanted now
    assert states[subjects.gateway_stream] == "updated"
    assert (await js.stream_info(subjects.gateway_stream)).config.max_consumers == 4096
    await notices.provision(js, subjects, "gw-8")
    assert (await streams.check_streams(js, subjects))[subjects.gateway_stream] == "ok"
