"""The reference gateway's admission rules, one refusal code at a time."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.gateway.admission import (
    BUSY_PUSHBACK_MAX,
    BUSY_PUSHBACK_MIN,
    RATE_WINDOW,
    CertRow,
    Code,
    DesiredState,
    HelloRequest,
    RateMeter,
    admit,
    busy_pushback,
    desired_state_due,
    pushback,
    upgrade_required,
    version_tuple,
)

NOW = datetime(2026, 11, 30, tzinfo=UTC)
REQUEST = HelloRequest(node_id="n1", cert_serial="s1", role="worker", boot_id="b", journal_id="j")
CERT = CertRow("s1", "n1", 2, "worker", NOW + timedelta(days=1), revoked=False)


@pytest.mark.parametrize(
    ("request_", "cert", "generation", "code"),
    [
        pytest.param(REQUEST, CERT, 2, None, id="admitted"),
        pytest.param(replace(REQUEST, boot_id=""), CERT, 2, Code.INVALID_ARGUMENT, id="no-boot-id"),
        pytest.param(
            replace(REQUEST, journal_id=""), CERT, 2, Code.INVALID_ARGUMENT, id="no-journal-id"
        ),
        pytest.param(
            replace(REQUEST, approver_set_sha256="a" * 64),
            CERT,
            2,
            Code.INVALID_ARGUMENT,
            id="approver-digest-without-epoch",
        ),
        pytest.param(
            replace(REQUEST, approver_set_epoch=3),
            CERT,
            2,
            Code.INVALID_ARGUMENT,
            id="approver-epoch-without-digest",
        ),
        pytest.param(
            replace(REQUEST, approver_set_epoch=3, approver_set_sha256="a" * 64),
            CERT,
            2,
            None,
            id="approver-set-whole",
        ),
        pytest.param(REQUEST, CERT, None, Code.PERMISSION_DENIED, id="never-joined"),
        pytest.param(REQUEST, None, 2, None, id="unrecorded-certificate-admitted"),
        pytest.param(
            replace(REQUEST, cert_node_id="n1"), CERT, 2, None, id="certificate-names-the-node"
        ),
        pytest.param(
            replace(REQUEST, cert_node_id="n2"),
            CERT,
            2,
            Code.PERMISSION_DENIED,
            id="recorded-certificate-names-another-node",
        ),
        pytest.param(
            replace(REQUEST, cert_node_id="n2"),
            None,
            2,
            Code.PERMISSION_DENIED,
            id="unrecorded-certificate-names-another-node",
        ),
        pytest.param(
            replace(REQUEST, role=""), None, 2, Code.PERMISSION_DENIED, id="unrecorded-no-role"
        ),
        pytest.param(
            replace(REQUEST, role="admin"), None, 2, Code.PERMISSION_DENIED, id="unrecorded-role"
        ),
        pytest.param(REQUEST, replace(CERT, revoked=True), 2, Code.UNAUTHENTICATED, id="revoked"),
        pytest.param(REQUEST, replace(CERT, not_after=NOW), 2, Code.UNAUTHENTICATED, id="expired"),
        pytest.param(REQUEST, CERT, 3, Code.UNAUTHENTICATED, id="older-generation"),
        pytest.param(
            REQUEST,
            replace(CERT, node_id="n2"),
            2,
            Code.PERMISSION_DENIED,
            id="another-nodes-certificate",
        ),
        pytest.param(replace(REQUEST, role=""), CERT, 2, Code.PERMISSION_DENIED, id="no-role"),
        pytest.param(
            replace(REQUEST, role="admin"), CERT, 2, Code.PERMISSION_DENIED, id="role-mismatch"
        ),
    ],
)
def test_admission(
    request_: HelloRequest, cert: CertRow | None, generation: int | None, code: Code | None
) -> None:
    refusal = admit(request_, cert, generation, NOW, node_role="worker")
    assert (refusal.code if refusal else None) is code


@pytest.mark.parametrize(
    ("version", "minimum", "required"),
    [
        ("1.4.0", "1.10.0", True),
        ("1.10.0", "1.10.0", False),
        ("2.0", "1.10.3", False),
        ("1.9.9-rc1", "1.10", True),
    ],
)
def test_upgrade_required(version: str, minimum: str, required: bool) -> None:
    assert upgrade_required(version, minimum) is required


def test_version_tuple() -> None:
    assert version_tuple("1.10.2") > version_tuple("1.9.12")


def test_the_handshake_bucket_holds_a_seconds_worth_and_refills() -> None:
    from workers.gateway.types import TokenBucket

    now = [0.0]
    bucket = TokenBucket(200, clock=lambda: now[0])
    assert all(bucket.take() == 0 for _ in range(200))  # a full second's worth at once
    wait = bucket.take()
    assert 0 < wait <= 1 / 200
    now[0] += 0.5
    assert sum(1 for _ in range(200) if bucket.take() == 0) == 100  # 200/s refill


# -- what follows the Welcome: the desired state, when the daemon is behind it -------------
SIGNED = DesiredState(3, {"sysctl": {}}, signature="sig")
UNSIGNED = DesiredState(3, {"sysctl": {}})


@pytest.mark.parametrize(
    ("desired", "applied", "spec_hash", "transport", "upgrade_only", "sent"),
    [
        pytest.param(UNSIGNED, 2, "h", "grpc", False, True, id="generation-ahead"),
        pytest.param(UNSIGNED, 3, "h", "grpc", False, False, id="up-to-date"),
        pytest.param(UNSIGNED, 3, None, "grpc", False, True, id="no-spec-hash"),
        pytest.param(UNSIGNED, 4, "h", "grpc", False, False, id="daemon-ahead"),
        pytest.param(None, 0, None, "grpc", False, False, id="node-has-no-spec"),
        pytest.param(UNSIGNED, 0, None, "grpc", True, False, id="upgrade-only"),
        pytest.param(UNSIGNED, 0, None, "websocket", False, False, id="websocket-unsigned"),
        pytest.param(SIGNED, 0, None, "websocket", False, True, id="websocket-signed"),
    ],
)
def test_the_desired_state_follows_the_welcome_when_the_daemon_is_behind(
    desired: DesiredState | None,
    applied: int,
    spec_hash: str | None,
    transport: str,
    upgrade_only: bool,
    sent: bool,
) -> None:
    request = HelloRequest(
        node_id="n1",
        cert_serial="s",
        role="worker",
        boot_id="b",
        journal_id="j",
        transport=transport,
        applied_generation=applied,
        spec_hash=spec_hash,
    )
    assert desired_state_due(desired, request, upgrade_only) == (desired if sent else None)


@pytest.mark.parametrize("base", [0.2, 1.0, 7.5])
def test_a_pushback_is_jittered_over_base_to_twice_base(base: float) -> None:
    """A herd refused at once comes back spread over [base, 2·base): never sooner than
    the base, never at twice it, and over the whole of that range."""
    assert pushback(base, lambda: 0.0) == base
    assert pushback(base, lambda: 0.999999) < 2 * base
    rng = random.Random(7)
    draws = [pushback(base, rng.random) for _ in range(10_000)]
    assert all(base <= d < 2 * base for d in draws)
    assert min(draws) < 1.01 * base and max(draws) > 1.99 * base
    halves = sum(d < 1.5 * base for d in draws)
    assert 4_700 < halves < 5_300  # evenly: half in each half of the range


@given(pending=st.integers(1, 10_000), rate=st.floats(0.0, 1e5), more=st.integers(0, 100))
def test_a_busy_refusal_comes_back_about_when_the_hellos_under_way_have_ended(
    pending: int, rate: float, more: int
) -> None:
    """At maxPendingHellos the pushback's base is the time the Hellos under way take at
    the rate Hellos ended lately, within [0.2 s, 15 s]; the window when none ended; more
    under way never sooner, a faster rate never later."""
    base = busy_pushback(pending, rate)
    assert BUSY_PUSHBACK_MIN <= base <= BUSY_PUSHBACK_MAX
    if rate == 0.0:
        assert base == RATE_WINDOW
    else:
        assert base == min(BUSY_PUSHBACK_MAX, max(BUSY_PUSHBACK_MIN, pending / rate))
        assert busy_pushback(pending + more, rate) >= base
        assert busy_pushback(pending, rate * 2) <= base


def test_64_hellos_under_way_at_7_5_a_second_come_back_in_8_5_s_not_0_2() -> None:
    # a rollout's wave on 24 gateways at 180 Hellos/s: back in 8.5 s, not 0.2 s
    assert busy_pushback(64, 7.5) == pytest.approx(8.533, abs=0.001)
    assert busy_pushback(64, 1_000.0) == BUSY_PUSHBACK_MIN  # a fast database: as before


def test_the_rate_meter_counts_the_window_s_whole_seconds() -> None:
    meter = RateMeter(window=5.0)
    assert meter.per_second(100.5) == 0.0
    for t in (100.1, 100.2, 101.5, 103.9, 104.0):
        meter.note(t)
    assert meter.per_second(104.5) == 4 / 5  # seconds 99 to 103; 104 is partial
    assert meter.per_second(105.0) == 5 / 5
    assert meter.per_second(106.0) == 3 / 5  # second 100 left the window
    assert meter.per_second(200.0) == 0.0  # long quiet: nothing counted
    meter.note(205.2)  # a slot reused after the window: its old count gone
    assert meter.per_second(206.0) == 1 / 5
