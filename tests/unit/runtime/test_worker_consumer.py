"""A worker's consumer as these settings want it (`worker_consumer.differences`): what a
worker binds as it is, and what it waits for `bcw provision` to correct."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas.subjects import Subjects
from workers.registry import WORKERS
from workers.runtime.base.runtime_settings import ConsumerSettings
from workers.runtime.bus.streams import ConsumerSpec
from workers.runtime.bus.streams.worker_consumer import differences, said
from workers.settings import Settings

SUBJECTS = Subjects("t1")


def _wanted(worker: str = "liveness") -> ConsumerConfig:
    return WORKERS[worker](Settings()).consumer_spec(SUBJECTS).config(ConsumerSettings())


def _as_the_server_says(config: ConsumerConfig) -> ConsumerConfig:
    """What `consumer_info` gives back for it: through the JSON the server keeps."""
    return ConsumerConfig.from_response(config.as_dict())


@pytest.mark.parametrize("worker", sorted(WORKERS))
def test_a_consumer_as_provisioned_is_bound_as_it_is(worker: str) -> None:
    wanted = _wanted(worker)
    assert differences(_as_the_server_says(wanted), wanted) == {}


@given(nanos=st.integers(min_value=-999_999, max_value=999_999))
def test_a_duration_within_a_millisecond_is_the_same(nanos: int) -> None:
    wanted = _wanted()
    have = dataclasses.replace(wanted, ack_wait=(wanted.ack_wait or 0) + nanos / 1e9)
    assert differences(have, wanted) == {}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"ack_wait": 0.05}, "ack_wait"),
        ({"max_deliver": -1}, "max_deliver"),
        ({"max_ack_pending": 100_000}, "max_ack_pending"),
        ({"max_waiting": 1}, "max_waiting"),
        ({"deliver_policy": DeliverPolicy.NEW}, "deliver_policy"),
        ({"ack_policy": AckPolicy.NONE}, "ack_policy"),
        ({"deliver_subject": "t1.revocations"}, "deliver_subject"),  # the amplifier
        ({"inactive_threshold": 1.0}, "inactive_threshold"),  # the server deletes it idle
        ({"filter_subject": "t1.facts.>", "filter_subjects": None}, "filter_subjects"),
    ],
)
def test_each_field_the_settings_set_or_leave_unset_is_compared(
    change: dict[str, object], field: str
) -> None:
    wanted = _wanted()
    have = _as_the_server_says(dataclasses.replace(wanted, **change))  # type: ignore[arg-type]
    differs = differences(have, wanted)
    assert list(differs) == [field]
    assert field in said(differs) and "(settings: " in said(differs)


def test_filters_are_compared_as_a_set() -> None:
    spec = ConsumerSpec("w", ("t1.facts.*.a", "t1.facts.*.b"))
    wanted = spec.config(ConsumerSettings())
    have = dataclasses.replace(wanted, filter_subjects=["t1.facts.*.b", "t1.facts.*.a"])
    assert differences(have, wanted) == {}
