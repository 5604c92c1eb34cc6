"""The liveness controller's own metrics, set by the replica that sweeps (`sweep.py`) and
put back to 0 when it stops leading."""

from __future__ import annotations

from prometheus_client.registry import CollectorRegistry

from workers.runtime.observability.metrics import Gauge, Histogram, MetricSet

#: why a blind gateway's sessions are held (`bcw_liveness_held_sessions{reason}`)
HELD_REASONS = ("lag", "no-flush")


class SweepMetrics(MetricSet):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        self.sweep_seconds = Histogram(
            r,
            "bcw_liveness_sweep_seconds",
            "Time one liveness sweep takes, its transaction included; observed by the replica "
            "that sweeps (well under BCW_LIVENESS_SWEEP_INTERVAL, or sweeps queue up).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
        )
        self.blind_gateways = Gauge(
            r,
            "bcw_liveness_blind_gateways",
            "Gateways whose flushes the liveness controller has not applied lately "
            "(their sessions are held); set by the replica that sweeps.",
        )
        self.lag_seconds = Gauge(
            r,
            "bcw_liveness_lag_seconds",
            "How long ago the bus stored the oldest flush the liveness controller has not "
            "applied (0: none waits; NaN: its consumer could not be read). Past "
            "BCW_LIVENESS_BLIND_AFTER the controller is behind: every gateway it cannot see "
            "for it is blind for lag, its sessions held. Set by the replica that sweeps.",
        )
        self.held_sessions = Gauge(
            r,
            "bcw_liveness_held_sessions",
            "Sessions the liveness controller holds (neither ages nor disconnects) because their "
            "gateway is blind, by why: lag (the controller is behind its facts) or no-flush "
            "(none of the gateway's flushes reaches it); counted when it went blind.",
            ("reason",),
        )
        for reason in HELD_REASONS:  # shown at 0 from the start, as the unlabeled ones
            self.held_sessions.set(0.0, reason)
        self.breakers_open = Gauge(
            r,
            "bcw_liveness_breakers_open",
            "Gateways whose stale sessions the fleet breaker holds; set by the replica that sweeps.",
        )
