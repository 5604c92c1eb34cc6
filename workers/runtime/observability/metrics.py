"""The metrics of one process, kept by `prometheus_client` in a registry of its own.

Filled by the runtime (consumer, relay, loops), read by `/metrics` (`Metrics.render`, the
library's text exposition); a worker's own metrics are defined in its folder
(`MetricSet`) and made on the same registry (`Metrics.of`). The small wrappers keep the
call sites short (`inc(*labels)`) and let tests read a value back (`value(*labels)`,
`items()`); every metric lives in `Metrics.registry` and nowhere else, so two runtimes
in one test process never mix.
No I/O here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar, cast

import prometheus_client as prom
from opentelemetry import trace
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from workers.runtime.base.release import release

LabelValues = tuple[str, ...]


class PoolSizes(Protocol):
    """What the pool gauges read of a pool (asyncpg's `Pool`)."""

    def get_size(self) -> int: ...
    def get_idle_size(self) -> int: ...
    def get_max_size(self) -> int: ...


# no `<name>_created` series: a timestamp per child that dashboards never read
prom.disable_created_metrics()


class _Family:
    """One metric family: its labels, and the children made so far (by label values)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        sample: str,
        metric: prom.Counter | prom.Gauge | prom.Histogram,
        labels: Sequence[str],
    ) -> None:
        self._registry = registry
        self._sample = sample  # the name of the sample that holds a child's value
        self._metric = metric
        self.label_names = tuple(labels)
        self._children: dict[LabelValues, object] = {}

    def value(self, *labels: str) -> float:
        """The current value (a histogram: its count) for these label values; 0 if unseen."""
        found = self._registry.get_sample_value(
            self._sample, dict(zip(self.label_names, labels, strict=True))
        )
        return found if found is not None else 0.0

    def by_labels(self) -> dict[LabelValues, float]:
        """Every label set seen so far → its value."""
        return {labels: self.value(*labels) for labels in self._children}

    def _child(self, labels: LabelValues):  # type: ignore[no-untyped-def]
        child = self._children.get(labels)
        if child is None:
            child = self._metric.labels(*labels) if self.label_names else self._metric
            self._children[labels] = child
        return child


class Counter(_Family):
    def __init__(
        self, registry: CollectorRegistry, name: str, help_text: str, labels: Sequence[str] = ()
    ) -> None:
        # prometheus_client appends `_total` itself: name the family without it
        base = name.removesuffix("_total")
        metric = prom.Counter(base, help_text, labels, registry=registry)
        super().__init__(registry, f"{base}_total", metric, labels)

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self._child(labels).inc(by)


class Gauge(_Family):
    def __init__(
        self, registry: CollectorRegistry, name: str, help_text: str, labels: Sequence[str] = ()
    ) -> None:
        metric = prom.Gauge(name, help_text, labels, registry=registry)
        super().__init__(registry, name, metric, labels)

    def set(self, value: float, *labels: str) -> None:
        self._child(labels).set(value)

    def set_function(self, function: Callable[[], float], *labels: str) -> None:
        self._child(labels).set_function(function)


class Histogram(_Family):
    DEFAULT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        metric = prom.Histogram(name, help_text, labels, registry=registry, buckets=buckets)
        super().__init__(registry, f"{name}_count", metric, labels)

    def observe(self, value: float, *labels: str, span: trace.Span | None = None) -> None:
        """Observe `value`; with an exemplar naming the trace of `span` (else of the
        current span) when it is sampled — shown in the OpenMetrics exposition only."""
        self._child(labels).observe(value, exemplar=exemplar(span))


def exemplar(span: trace.Span | None = None) -> dict[str, str] | None:
    """`trace_id` and `span_id` (hex, as the W3C traceparent writes them) of `span`, or of
    the current span; None when there is none, or it is not sampled (no backend has it)."""
    context = (span or trace.get_current_span()).get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


class MetricSet:
    """A worker's own metrics, defined in its folder: a subclass makes its families on
    `registry` in its `__init__`. Made once per process by `Metrics.of`; a worker names its
    sets in its definition (`Worker.metrics`) so that a process running it shows them from
    its start, before their first value."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry


S = TypeVar("S", bound=MetricSet)


class Metrics:
    """The metrics of one process. Each consumer, the relay and the loops write to it."""

    def __init__(self, version: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._sets: dict[type[MetricSet], MetricSet] = {}
        r = self.registry
        # the process's CPU, memory and file descriptors, and Python's own figures
        prom.ProcessCollector(registry=r)
        prom.PlatformCollector(registry=r)
        prom.GCCollector(registry=r)
        self.build_info = Gauge(
            r, "bcw_build_info", "1, labeled with the running bc-workers version.", ("version",)
        )
        self.build_info.set(1.0, version or release())
        self.fact_age = Histogram(
            r,
            "bcw_fact_age_seconds",
            "How old a fact was when its effects were applied (from its gateway's observed_at): "
            "the sizing rule is that a fact is applied within 30 s.",
            ("worker", "type"),
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900),
        )
        self.facts = Counter(
            r,
            "bcw_facts_total",
            "Facts settled, by worker, fact type and outcome.",
            ("worker", "type", "outcome"),
        )
        self.fencing_misses = Counter(
            r,
            "bcw_fencing_misses_total",
            "Facts that matched no current session (stale: a newer session does the work).",
            ("worker", "type"),
        )
        self.batch_seconds = Histogram(
            r, "bcw_batch_seconds", "Time to apply one batch (transaction included).", ("worker",)
        )
        self.batch_splits = Counter(
            r,
            "bcw_batch_splits_total",
            "Batches split into single facts to find the one that cannot be applied "
            "(each such fact is dead-lettered; validation should have refused it).",
            ("worker",),
        )
        self.batch_retries = Counter(
            r,
            "bcw_batch_retries_total",
            "Transient failures retried while applying a batch.",
            ("worker",),
        )
        self.consumer_pending = Gauge(
            r,
            "bcw_consumer_pending",
            "Consumer lag: facts in the stream not yet delivered to the worker's consumer.",
            ("worker",),
        )
        self.consumer_ack_pending = Gauge(
            r, "bcw_consumer_ack_pending", "Facts delivered and not yet acknowledged.", ("worker",)
        )
        self.facts_stream_full = Gauge(
            r,
            "bcw_facts_stream_full_ratio",
            "A facts stream's bytes over its max_bytes, or messages over its max_msgs (`bound`; "
            "0: unbounded): at 1 either way the facts stream refuses every gateway's facts, a "
            "gateway's own facts stream that gateway's.",
            ("stream", "bound"),
        )
        self.outbox_backlog = Gauge(r, "bcw_outbox_backlog", "Rows waiting in the outbox.")
        self.outbox_oldest_seconds = Gauge(
            r, "bcw_outbox_oldest_seconds", "Age of the oldest row waiting in the outbox (0: none)."
        )
        self.lease_held = Gauge(
            r,
            "bcw_lease_held",
            "1 while this process holds the singleton loop's lease (sweep, dispatch, relay…).",
            ("loop",),
        )
        self.outbox_published = Counter(
            r, "bcw_outbox_published_total", "Outbox rows published and acknowledged by JetStream."
        )
        self.outbox_batched = Counter(
            r,
            "bcw_outbox_batched_total",
            "Outbox rows of those published that went in a JetStream fast batch (one PubAck a batch).",
        )
        self.outbox_failures = Counter(
            r, "bcw_outbox_failures_total", "Outbox publish rounds that failed and will be retried."
        )
        self.dead_letters = Counter(
            r,
            "bcw_dead_letters_total",
            "Messages copied to the dead-letter subject.",
            ("worker", "cause"),
        )
        self.nats_disconnects = Counter(
            r,
            "bcw_nats_disconnects_total",
            "Times this process's NATS connection was lost after it had connected.",
            ("connection",),
        )
        self.nats_reconnects = Counter(
            r,
            "bcw_nats_reconnects_total",
            "Times this process's NATS connection came back.",
            ("connection",),
        )
        self.db_pool_size = Gauge(
            r, "bcw_db_pool_size", "Connections the PostgreSQL pool holds open, busy or idle."
        )
        self.db_pool_idle = Gauge(
            r, "bcw_db_pool_idle", "Connections of the PostgreSQL pool that wait to be used."
        )
        self.db_pool_max = Gauge(
            r, "bcw_db_pool_max", "The PostgreSQL pool's bound (BCW_DATABASE_POOL_MAX)."
        )
        self.db_pool_acquire_seconds = Histogram(
            r,
            "bcw_db_pool_acquire_seconds",
            "How long a statement's turn waited for a connection of the pool (long: the pool "
            "is too small for the work, or PostgreSQL slow to give connections).",
            buckets=(0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )

    def of(self, kind: type[S]) -> S:
        """This process's `kind` of metrics, made on its registry the first time asked."""
        made = self._sets.get(kind)
        if made is None:
            made = self._sets[kind] = kind(self.registry)
        return cast(S, made)

    def sets(self) -> list[MetricSet]:
        """The sets made so far, in the order they were."""
        return list(self._sets.values())

    def watch_pool(self, pool: PoolSizes) -> None:
        """The pool gauges read `pool` at each scrape."""
        self.db_pool_size.set_function(lambda: float(pool.get_size()))
        self.db_pool_idle.set_function(lambda: float(pool.get_idle_size()))
        self.db_pool_max.set_function(lambda: float(pool.get_max_size()))

    def nats_events(self, connection: str) -> Callable[[str], Awaitable[None]]:
        """What counts the `disconnected` and `reconnected` events (nats-py's callbacks,
        as `bus.connection` hands them on) of the NATS connection named `connection`."""

        async def count(event: str) -> None:
            if event == "disconnected":
                self.nats_disconnects.inc(connection)
            elif event == "reconnected":
                self.nats_reconnects.inc(connection)

        return count

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        return prom.generate_latest(self.registry).decode()

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """What `/metrics` serves for a request's `Accept` header, and its content type:
        the OpenMetrics exposition (with the histograms' exemplars) when it accepts
        `application/openmetrics-text`, else the Prometheus text format (as the library's
        own server chooses)."""
        try:
            encode, content_type = choose_encoder(accept)
            return encode(self.registry), content_type
        except (ValueError, TypeError):  # a version it cannot read (`version=abc`): text
            return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
