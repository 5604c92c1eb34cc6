"""Pure pieces of the runtime: the outcome vocabulary, the Prometheus text, the error
classification, lane choice, redaction (the settings: `tests/unit/settings/`)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import uuid

import asyncpg
import asyncpg.exceptions._base as asyncpg_base
import nats.errors
import nats.js.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.runtime.test_metrics_documented import fleet_metrics
from workers.runtime.base.errors import (
    PermanentError,
    RefusedError,
    SettingError,
    Severity,
    UnreachableError,
    classify,
    is_transient,
)
from workers.runtime.base.waiting import (
    STOP_SIGNALS,
    Patience,
    defer_stop_signals,
    stop_on_signals,
)
from workers.runtime.effects import outcome
from workers.runtime.effects.batch import RandomIds, uuid4_of
from workers.runtime.effects.claims import Pack, publishable


@pytest.mark.parametrize(
    ("result", "acks", "keeps_inbox_row"),
    [
        (outcome.APPLIED, True, True),
        (outcome.STALE, True, True),
        (outcome.IGNORED, True, False),
        (outcome.DUPLICATE, True, False),
        (outcome.retry_after(2), False, False),
        (outcome.RELEASED, False, False),
        (outcome.dead("bad"), False, False),
    ],
    ids=lambda v: v.kind.value if isinstance(v, outcome.Outcome) else str(v),
)
def test_outcomes(result: outcome.Outcome, acks: bool, keeps_inbox_row: bool) -> None:
    assert (result.acks, result.keeps_inbox_row) == (acks, keeps_inbox_row)


def test_retry_after_never_negative() -> None:
    assert outcome.retry_after(-3).delay == 0


def _sqlstate(code: str) -> asyncpg.PostgresError:
    error = asyncpg.PostgresError("x")
    error.sqlstate = code  # type: ignore[attr-defined]
    return error


@pytest.mark.parametrize(
    ("error", "severity"),
    [
        # an outage, a failover, contention: wait and try again
        (asyncpg.DeadlockDetectedError("x"), Severity.TRANSIENT),
        (asyncpg.SerializationError("x"), Severity.TRANSIENT),
        (asyncpg.AdminShutdownError("x"), Severity.TRANSIENT),
        (asyncpg.CannotConnectNowError("x"), Severity.TRANSIENT),
        (asyncpg.QueryCanceledError("x"), Severity.TRANSIENT),
        (asyncpg.LockNotAvailableError("x"), Severity.TRANSIENT),
        (asyncpg.ConnectionDoesNotExistError("x"), Severity.TRANSIENT),
        (asyncpg.InterfaceError("connection is closed"), Severity.TRANSIENT),
        (
            asyncpg.InterfaceError(
                "cannot call Transaction.__aexit__(): the underlying connection is closed"
            ),
            Severity.TRANSIENT,
        ),
        (asyncpg.InterfaceError("pool is closing"), Severity.TRANSIENT),
        (
            asyncpg.InterfaceError("the server expects 0 arguments for this query, 1 was passed"),
            Severity.PERMANENT,
        ),
        (asyncpg_base.InternalClientError("cannot switch to state 15"), Severity.TRANSIENT),
        (_sqlstate("57P01"), Severity.TRANSIENT),
        (_sqlstate("08006"), Severity.TRANSIENT),
        (ConnectionRefusedError(), Severity.TRANSIENT),
        (TimeoutError(), Severity.TRANSIENT),
        (nats.errors.NoServersError(), Severity.TRANSIENT),
        (nats.errors.TimeoutError(), Severity.TRANSIENT),
        (nats.errors.NoRespondersError(), Severity.TRANSIENT),
        (nats.js.errors.ServiceUnavailableError(), Severity.TRANSIENT),
        (UnreachableError("BCW_NATS_URL", "away"), Severity.TRANSIENT),
        # this input can never succeed
        (asyncpg_base.DataError("value out of int64 range"), Severity.PERMANENT),
        (asyncpg.DataError("x"), Severity.PERMANENT),
        (asyncpg.UniqueViolationError("x"), Severity.PERMANENT),
        (asyncpg.CheckViolationError("x"), Severity.PERMANENT),
        (asyncpg.RaiseError("x"), Severity.PERMANENT),
        (nats.errors.MaxPayloadError(), Severity.PERMANENT),
        (nats.js.errors.BadRequestError(), Severity.PERMANENT),
        (PermanentError("no"), Severity.PERMANENT),
        (KeyError("bug"), Severity.PERMANENT),
        # the process's settings, credentials or grants
        (asyncpg.InvalidPasswordError("x"), Severity.FATAL),
        (asyncpg.InvalidAuthorizationSpecificationError("x"), Severity.FATAL),
        (asyncpg.InvalidCatalogNameError("x"), Severity.FATAL),
        (asyncpg.InsufficientPrivilegeError("x"), Severity.FATAL),
        (asyncpg.UndefinedTableError("x"), Severity.FATAL),
        (asyncpg.ClientConfigurationError("invalid DSN"), Severity.FATAL),
        (nats.errors.AuthorizationError(), Severity.FATAL),
        (nats.errors.Error("nats: 'Authorization Violation'"), Severity.FATAL),
        (nats.errors.Error("nats: 'Permissions Violation for Publish to \"x\"'"), Severity.FATAL),
        (SettingError("BCW_DATABASE_URL", "bad"), Severity.FATAL),
        (RefusedError("BCW_DATABASE_URL", "no"), Severity.FATAL),
    ],
    ids=lambda v: f"{type(v).__name__}:{str(v)[:20]}" if isinstance(v, BaseException) else str(v),
)
def test_error_classification(error: BaseException, severity: Severity) -> None:
    assert classify(error) is severity
    assert is_transient(error) is (severity is Severity.TRANSIENT)


def test_patience_logs_an_outage_once_then_rarely_then_a_summary(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr("workers.runtime.base.waiting.time.monotonic", lambda: now[0])
    patience = Patience("waiting for NATS", logging.getLogger("test"), base=0.5, cap=5, every=30)
    delays = []
    with caplog.at_level(logging.INFO, logger="test"):
        for _ in range(100):  # 100 s of failures, one a second
            delays.append(patience.failed(ConnectionRefusedError("refused")))
            now[0] += 1
        patience.succeeded()
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 5, messages  # the start, every 30 s (3), the recovery
    assert messages[0] == "waiting for NATS: ConnectionRefusedError: refused; waiting"
    assert messages[-1].startswith("waiting for NATS: recovered after 100.0s (100 failed tries)")
    assert all(0 < delay <= 5 for delay in delays) and max(delays) > 2.5  # capped, growing


def test_patience_quiet_failures_back_off_without_a_line(caplog: pytest.LogCaptureFixture) -> None:
    patience = Patience("batch", logging.getLogger("test"))
    with caplog.at_level(logging.INFO, logger="test"):
        for _ in range(3):
            patience.failed(TimeoutError(), quiet=True)
        patience.succeeded()
    assert caplog.records == []


def test_metrics_are_the_librarys_exposition_and_parse() -> None:
    metrics = fleet_metrics()
    metrics.facts.inc("labeler", "hello", "applied")
    metrics.facts.inc("labeler", "hello", "applied", by=2)
    metrics.fencing_misses.inc("liveness", "liveness")
    metrics.batch_seconds.observe(0.05, "labeler")
    metrics.batch_seconds.observe(5, "labeler")
    metrics.lease_held.set(1, "sweep")
    metrics.outbox_oldest_seconds.set_function(lambda: 2.5)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render())}
    assert families["bcw_facts"].type == "counter"
    [applied] = [s for s in families["bcw_facts"].samples if s.name == "bcw_facts_total"]
    assert applied.labels == {"worker": "labeler", "type": "hello", "outcome": "applied"}
    assert applied.value == 3 == metrics.facts.value("labeler", "hello", "applied")
    assert metrics.facts.by_labels() == {("labeler", "hello", "applied"): 3.0}
    assert metrics.facts.value("recorder", "events", "applied") == 0  # never seen
    counts = {s.name: s.value for s in families["bcw_batch_seconds"].samples}
    assert counts["bcw_batch_seconds_count"] == 2 == metrics.batch_seconds.value("labeler")
    assert {s.value for s in families["bcw_lease_held"].samples} == {1.0}
    assert [s.value for s in families["bcw_outbox_oldest_seconds"].samples] == [2.5]
    expected = {
        "bcw_facts",
        "bcw_fencing_misses",
        "bcw_batch_seconds",
        "bcw_batch_retries",
        "bcw_batch_splits",
        "bcw_consumer_pending",
        "bcw_consumer_ack_pending",
        "bcw_outbox_backlog",
        "bcw_outbox_oldest_seconds",
        "bcw_lease_held",
        "bcw_liveness_blind_gateways",
        "bcw_liveness_breakers_open",
        "bcw_liveness_lag_seconds",
        "bcw_liveness_held_sessions",
        "bcw_outbox_published",
        "bcw_outbox_batched",
        "bcw_outbox_failures",
        "bcw_dead_letters",
        "bcw_quarantine_holds_expired",
        "bcw_quarantines_held",
        "bcw_build_info",
        "bcw_fact_age_seconds",
        "bcw_facts_stream_full_ratio",
        "bcw_liveness_sweep_seconds",
        "bcw_hello_proof_policy",
        "bcw_unproven_sessions",
        "bcw_nats_disconnects",
        "bcw_nats_reconnects",
        "bcw_db_pool_size",
        "bcw_db_pool_idle",
        "bcw_db_pool_max",
        "bcw_db_pool_acquire_seconds",
    }
    assert {name for name in families if name.startswith("bcw_")} == expected
    # beside them, the process's own: CPU, memory, file descriptors, and Python's
    assert {
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_open_fds",
        "python_info",
        "python_gc_objects_collected",
    } <= set(families)
    [info] = families["bcw_build_info"].samples
    from tests.upgrade.release import current_version

    assert (info.labels, info.value) == ({"version": current_version()}, 1.0)


# -- secrets never reach a log line or an error line -------------------------------------------
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("nats://u:hunter2@h:4222", "nats://u:***@h:4222"),
        ("nats://s3cr3t@h:4222", "nats://***@h:4222"),
        ("tls://tok@h, nats://a:b@c", "tls://***@h, nats://a:***@c"),
        ("postgresql://bcw:pa:ss@db:5432/x", "postgresql://bcw:***@db:5432/x"),
        ("postgresql://postgres@127.0.0.1/x", "postgresql://postgres@127.0.0.1/x"),  # no secret
        ("no url here", "no url here"),
    ],
)
def test_redact_hides_what_a_url_carries(text: str, shown: str) -> None:
    from workers.runtime.base.errors import redact

    assert redact(text) == shown


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_every_log_line_is_redacted(log_format: str, capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from workers.runtime.observability import logs

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        logs.configure(log_format, "INFO")
        logging.getLogger("t").warning("cannot reach %s", "nats://u:hunter2@h:4222")
        try:
            raise RuntimeError("postgresql://bcw:hunter2@db/x refused")
        except RuntimeError:
            logging.getLogger("t").exception("failed")
    finally:
        root.handlers[:], root.level = handlers, level
    err = capsys.readouterr().err
    assert "hunter2" not in err and "u:***@h" in err and "bcw:***@db" in err


def test_an_error_line_of_the_cli_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    from workers.cli.main import _explain

    _explain("run", "cannot reach nats://u:hunter2@h:4222")
    assert capsys.readouterr().err == "bcw run: cannot reach nats://u:***@h:4222\n"


_packs = st.lists(
    st.tuples(
        st.sampled_from(["liveness", "labeler", "replay", None]),  # its worker
        st.integers(1, 300),  # its messages
        st.booleans(),  # it waits (an earlier pack of its worker held elsewhere, or an older row)
    ),
    max_size=12,
).map(lambda specs: [Pack(i + 1, w, n, waits) for i, (w, n, waits) in enumerate(specs)])


@given(_packs, st.integers(1, 1000))
def test_a_pack_never_overtakes_an_earlier_one_of_its_worker(packs: list[Pack], cap: int) -> None:
    """`claims.publishable`: the packs chosen are in order, none that waits, none of a
    worker with a pack left behind before it this round; no more messages than the cap
    (the first chosen pack aside); and the first pack goes whenever it may."""
    chosen = publishable(packs, cap)
    assert chosen == sorted(chosen) and set(chosen) <= {pack.id for pack in packs}
    by_id = {pack.id: pack for pack in packs}
    assert not any(by_id[i].waits for i in chosen)
    for pack in packs:
        if pack.id in chosen:
            left = [p for p in packs if p.id < pack.id and p.id not in chosen]
            assert not any(p.worker == pack.worker for p in left), (pack, chosen)
    if len(chosen) > 1:
        assert sum(by_id[i].size for i in chosen) <= cap
    if packs and not packs[0].waits:
        assert chosen[:1] == [packs[0].id]


def test_packs_wait_behind_a_held_pack_of_their_worker_and_the_cap() -> None:
    packs = [
        Pack(1, "liveness", 5, True),
        Pack(2, "liveness", 5, False),
        Pack(3, "labeler", 5, False),
        Pack(4, None, 5, False),
    ]
    assert publishable(packs, 100) == [3, 4]  # 2 waits behind 1, held elsewhere
    assert publishable(packs, 5) == [3]  # the cap: 4 goes next round


@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_a_stop_signal_before_the_loop_listens_stops_it_once_it_does(sig: int) -> None:
    """A process told to stop while it starts (before its loop handles signals) is not
    killed by the signal: the loop's `stopping` is set as soon as it listens."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        defer_stop_signals()
        os.kill(os.getpid(), sig)  # delivered now, while nothing listens yet

        async def started() -> tuple[bool, bool]:
            stopping, later = asyncio.Event(), asyncio.Event()
            stop_on_signals(stopping)
            stop_on_signals(later)  # the early signal was handed over once, not again
            return stopping.is_set(), later.is_set()

        assert asyncio.run(started()) == (True, False)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@given(st.binary(min_size=16, max_size=16))
def test_a_message_id_is_the_uuid4_of_its_random_bytes(raw: bytes) -> None:
    assert uuid4_of(raw) == uuid.UUID(bytes=raw, version=4)


def test_message_ids_are_random_uuid4s_across_reads_and_never_repeated_in_a_forked_child() -> None:
    ids = RandomIds(per_read=4)
    made = [ids() for _ in range(50)]  # 13 reads from the OS
    assert all(i.version == 4 and i.variant == uuid.RFC_4122 for i in made)
    assert len(set(made)) == len(made)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, ids().bytes)
        os._exit(0)
    os.close(write)
    in_child = uuid.UUID(bytes=os.read(read, 16))
    os.close(read)
    os.waitpid(child, 0)
    assert in_child != ids()  # the parent's next id was not the child's too
