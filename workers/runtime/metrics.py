"""A small Prometheus text-format registry: counters, gauges and histograms with labels.

Filled by the runtime (consumer, relay), read by `/metrics`. No I/O here.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

LabelValues = tuple[str, ...]
M = TypeVar("M", bound="_Metric")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: LabelValues, extra: str = "") -> str:
    parts = [f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(labels)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self._values: dict[LabelValues, float] = {}

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self._values[labels] = self._values.get(labels, 0.0) + by

    def value(self, *labels: str) -> float:
        return self._values.get(labels, 0.0)

    def samples(self) -> list[str]:
        return [
            f"{self.name}{_labels(self.label_names, key)} {_number(value)}"
            for key, value in sorted(self._values.items())
        ]


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self._values: dict[LabelValues, float] = {}
        self._functions: dict[LabelValues, Callable[[], float]] = {}

    def set(self, value: float, *labels: str) -> None:
        self._values[labels] = value

    def set_function(self, function: Callable[[], float], *labels: str) -> None:
        self._functions[labels] = function

    def value(self, *labels: str) -> float:
        if labels in self._functions:
            return self._functions[labels]()
        return self._values.get(labels, 0.0)

    def samples(self) -> list[str]:
        keys = sorted(set(self._values) | set(self._functions))
        return [
            f"{self.name}{_labels(self.label_names, key)} {_number(self.value(*key))}"
            for key in keys
        ]


class Histogram(_Metric):
    kind = "histogram"
    DEFAULT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

    def __init__(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self._counts: dict[LabelValues, list[int]] = {}
        self._sums: dict[LabelValues, float] = {}

    def observe(self, value: float, *labels: str) -> None:
        counts = self._counts.setdefault(labels, [0] * (len(self.buckets) + 1))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self._sums[labels] = self._sums.get(labels, 0.0) + value

    def count(self, *labels: str) -> int:
        return sum(self._counts.get(labels, []))

    def samples(self) -> list[str]:
        lines = []
        for key, counts in sorted(self._counts.items()):
            running = 0
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                running += count
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {running}")
            lines.append(
                f"{self.name}_sum{_labels(self.label_names, key)} {_number(self._sums[key])}"
            )
            lines.append(f"{self.name}_count{_labels(self.label_names, key)} {running}")
        return lines


class Metrics:
    """The metrics of one process. Each consumer and the relay write to it."""

    def __init__(self) -> None:
        self._all: list[_Metric] = []
        self.facts = self._add(
            Counter(
                "bcw_facts_total",
                "Facts settled, by worker, fact type and outcome.",
                ("worker", "type", "outcome"),
            )
        )
        self.batch_seconds = self._add(
            Histogram(
                "bcw_batch_seconds", "Time to apply one batch (transaction included).", ("worker",)
            )
        )
        self.batch_retries = self._add(
            Counter(
                "bcw_batch_retries_total",
                "Transient failures retried while applying a batch.",
                ("worker",),
            )
        )
        self.consumer_pending = self._add(
            Gauge(
                "bcw_consumer_pending",
                "Facts not yet delivered to the worker's consumer.",
                ("worker",),
            )
        )
        self.consumer_ack_pending = self._add(
            Gauge(
                "bcw_consumer_ack_pending", "Facts delivered and not yet acknowledged.", ("worker",)
            )
        )
        self.outbox_backlog = self._add(Gauge("bcw_outbox_backlog", "Rows waiting in the outbox."))
        self.liveness_blind_gateways = self._add(
            Gauge(
                "bcw_liveness_blind_gateways",
                "Gateways whose flushes the liveness controller has not applied lately "
                "(their sessions are held); set by the replica that sweeps.",
            )
        )
        self.liveness_breakers_open = self._add(
            Gauge(
                "bcw_liveness_breakers_open",
                "Gateways whose stale sessions the fleet breaker holds; set by the replica that sweeps.",
            )
        )
        self.outbox_published = self._add(
            Counter(
                "bcw_outbox_published_total", "Outbox rows published and acknowledged by JetStream."
            )
        )
        self.outbox_failures = self._add(
            Counter(
                "bcw_outbox_failures_total",
                "Outbox publish rounds that failed and will be retried.",
            )
        )
        self.dead_letters = self._add(
            Counter(
                "bcw_dead_letters_total",
                "Messages copied to the dead-letter subject.",
                ("worker", "cause"),
            )
        )

    def _add(self, metric: M) -> M:
        self._all.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._all:
            lines += metric.header()
            lines += metric.samples()
        return "\n".join(lines) + "\n"
